"""``leechq serve OUT``: an OpenAI-compatible HTTP server over an artifact, with continuous
batching.

A thin shell: :func:`leechq.models.load.load` loads the artifact, a
:class:`leechq.serve.scheduler.Scheduler` batches the requests and
:func:`leechq.serve.server.create_app` answers them (uvicorn; the ``[serve]`` extra).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from leechq.errors import InvalidInput


def run(args: argparse.Namespace) -> int:
    """Load ``args.artifact`` and serve it until interrupted."""
    try:
        import uvicorn

        from leechq.serve.server import create_app
    except ImportError as exc:
        raise InvalidInput(
            f"`leechq serve` needs FastAPI and uvicorn ({exc}); install the extra: "
            "pip install 'leechq[serve]'"
        ) from None
    from leechq.models.load import load
    from leechq.serve.generate import engine_for, stop_ids_for
    from leechq.serve.scheduler import Scheduler

    if args.max_batch < 1:
        raise InvalidInput(f"--max-batch must be >= 1, got {args.max_batch}")
    model, tokenizer = load(args.artifact, device=args.device, dtype=args.dtype)
    engine = engine_for(model)
    limit = engine.model.args.max_position_embeddings
    context = args.max_context if args.max_context is not None else min(limit, 4096)
    stop = stop_ids_for(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop or [0])[0]
    scheduler = Scheduler(engine, tokenizer, max_batch=args.max_batch, max_context=context,
                          max_queue=args.max_queue, stop_ids=stop, pad_id=pad)
    scheduler.pool.warmup()
    name = args.model_name or Path(args.artifact).resolve().name
    app = create_app(scheduler, tokenizer, name)
    print(f"leechq serve — {name} on http://{args.host}:{args.port}/v1 "
          f"(batch {args.max_batch}, context {context})", flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        scheduler.close()
    return 0
