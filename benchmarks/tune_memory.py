"""Device memory and step time of the end-to-end tuning step on a whole model of a real shape.

The recipe's tuning step (`leechq.quant.tune.tune_model`) at the placement `--recipe full` uses:
the student in float32 on the device (every projection a random Tetra record with its input
rotation, the embedding a 4-bit and the untied head an 8-bit group-affine table, the norms dense),
the teacher in the compute dtype (bfloat16 on CUDA), run every step (`--topk 0`, the recipe's
default) or once into a top-k cache, `--steps` optimizer steps of `--batch` windows of `--window`
random tokens and a held-out monitor. Values are random (a model of the named shape from its
config, random codes): memory and time do not depend on them. Reports the bytes allocated once
both models are placed, the peak during tuning (`torch.cuda.max_memory_allocated`) in three
phases (:class:`Phases`), the estimate the recipe gates on
(`leechq.quant.tune.tune_memory_bytes`), seconds per step, before the steps and after them. JSON
last line.

    python benchmarks/tune_memory.py --shape qwen3-8b --device cuda
    python benchmarks/tune_memory.py --shape qwen3-tiny --device cpu --steps 2   # a dry run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch

GIB = 1024.0**3
_T0 = time.perf_counter()


def note(msg: str) -> None:
    """A progress line on stderr with the seconds since start (a run cut off shows where)."""
    print(f"[tune_memory +{time.perf_counter() - _T0:7.1f} s] {msg}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-8b",
                    help="a named shape of leechq.serve.random_codes.SHAPES")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers [default: the shape's]: fewer for a quicker run of the "
                         "same widths (the per-layer and the whole-model terms apart)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2, help="training windows per step")
    ap.add_argument("--windows", type=int, default=8, help="training windows (teacher cache)")
    ap.add_argument("--monitor", type=int, default=2, help="held-out monitor windows")
    ap.add_argument("--window", type=int, default=512, help="tokens per window")
    ap.add_argument("--topk", type=int, default=None,
                    help="cached teacher log-probabilities per position, 0: the full teacher "
                         "every step [default: the recipe's]")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be >= 1")
    for name in ("steps", "batch", "windows", "monitor", "window"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    if args.topk is None:
        from leechq.quant.tune import TuneConfig

        args.topk = TuneConfig().teacher_topk
    if args.topk < 0:
        ap.error("--topk must be >= 0 (0: the full teacher every step)")
    return args


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype,
                seed: int) -> torch.nn.Module:
    """A transformers causal LM of ``shape`` (an HF config dict), random init, built on
    ``device`` in ``dtype``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in shape.items() if k != "model_type"}
    config = AutoConfig.for_model(shape["model_type"], **kwargs)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(device=device, dtype=dtype).eval()


def random_table(dims: tuple[int, int], bits: int, group: int,
                 generator: torch.Generator) -> Any:
    """A group-affine table of random codes (``GroupAffine`` of ``bits`` over ``group`` columns):
    codes uniform, every scale ``2/levels`` and offset ``-1`` of a group spanning [-1, 1], times
    ``1/sqrt(cols)``."""
    from leechq.formats.group_affine import GroupAffine

    rows, cols = dims
    width = cols // 2 if bits == 4 else cols
    qweight = torch.randint(0, 256, (rows, width), generator=generator, dtype=torch.uint8)
    groups = -(-cols // group)
    span = 1.0 / cols**0.5
    scales = torch.full((rows, groups), 2 * span / ((1 << bits) - 1), dtype=torch.float16)
    biases = torch.full((rows, groups), -span, dtype=torch.float16)
    return GroupAffine(dims, bits, group, qweight, scales, biases)


def stored_parts(student: torch.nn.Module, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Random records for every projection of ``student``'s layers and the raw tensors the recipe
    stores beside them: the 4-bit embedding and 8-bit head tables (group 64, random codes; their
    decode is set into ``student``) and the norms. The projections keep their random dense
    weights: tuning parks them and composes the records."""
    from leechq.formats.rotation import generate_rotation
    from leechq.serve.random_codes import random_tetra

    gen = torch.Generator().manual_seed(seed)
    rotations: dict[int, Any] = {}
    records: dict[str, Any] = {}
    for name, m in student.named_modules():
        if isinstance(m, torch.nn.Linear) and ".layers." in f".{name}":
            d_out, d_in = m.weight.shape
            rot = rotations.setdefault(d_in, generate_rotation(d_in, 1))
            records[name] = random_tetra(d_out, d_in, gen, rotation=rot)
    raw: dict[str, Any] = {}
    embed = student.get_input_embeddings().weight
    head = student.get_output_embeddings().weight
    names = {id(p): n for n, p in student.named_parameters()}
    for param, bits in ((embed, 4), (head, 8)) if head is not embed else ((embed, 4),):
        table = random_table(tuple(param.shape), bits, 64, gen)
        with torch.no_grad():  # the student holds what is stored (tuning checks the lookup)
            param.copy_(table.dequantize(param.dtype).to(param.device))
        raw[names[id(param)]] = table
    for n, p in student.named_parameters():
        if p.dim() == 1 and "norm" in n:
            raw[n] = p.detach().clone()
    return records, raw


class Phases:
    """Peak device memory and wall time of the tuning call in three phases, split at the optimizer
    steps (``tune_model``'s ``on_step``): ``before`` (the teacher's logits, composing the model,
    the monitor's first score and step 0), ``steps`` (the largest of steps 1 …, each a forward and
    backward of both models and an update) and ``after`` (restoring the best state, folding it
    into records and tables, decoding them into the student, the final score). Peaks in GiB on
    CUDA, else None."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.before: float | None = None
        self.steps: float | None = None
        self.after: float | None = None
        self.t0 = time.perf_counter()
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.seconds_before: float | None = None
        self.seconds_after: float | None = None

    def _take(self) -> float | None:
        """The peak since the last call (GiB), the counter reset."""
        if self.device is None:
            return None
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) / GIB
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def step(self, step: int, loss: float) -> None:
        peak = self._take()
        self.t_last = time.perf_counter()
        if self.t_first is None:
            self.t_first = self.t_last
            self.before = peak
        elif peak is not None:
            self.steps = max(self.steps or 0.0, peak)

    def close(self) -> None:
        self.after = self._take()
        end = time.perf_counter()
        if self.t_first is not None and self.t_last is not None:
            self.seconds_before = self.t_first - self.t0
            self.seconds_after = end - self.t_last

    def peak(self) -> float | None:
        got = [p for p in (self.before, self.steps, self.after) if p is not None]
        return max(got) if got else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from leechq.quant.tune import TuneConfig, tune_memory_bytes, tune_model
    from leechq.serve.random_codes import SHAPES

    if args.shape not in SHAPES:
        raise SystemExit(f"unknown --shape {args.shape!r}; choices: {sorted(SHAPES)}")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    compute = torch.bfloat16 if cuda else torch.float32
    t0 = time.perf_counter()
    shape = dict(SHAPES[args.shape])
    if args.layers is not None:  # the shape's layers, fewer (or more) of them
        shape["num_hidden_layers"] = args.layers
    teacher = build_model(shape, dev, compute, args.seed)
    note(f"teacher {args.shape} ({shape['num_hidden_layers']} layers) built on {dev} in "
         f"{compute}")
    student = build_model(shape, dev, torch.float32, args.seed)
    params = sum(p.numel() for p in student.parameters())
    estimate = tune_memory_bytes(student, on_cuda=cuda, tokens=args.batch * args.window)
    note(f"student built in float32: {params / 1e9:.2f} G parameters, estimate "
         f"{estimate / GIB:.1f} GiB")
    records, raw = stored_parts(student, args.seed + 1)
    built_s = time.perf_counter() - t0
    note(f"{len(records)} random records and {len(raw)} raw tensors")
    gen = torch.Generator().manual_seed(args.seed + 2)
    vocab = int(shape["vocab_size"])
    windows = torch.randint(0, vocab, (args.windows, args.window), generator=gen)
    monitor = torch.randint(0, vocab, (args.monitor, args.window), generator=gen)
    config = TuneConfig(steps=args.steps, lr=2e-3, warmup_steps=1, batch=args.batch,
                        teacher_topk=args.topk, monitor_every=args.steps, checkpoint_every=0)
    placed = None
    if cuda:
        torch.cuda.synchronize(dev)
        placed = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    phases = Phases(dev if cuda else None)
    result = tune_model(student, teacher, records, raw, windows, config,
                        monitor_windows=monitor, progress=True, on_step=phases.step)
    phases.close()
    note(f"tuned {result.steps} steps")
    row: dict[str, Any] = {
        "bench": "tune_memory", "shape": args.shape, "layers": shape["num_hidden_layers"],
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "params": params, "records": len(records), "tables": sum(
            type(t).__name__ == "GroupAffine" for t in raw.values()),
        "window": args.window, "batch": args.batch, "windows": args.windows,
        "monitor": args.monitor, "topk": args.topk, "steps": result.steps,
        "estimate_gib": estimate / GIB,
        "placed_gib": None if placed is None else placed / GIB,
        "peak_gib": phases.peak(),
        "peak_before_steps_gib": phases.before, "peak_steps_gib": phases.steps,
        "peak_after_steps_gib": phases.after,
        "seconds_before_steps": phases.seconds_before, "seconds_after_steps": phases.seconds_after,
        "seconds_per_step": result.seconds_per_step,
        "teacher_seconds": result.teacher_seconds, "tune_seconds": result.seconds,
        "build_seconds": built_s,
        "monitor_kl_before": result.monitor_kl_before, "monitor_kl_after": result.monitor_kl_after,
        "torch": torch.__version__,
    }
    print(json.dumps(row))
    sys.stdout.flush()
    return row


if __name__ == "__main__":
    main()
