"""``leechq eval OUT``: perplexity and KL of an artifact against its reference model, and tasks.

A thin shell (docs/architecture.md §1 ``cli/eval.py``) over :func:`leechq.models.load.load`,
:func:`leechq.models.hf_load.load_model` and :func:`leechq.eval.runner.run_suite` on held-out text:
the evaluation split of a named corpus (:data:`NAMED_SETS`, default ``pydoc``) or the user's own
text (``--data``, read as ``--calib-data`` reads it). The reference defaults to the model the
artifact was quantized from (its ``provenance.model_id``). ``--tasks`` (MMLU, GSM8K:
:mod:`leechq.eval.tasks`) scores the artifact (``tasks``) and the reference (``reference_tasks``)
on the same prompts. The JSON report is the last line of stdout; a summary goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NAMED_SETS = {"pydoc": "evaluation", "pystdlib": "evaluation", "fortunes": "evaluation",
              "wikitext2": "test", "c4": "evaluation"}
"""The corpora ``--data`` names (:func:`leechq.data.corpus.load_text`) and the split taken."""


def reference_of(artifact: str | Path) -> str | None:
    """The ``model_id`` recorded in an artifact's provenance, if any.

    Raises:
        ArtifactError: ``config.json`` missing or not JSON (the artifact is verified in full by
            the load that follows).
    """
    from leechq.formats.integrity import load_json

    cfg = load_json(Path(artifact) / "config.json")
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    prov = qc.get("provenance") if isinstance(qc, dict) else None
    model_id = prov.get("model_id") if isinstance(prov, dict) else None
    return str(model_id) if isinstance(model_id, str) and model_id else None


def evaluate(
    artifact: str | Path,
    reference: str | None,
    n_windows: int,
    window: int,
    device: str = "auto",
    dtype: str = "auto",
    data: str = "pydoc",
    *,
    tasks: tuple[str, ...] = (),
    mmlu: str | None = None,
    gsm8k: str | None = None,
    task_limit: int | None = None,
) -> dict[str, Any]:
    """Run the suite on ``artifact`` (and KL against ``reference`` when given) over ``data``
    (a :data:`NAMED_SETS` name or a ``--calib-data`` spec): the report dict. ``tasks`` are scored
    on the artifact and, when given, on the reference (``report["reference_tasks"]``).

    Raises:
        InvalidInput: the text of ``data`` is unreadable or holds fewer than
            ``n_windows · window`` tokens (the message names ``--data`` and the sizes); an unknown
            task, task data given for a task not asked for, or a task limit below 1 (before any
            model is loaded).
    """
    from leechq.eval.runner import ModelInfo, SuiteConfig, run_suite, run_tasks
    from leechq.models.load import load, resolve_device, resolve_dtype

    check_tasks(tasks, mmlu, gsm8k, task_limit)

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    model, tokenizer = load(artifact, device=dev, dtype=dt)
    windows = None
    if data in NAMED_SETS:
        corpus, split = data, NAMED_SETS[data]
    else:
        windows = user_windows(tokenizer, data, n_windows, window)
        corpus, split = "user", windows.source
    config = SuiteConfig(corpus=corpus, split=split, n_windows=n_windows, window=window,
                         kl=reference is not None, tasks=tuple(tasks), mmlu_path=mmlu,
                         gsm8k_path=gsm8k, task_limit=task_limit)
    ref_model, ref_info = None, None
    if reference is not None:
        from leechq.models.hf_load import load_model

        loaded = load_model(reference, device=str(dev), dtype=str(dt).removeprefix("torch."))
        ref_model = loaded.model
        ref_info = ModelInfo(name=reference, source=loaded.source.to_dict())
    report = run_suite(
        model,
        tokenizer,
        config,
        reference=ref_model,
        model_info=ModelInfo(name=str(artifact), artifact=str(artifact)),
        reference_info=ref_info,
        windows=windows,
        progress="artifact",
    )
    if tasks and ref_model is not None:
        report["reference_tasks"] = run_tasks(ref_model, tokenizer, config, progress="reference")
    return report


def check_tasks(tasks: tuple[str, ...], mmlu: str | None, gsm8k: str | None,
                task_limit: int | None) -> None:
    """Refuse an unknown task, data for a task not asked for, or a limit below 1.

    Raises:
        InvalidInput: naming the flag.
    """
    from leechq.errors import InvalidInput
    from leechq.eval.tasks import TASKS

    for name in tasks:
        if name not in TASKS.names():
            raise InvalidInput(f"--tasks: unknown task {name!r}; choices: "
                               f"{', '.join(TASKS.names())}")
    for flag, task, value in (("--mmlu", "mmlu", mmlu), ("--gsm8k", "gsm8k", gsm8k)):
        if value is not None and task not in tasks:
            raise InvalidInput(f"{flag} names {task} data, but --tasks does not ask for {task}")
    if task_limit is not None and task_limit < 1:
        raise InvalidInput(f"--task-limit must be at least 1, got {task_limit}")


def user_windows(tokenizer: Any, spec: str, n_windows: int, window: int) -> Any:
    """``n_windows`` windows of ``window`` tokens from the first token of the user's text named by
    ``spec`` (:func:`leechq.data.user_text.load_user_text`): a ``TokenWindows``.

    Raises:
        InvalidInput: unreadable text, or fewer tokens than the windows need.
    """
    from leechq.data import token_windows
    from leechq.data.user_text import load_user_text
    from leechq.errors import InvalidInput

    user = load_user_text(spec)
    try:
        return token_windows(tokenizer, user.text, n_windows, window, source=user.source)
    except InvalidInput as exc:  # its message has the token count and the sizes
        raise InvalidInput(f"--data {spec!r}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Evaluate ``args.artifact``: a summary on stderr, the JSON report as the last stdout line."""
    from leechq.eval.runner import parse_tasks

    reference = args.reference or reference_of(args.artifact)
    tasks = parse_tasks(args.tasks)
    report = evaluate(args.artifact, reference, args.windows, args.window, args.device, args.dtype,
                      args.data, tasks=tasks, mmlu=args.mmlu, gsm8k=args.gsm8k,
                      task_limit=args.task_limit)
    ppl = report["ppl"]
    proto = report["provenance"]["protocol"]
    line = (f"[eval] {proto['n_windows']} x {proto['window']} tokens of {proto['source']}: "
            f"perplexity {ppl['ppl']:.4f}")
    if "reference_ppl" in ppl:
        line += (
            f" vs reference {ppl['reference_ppl']:.4f} (ratio {ppl['ratio']:.4f}); "
            f"KL {report['kl']['kl']:.4f} nats/token, "
            f"greedy agreement {report['kl']['agreement']:.3f}"
        )
    print(line, file=sys.stderr)
    for name, res in report.get("tasks", {}).items():
        ref = report.get("reference_tasks", {}).get(name)
        print(f"[eval] {name}: {res['metric']} {res['value']:.4f} over {res['n']} items"
              + (f" vs reference {ref['value']:.4f}" if ref else ""), file=sys.stderr)
    text = json.dumps(report, sort_keys=True)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0
