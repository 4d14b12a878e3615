"""End-to-end decode benchmark: tokens/s and VRAM of 2-bit models against fp16 (issue 6).

Run on a CUDA machine from the repository root::

    PYTHONPATH=src python benchmarks/bench_e2e.py --quick     # < 4 min on an H200
    PYTHONPATH=src python benchmarks/bench_e2e.py             # full sweep

What it does, in order:

1. **Correctness gates** (before any timing) on a small Qwen3-structured model with random Tetra
   codes: fused-kernel logits vs the dense reference reconstruction (same process); greedy tokens of
   the fused path under CUDA graphs vs the reference path on the GPU and vs the float32 reference on
   the CPU (first difference must be at ≥ 32 tokens or a declared near-tie); graph vs eager
   tokens of the same engine (must be identical).
2. **Timing**, for Qwen3-8B- and Qwen3-14B-shaped models with random codes drawn on the GPU (no
   download; every 48-bit word is a legal Tetra word), per batch size:
   * ``tetra48``: every projection a Tetra matrix (fused kernels), fp16 embedding and head;
   * ``tetra48-q4``: v_proj and the head int4 g128 (closer to the published files);
   * ``tetra48-norot`` (diagnostic, batch 1): ``tetra48`` without input rotations — the gap to
     ``tetra48`` is what the rotation kernels cost;
   * ``ball``: every projection a ball-codebook matrix (``planes14`` records drawn on the GPU,
     served by Planes14 groups), fp16 embedding and head;
   * ``fp16``: the same engine (same loop, same graphs, same compiled pieces) with dense fp16
     weights;
   * ``int4``: the same engine in bfloat16 with every projection torch's int4 weight-only GEMM
     (tinygemm, group 128, ``int4_tinygemm.py``), embedding and head dense;
   * ``hf-fp16``: plain transformers fp16 ``generate`` (its default dynamic cache, no graphs).
   Protocol: random prompts of ``--prompt-len`` tokens (no padding), ``--new-tokens`` greedy tokens,
   one warm-up generation (compilation, capture), then the median of ``--repeats`` timed
   generations. ``tok_s`` counts tokens produced by the decode steps over their wall time, summed
   over the batch (prefill excluded; ``e2e_tok_s`` includes it). ``ratio_vs_fp16`` divides by the
   ``fp16`` arm of the same model and batch, in the same process.
3. Memory: ``weights_gb`` = device bytes the model holds (everything resident after building it);
   ``embed_head_gb`` = the part that is embedding and head; ``kv_cache_gb`` = the static cache of
   that batch; ``peak_vram_gb`` = ``torch.cuda.max_memory_allocated`` over that batch's runs
   (weights, cache, graph pools, activations).

The last stdout line is one JSON object ``{"bench": "e2e", ...}``, also written to
``benchmarks/results/e2e-<date>.json`` (and to ``$OUT`` when that is set).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from leechq.errors import KernelUnavailable
from leechq.serve.build import execution_paths, from_hf_model, random_dense, weight_bytes
from leechq.serve.generate import Engine
from leechq.serve.random_codes import SHAPES, model_args, random_quantized_model

GB = 1e9
ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def git_sha() -> str:
    for cmd in (["git", "rev-parse", "--short=12", "HEAD"],):
        try:
            out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                dirty = subprocess.run(
                    ["git", "status", "--porcelain", "--untracked-files=no"],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
                return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            pass
    return os.environ.get("LEECHQ_GIT", "unknown")


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = p.name
        env["sm"] = f"{p.major}{p.minor}"
        env["gpu_mem_gb"] = round(p.total_memory / GB, 1)
    return env


# The device everything runs on; ``--dry-run-cpu`` switches it to the CPU with tiny shapes so the
# script's own code can be exercised without a GPU (no timing meaning then).
DEVICE = torch.device("cuda")
SHAPE_OVERRIDE: str | None = None
PREFER = "fused"  # quantized arms must run the fused kernels ("auto" in a CPU dry run)
DEADLINE = float("inf")  # perf_counter() after which no new arm or batch is started


def over_budget(what: str, results: list[dict[str, Any]], **row: Any) -> bool:
    """True (and a "skipped" row recorded) when the time budget leaves no room to start ``what``."""
    if time.perf_counter() < DEADLINE:
        return False
    log(f"{what}: skipped, time budget spent")
    results.append({**row, "skipped": "time budget (--budget-s)"})
    return True


def on_cuda() -> bool:
    return DEVICE.type == "cuda"


def sync() -> None:
    if on_cuda():
        torch.cuda.synchronize()


def free() -> None:
    gc.collect()
    if on_cuda():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def mem_allocated() -> int:
    return torch.cuda.memory_allocated() if on_cuda() else 0


def reset_peak() -> None:
    if on_cuda():
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float:
    return round(torch.cuda.max_memory_allocated() / GB, 3) if on_cuda() else 0.0


def shape(name: str) -> str:
    return SHAPE_OVERRIDE or name


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


# --------------------------------------------------------------------------------------------------
# Correctness gates


def first_difference(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


@torch.no_grad()
def margin_at(engine: Engine, prompt: list[int], tokens: list[int], pos: int) -> float:
    """Top-1 minus top-2 logit of ``engine``'s model at generated position ``pos`` (teacher
    forced)."""
    from leechq.serve.cache import KVCache, round_slots

    seq = prompt + tokens[:pos]
    m = engine.model
    cache = KVCache(m.args, 1, round_slots(len(seq)), engine.dtype, m.device)
    dev = m.device
    logits = m(
        torch.tensor([seq], device=dev),
        torch.arange(len(seq), device=dev),
        torch.zeros(1, dtype=torch.int64, device=dev),
        cache.k,
        cache.v,
    )
    top = logits[0, -1].topk(2).values
    return float(top[0] - top[1])


def run_gates(n_tokens: int, compile_pieces: bool, graphs: bool) -> dict[str, Any]:
    """Fused vs reference (GPU and CPU) and graph vs eager, on the small gate model."""
    out: dict[str, Any] = {"model": shape("qwen3-gate"), "tokens": n_tokens}
    args = model_args(shape("qwen3-gate"))
    dev = DEVICE
    try:
        fused = random_quantized_model(
            args, dev, torch.float16, seed=11, prefer=PREFER, portable=True
        )
    except KernelUnavailable as exc:
        out["status"] = f"skipped: no fused kernel ({exc})"
        log(f"gates: {out['status']}")
        return out
    ref_gpu = random_quantized_model(
        args, dev, torch.float16, seed=11, prefer="reference", portable=True
    )
    ref_cpu = random_quantized_model(
        args, "cpu", torch.float32, seed=11, prefer="reference", portable=True
    )
    out["paths"] = {"fused": execution_paths(fused), "reference": execution_paths(ref_gpu)}
    prompts = random_prompts(2, 24, args.vocab_size, seed=5)
    prompts[1] = prompts[1][:15]  # left padding in the batch

    # 1. logits of a left-padded prefill and of 8 decode steps (teacher forced: same tokens).
    from leechq.serve.cache import KVCache

    def logits_of(model: Any, device: Any, dtype: torch.dtype) -> torch.Tensor:
        width = max(len(p) for p in prompts)
        pad = torch.tensor([width - len(p) for p in prompts], device=device)
        rows = [[0] * (width - len(p)) + p for p in prompts]
        cache = KVCache(args, 2, 64, dtype, device)
        toks = torch.tensor(rows, device=device)
        lg = model(toks, torch.arange(width, device=device), pad, cache.k, cache.v, last_only=False)
        steps = [lg[:, -1:]]
        for s in range(8):
            nxt = torch.tensor([[(7 * s + 3) % 1000], [(11 * s + 5) % 1000]], device=device)
            steps.append(
                model(nxt, torch.tensor([width + s], device=device), pad, cache.k, cache.v)
            )
        return lg.float().cpu(), torch.cat(steps, 1).float().cpu()

    with torch.no_grad():
        f_pre, f_dec = logits_of(fused, dev, torch.float16)
        r_pre, r_dec = logits_of(ref_gpu, dev, torch.float16)
        c_pre, c_dec = logits_of(ref_cpu, "cpu", torch.float32)
    width = max(len(p) for p in prompts)
    real = torch.ones(2, width, dtype=torch.bool)
    real[1, : width - len(prompts[1])] = False  # ignore pad positions

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max())

    out["logits_rel_err_fused_vs_ref_gpu"] = max(rel(f_pre[real], r_pre[real]), rel(f_dec, r_dec))
    out["logits_rel_err_fused_vs_ref_cpu"] = max(rel(f_pre[real], c_pre[real]), rel(f_dec, c_dec))
    out["logits_rel_err_ref_gpu_vs_ref_cpu"] = max(rel(r_pre[real], c_pre[real]), rel(r_dec, c_dec))
    logit_tol = 2e-2
    ok_logits = (
        out["logits_rel_err_fused_vs_ref_cpu"] <= logit_tol
        and out["logits_rel_err_fused_vs_ref_gpu"] <= logit_tol
    )

    # 2. greedy tokens: fused (graphs) vs reference GPU and CPU; graph vs eager of the same engine.
    prompt = prompts[0]
    e_graph = Engine(fused, graphs=graphs, compile=compile_pieces)
    e_eager = Engine(fused, graphs=False, compile=compile_pieces)
    e_ref = Engine(ref_gpu, graphs=False, compile=False)
    e_cpu = Engine(ref_cpu)
    t_graph = e_graph.generate_ids([prompt], n_tokens).tokens[0]
    t_eager = e_eager.generate_ids([prompt], n_tokens).tokens[0]
    t_ref = e_ref.generate_ids([prompt], n_tokens).tokens[0]
    t_cpu = e_cpu.generate_ids([prompt], n_tokens).tokens[0]
    out["graph_equals_eager"] = t_graph == t_eager
    tie_tol = 4 * out["logits_rel_err_fused_vs_ref_cpu"] * float(c_dec.abs().max()) + 1e-3
    verdicts = {}
    for name, other, eng in (("ref_gpu", t_ref, e_ref), ("ref_cpu", t_cpu, e_cpu)):
        pos = first_difference(t_graph, other)
        verdict: dict[str, Any] = {"first_difference": pos}
        if pos < n_tokens:
            margin = margin_at(eng, prompt, other, pos)
            verdict["ref_margin"] = margin
            verdict["near_tie"] = margin <= tie_tol
        verdicts[name] = verdict
    out["greedy"] = verdicts
    ok_tokens = all(
        v["first_difference"] >= min(32, n_tokens) or v.get("near_tie") for v in verdicts.values()
    )
    out["status"] = "pass" if (ok_logits and ok_tokens and out["graph_equals_eager"]) else "FAIL"
    log(f"gates: {json.dumps(out)}")
    return out


# --------------------------------------------------------------------------------------------------
# Timing


def time_engine(
    engine: Engine, batch: int, prompt_len: int, new_tokens: int, repeats: int,
    seq_len: int | None = None,
) -> dict[str, Any]:
    vocab = engine.model.args.vocab_size
    prompts = random_prompts(batch, prompt_len, vocab, seed=batch)
    engine.release()
    free()
    reset_peak()
    engine.generate_ids(prompts, new_tokens, seq_len=seq_len)  # warm-up: compile, capture
    runs = [engine.generate_ids(prompts, new_tokens, seq_len=seq_len) for _ in range(repeats)]
    tok = [r.decode_tok_s for r in runs]
    e2e = [r.batch * (r.steps + 1) / (r.prefill_s + r.decode_s) for r in runs]
    res = {
        "tok_s": round(statistics.median(tok), 1),
        "tok_s_min": round(min(tok), 1),
        "tok_s_max": round(max(tok), 1),
        "e2e_tok_s": round(statistics.median(e2e), 1),
        "ms_per_step": round(1000 * statistics.median(r.decode_s / r.steps for r in runs), 4),
        "prefill_ms": round(1000 * statistics.median(r.prefill_s for r in runs), 2),
        "kv_cache_gb": round(engine.cache_bytes() / GB, 4),
        "peak_vram_gb": peak_gb(),
    }
    engine.release()
    return res


PROFILE_TOP = 15
"""Kernel names :func:`profile_step` reports with their launches and GPU time per step."""


@torch.no_grad()
def profile_step(model: Any, compile_pieces: bool, prompt_len: int) -> dict[str, Any]:
    """Kernels per decode step and their summed GPU time (eager step, batch 1) — tells launch
    overhead from kernel time when compared with the graph's ms_per_step."""
    from torch.profiler import ProfilerActivity, profile

    engine = Engine(model, graphs=False, compile=compile_pieces)
    prompts = random_prompts(1, prompt_len, model.args.vocab_size, seed=1)
    engine.generate_ids(prompts, 4)  # warm-up
    sess = engine.session(1, 0)
    step = engine._make_step(sess, (True, False, False, False, False))
    step()
    sync()
    n = 4
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
        sync()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy_us = sum(e.time_range.elapsed_us() for e in kernels)
    by_name: dict[str, list[float]] = {}
    for e in kernels:  # where the step's GPU time goes, per kernel name
        entry = by_name.setdefault(e.name[:80], [0, 0.0])
        entry[0] += 1
        entry[1] += e.time_range.elapsed_us()
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:PROFILE_TOP]
    engine.release()
    return {
        "kernels_per_step": round(len(kernels) / n, 1),
        "gpu_busy_ms_per_step": round(busy_us / n / 1000, 4),
        "top_kernels": [{"name": k, "per_step": round(c / n, 1),
                         "ms_per_step": round(t / n / 1000, 4)} for k, (c, t) in top],
    }


def build_arm(arm: str, name: str) -> tuple[Any, dict[str, Any]]:
    args = model_args(shape(name))
    dev = DEVICE
    free()
    before = mem_allocated()
    t0 = time.perf_counter()
    info: dict[str, Any] = {}
    if arm == "fp16":
        model = random_dense(args, torch.float16, dev, seed=0)
    elif arm == "int4":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import int4_tinygemm

        model = random_dense(args, torch.bfloat16, dev, seed=0)
        shapes = [(m.out_features, m.in_features) for blk in model.blocks
                  for m in blk.modules() if isinstance(m, torch.nn.Linear)]
        if not all(int4_tinygemm.fits(*s) for s in shapes):
            raise KernelUnavailable(f"{name}: projection shapes that tinygemm does not take")
        info["int4_linears"] = sum(int4_tinygemm.swap_linears(blk, torch.bfloat16)
                                   for blk in model.blocks)
    elif arm in ("tetra48", "tetra48-q4", "tetra48-norot", "ball"):
        q4 = arm == "tetra48-q4"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = random_quantized_model(
                args,
                dev,
                torch.float16,
                seed=0,
                prefer=PREFER,
                int4_v=q4,
                head_kind="int4" if q4 else "dense",
                rotate=arm != "tetra48-norot",
                direct=on_cuda(),  # words drawn on the GPU: seconds, not a minute, for 14B
                codebook="ball" if arm.startswith("ball") else "tetra",
            )
        info["paths"] = execution_paths(model)
    else:
        raise ValueError(arm)
    free()
    info["build_s"] = round(time.perf_counter() - t0, 1)
    info["weights_gb"] = round((mem_allocated() - before) / GB, 3)
    info["weights_counted_gb"] = round(weight_bytes(model) / GB, 3)  # cross-check of the delta
    both = torch.nn.ModuleList([model.embed, model.head])
    info["embed_head_gb"] = round(weight_bytes(both) / GB, 3)
    return model, info


def build_hf(name: str) -> Any:
    import transformers

    spec = SHAPES[shape(name)]
    cfg_dict = {k: v for k, v in spec.items() if k != "model_type"}
    cfg = transformers.AutoConfig.for_model(spec["model_type"], **cfg_dict)
    with DEVICE:  # parameters allocated (and randomly initialised) on the device directly
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float16)
    return model.half().eval()


@torch.no_grad()
def time_hf(
    model: Any, batch: int, prompt_len: int, new_tokens: int, repeats: int
) -> dict[str, Any]:
    vocab = model.config.vocab_size
    ids = torch.tensor(random_prompts(batch, prompt_len, vocab, seed=batch), device=DEVICE)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
    free()
    reset_peak()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        sync()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {
        "tok_s": round(batch * new_tokens / t, 2),
        "e2e_tok_s": round(batch * new_tokens / t, 2),
        "ms_per_step": round(1000 * t / new_tokens, 3),
        "peak_vram_gb": peak_gb(),
    }


DIAGNOSTIC_ARMS = ("tetra48-norot",)


def bench_model(
    name: str,
    arms: list[str],
    batches: list[int],
    hf_batches: list[int],
    a: argparse.Namespace,
    results: list[dict[str, Any]],
    profiles: dict[str, Any],
) -> None:
    fp16_tok: dict[int, float] = {}
    for arm in arms:
        if arm == "hf-fp16":
            continue
        if over_budget(f"{name} {arm}", results, model=name, arm=arm):
            continue
        log(f"{name} {arm}: building")
        try:
            model, info = build_arm(arm, name)
        except KernelUnavailable as exc:
            log(f"{name} {arm}: skipped, no fused kernel: {exc}")
            results.append({"model": name, "arm": arm, "skipped": f"KernelUnavailable: {exc}"})
            continue
        log(f"{name} {arm}: built in {info['build_s']} s, weights {info['weights_gb']} GB")
        _bench_engine(name, arm, model, info, batches, a, results, profiles, fp16_tok)
        del model
        free()
    if "hf-fp16" in arms and not over_budget(f"{name} hf-fp16", results, model=name, arm="hf-fp16"):
        log(f"{name} hf-fp16: building")
        before = mem_allocated()
        model = build_hf(name)
        free()
        weights = round((mem_allocated() - before) / GB, 3)
        for b in hf_batches:
            r = time_hf(model, b, a.prompt_len, a.hf_new_tokens, 1)
            results.append(
                {
                    "model": name,
                    "arm": "hf-fp16",
                    "batch": b,
                    "tok_s": r["tok_s"],
                    "ratio_vs_fp16": round(r["tok_s"] / fp16_tok[b], 3) if b in fp16_tok else None,
                    "weights_gb": weights,
                    "peak_vram_gb": r["peak_vram_gb"],
                    "ms_per_step": r["ms_per_step"],
                }
            )
            log(f"{name} hf-fp16 batch {b}: {r['tok_s']} tok/s")
        del model
        free()


def _bench_engine(name: str, arm: str, model: Any, info: dict[str, Any], batches: list[int],
                  a: argparse.Namespace, results: list[dict[str, Any]],
                  profiles: dict[str, Any], fp16_tok: dict[int, float]) -> None:
    """Profile (optionally) and time one built arm at each batch size into ``results``."""
    engine = Engine(model, graphs=not a.no_graphs, compile=not a.no_compile)
    if a.profile:
        try:
            profiles[f"{name}/{arm}"] = profile_step(model, not a.no_compile, a.prompt_len)
            log(f"{name} {arm}: profile {profiles[f'{name}/{arm}']}")
        except Exception as exc:  # profiling is informative only
            profiles[f"{name}/{arm}"] = {"error": repr(exc)}
    arm_batches = [b for b in batches if b == 1] if arm in DIAGNOSTIC_ARMS else batches
    for b in arm_batches:
        if over_budget(f"{name} {arm} batch {b}", results, model=name, arm=arm, batch=b):
            continue
        try:
            r = time_engine(engine, b, a.prompt_len, a.new_tokens, a.repeats, a.seq_len)
        except torch.cuda.OutOfMemoryError as exc:
            log(f"{name} {arm} batch {b}: OOM ({exc})")
            results.append({"model": name, "arm": arm, "batch": b, "skipped": "OOM"})
            free()
            continue
        if arm == "fp16":
            fp16_tok[b] = r["tok_s"]
        row = {
            "model": name,
            "arm": arm,
            "batch": b,
            "tok_s": r["tok_s"],
            "ratio_vs_fp16": round(r["tok_s"] / fp16_tok[b], 3) if b in fp16_tok else None,
            "weights_gb": info["weights_gb"],
            "peak_vram_gb": r["peak_vram_gb"],
            **{k: v for k, v in r.items() if k not in ("tok_s", "peak_vram_gb")},
            "embed_head_gb": info["embed_head_gb"],
            "weights_counted_gb": info["weights_counted_gb"],
            "build_s": info["build_s"],
        }
        if "paths" in info:
            row["paths"] = info["paths"]
        results.append(row)
        log(
            f"{name} {arm} batch {b}: {r['tok_s']} tok/s ({r['ms_per_step']} ms/step), "
            f"ratio {row['ratio_vs_fp16']}, prefill {r.get('prefill_ms')} ms, "
            f"peak {r['peak_vram_gb']} GB"
        )
    del engine


def bench_artifact(
    path: str, batches: list[int], a: argparse.Namespace, results: list[dict[str, Any]]
) -> None:
    """A real artifact: fused path vs its own dense fp16 reconstruction (same process)."""
    from leechq.models.load import load

    name = Path(path).name
    fp16_tok: dict[int, float] = {}
    for arm, prefer in (("fp16-dense", "reference"), ("leechq", "fused")):
        free()
        before = mem_allocated()
        try:
            hf, _ = load(path, DEVICE, torch.float16, prefer=prefer, tokenizer=False)
        except KernelUnavailable as exc:
            results.append({"model": name, "arm": arm, "skipped": f"KernelUnavailable: {exc}"})
            continue
        model = from_hf_model(hf, torch.float16, DEVICE)
        del hf
        free()
        weights = round((mem_allocated() - before) / GB, 3)
        engine = Engine(model, graphs=not a.no_graphs, compile=not a.no_compile)
        for b in batches:
            r = time_engine(engine, b, a.prompt_len, a.new_tokens, a.repeats, a.seq_len)
            if arm == "fp16-dense":
                fp16_tok[b] = r["tok_s"]
            results.append(
                {
                    "model": name,
                    "arm": arm,
                    "batch": b,
                    "tok_s": r["tok_s"],
                    "ratio_vs_fp16": round(r["tok_s"] / fp16_tok[b], 3) if b in fp16_tok else None,
                    "weights_gb": weights,
                    "peak_vram_gb": r["peak_vram_gb"],
                    "ms_per_step": r["ms_per_step"],
                }
            )
            log(f"{name} {arm} batch {b}: {r['tok_s']} tok/s")
        del engine, model
        free()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="8B (and 14B batch 1) only, fewer tokens")
    p.add_argument("--models", default=None, help="comma list of shapes (qwen3-8b,qwen3-14b)")
    p.add_argument(
        "--arms",
        default=None,
        help="comma list: fp16,int4,tetra48,tetra48-q4,tetra48-norot,ball,hf-fp16",
    )
    p.add_argument("--batches", default=None, help="comma list of batch sizes")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=None,
                   help="KV-cache slots per session (default: the engine's, prompt + new tokens "
                        "to the next power of two >= 128); a chat engine holds its longest context")
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--hf-new-tokens", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--gate-tokens", type=int, default=32)
    p.add_argument(
        "--artifact", action="append", default=[], help="a leechq artifact dir (repeatable)"
    )
    p.add_argument("--no-compile", action="store_true", help="eager pieces (no torch.compile)")
    p.add_argument("--no-graphs", action="store_true", help="no CUDA graphs")
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--skip-gates", action="store_true")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="start no new arm/batch after this many seconds (quick: 165, full: 480; 0 = none)",
    )
    p.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="exercise the script on the CPU with a tiny shape (no GPU; numbers meaningless)",
    )
    p.add_argument(
        "--out", default=None, help="result path (default benchmarks/results/e2e-<date>.json)"
    )
    a = p.parse_args()
    a.new_tokens = a.new_tokens or (64 if a.quick else 128)
    a.hf_new_tokens = a.hf_new_tokens or (16 if a.quick else 32)
    a.repeats = a.repeats or (2 if a.quick else 3)
    if a.budget_s is None:
        a.budget_s = 165.0 if a.quick else 480.0
    return a


def main() -> int:
    a = parse()
    global DEVICE, SHAPE_OVERRIDE, PREFER, DEADLINE
    if a.dry_run_cpu:
        DEVICE, SHAPE_OVERRIDE, PREFER = torch.device("cpu"), "qwen3-tiny", "auto"
        a.no_graphs, a.no_compile, a.profile = True, True, False
    env = environment()
    record: dict[str, Any] = {
        "bench": "e2e",
        "gpu": env.get("gpu"),
        "git": git_sha(),
        "env": env,
        "quick": a.quick,
        "protocol": {
            "prompt_len": a.prompt_len,
            "new_tokens": a.new_tokens,
            "seq_len": a.seq_len,
            "hf_new_tokens": a.hf_new_tokens,
            "repeats": a.repeats,
            "graphs": not a.no_graphs,
            "compile": not a.no_compile,
            "decoding": "greedy",
            "budget_s": a.budget_s,
            "tok_s": "decode tokens/s summed over the batch",
        },
    }
    if on_cuda() and not torch.cuda.is_available():
        record["error"] = "CUDA is not available: this benchmark needs an NVIDIA GPU"
        print(json.dumps(record))
        return 2
    log(f"environment: {json.dumps(env)}")
    results: list[dict[str, Any]] = []
    profiles: dict[str, Any] = {}
    t_start = time.perf_counter()
    if a.budget_s:
        DEADLINE = t_start + a.budget_s
    try:
        if not a.skip_gates:
            # Quick runs gate without torch.compile (compiled == eager pieces is a GPU test).
            gate_compile = not a.no_compile and not a.quick
            record["gates"] = run_gates(a.gate_tokens, gate_compile, not a.no_graphs)
            free()
        gate_failed = record.get("gates", {}).get("status") == "FAIL"
        if gate_failed:
            log("correctness gate FAILED: quantized arms are timed but flagged")
        arms = (
            a.arms.split(",")
            if a.arms
            else ["fp16", "tetra48", "tetra48-q4", "tetra48-norot", "hf-fp16"]
        )
        if a.quick:
            plan = [("qwen3-8b", [1, 16], [1]), ("qwen3-14b", [1], [])]
            arms = a.arms.split(",") if a.arms else ["fp16", "tetra48", "tetra48-norot", "hf-fp16"]
        else:
            plan = [
                ("qwen3-8b", [1, 4, 16, 64], [1, 4, 16, 64]),
                ("qwen3-14b", [1, 4, 16, 64], [1, 16]),
            ]
        if a.models:
            plan = [(m, b, hb) for m, b, hb in plan if m in a.models.split(",")] or [
                (m, [1, 16], [1]) for m in a.models.split(",")
            ]
        if a.batches:
            bs = [int(x) for x in a.batches.split(",")]
            plan = [(m, bs, [x for x in hb if x in bs]) for m, _, hb in plan]
        for name, batches, hf_batches in plan:
            model_arms = arms if hf_batches else [x for x in arms if x != "hf-fp16"]
            if a.quick and name != "qwen3-8b" and not a.arms:
                model_arms = [x for x in model_arms if x not in DIAGNOSTIC_ARMS]
            bench_model(name, model_arms, batches, hf_batches, a, results, profiles)
        for path in a.artifact:
            bench_artifact(path, [1, 16], a, results)
        if gate_failed:
            for r in results:
                if r.get("arm", "").startswith("tetra"):
                    r["gate_failed"] = True
    except Exception as exc:  # keep the partial results and say what broke
        record["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    record["results"] = results
    record["profiles"] = profiles
    record["wall_s"] = round(time.perf_counter() - t_start, 1)
    text = json.dumps(record)
    date = _dt.date.today().isoformat()
    paths = [Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"e2e-{date}.json"]
    if os.environ.get("OUT"):
        paths.append(Path(os.environ["OUT"]) / f"e2e-{date}.json")
    for path in paths:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text + "\n")
            os.replace(tmp, path)
    print(text)
    return 1 if "error" in record else 0


if __name__ == "__main__":
    sys.exit(main())
