"""What 16-bit activations (``ops.A16``, ``LEECHQ_A16=1``) cost in model quality, on the CPU.

The integer GPU kernels (``m1``, the int8 tensor-core kernel) multiply each rotated activation
block by the decoded weights after rounding it to integers; with ``A16`` that rounding keeps 16
significant bits per 24-value block instead of 24 (``reference.round_activation``). On the CPU a
``LeechqLinear`` serves its dense natural-basis weight, so this script emulates the kernels'
arithmetic exactly in float: a forward pre-hook replaces each lattice-coded layer's input ``x``
by ``Rᵀ · round(R x)`` (``R`` its input rotation), which the dense weight then multiplies — the
product the GPU kernels compute with ``A16`` on, up to float32 summation order. The same hook
with 24 bits (``--bits 24``) is the default kernels' rounding.

Protocol: the artifact (default: the demo's cached SmolLM2-135M Tetra artifact), its zoo
reference, KL(reference ‖ model) and perplexity on the offline Python-docs evaluation split
(``SuiteConfig`` default: 8 windows × 512 tokens), for: no hook (the float product), 24-bit and
16-bit rounding. Prints a table; the last line is one JSON object.

``python benchmarks/a16_quality.py [--artifact DIR] [--model smollm2-135m] [--out FILE]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_ARTIFACT = Path.home() / ".cache" / "leechq" / "demo" / "smollm2-135m-tetra"


def round_blocks(xr: torch.Tensor, n_blocks: int, bits: int) -> torch.Tensor:
    """The kernels' integer rounding of rotated activations ``xr`` [M, d_in] (float64 out):
    24 bits per block (``x̃ = rint(x·s)``) or 16 (``reference.round_activation``)."""
    from leechq.kernels import reference as ref

    if bits == 16:
        return ref.round_activation(xr, n_blocks)
    xf = xr.to(torch.float32)
    body = xf[:, : 24 * n_blocks].reshape(xf.shape[0], n_blocks, 24)
    _eb, scale = ref._block_scale(body.abs().amax(dim=2))
    out = xf.double().clone()
    out[:, : 24 * n_blocks] = (torch.round(body.double() * scale[:, :, None])
                               / scale[:, :, None]).reshape(xf.shape[0], -1)
    return out


def install_hooks(model: Any, bits: int) -> list[Any]:
    """Forward pre-hooks on every lattice-coded ``LeechqLinear``: input → ``Rᵀ round(R x)``."""
    from leechq.formats.quantized_weight import QuantizedWeight
    from leechq.formats.rotation import apply_rotation, apply_rotation_transpose
    from leechq.nn.linear import LeechqLinear

    handles = []
    for mod in model.modules():
        if not isinstance(mod, LeechqLinear) or not isinstance(mod.record, QuantizedWeight):
            continue
        rec = mod.record

        def hook(module: Any, args: tuple, rec: QuantizedWeight = rec) -> tuple:
            x = args[0]
            flat = x.reshape(-1, rec.d_in).double()
            xr = apply_rotation(flat, rec.rotation) if rec.rotation is not None else flat
            xq = round_blocks(xr, rec.n_blocks, bits)
            back = apply_rotation_transpose(xq, rec.rotation) if rec.rotation is not None else xq
            return (back.to(x.dtype).reshape(x.shape), *args[1:])

        handles.append(mod.register_forward_pre_hook(hook))
    return handles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifact", default=str(DEFAULT_ARTIFACT))
    ap.add_argument("--model", default="smollm2-135m", help="the zoo reference")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import leechq
    from leechq.eval.kl import kl_to_reference
    from leechq.eval.runner import SuiteConfig, eval_windows
    from leechq.models.hf_load import load_model

    t0 = time.perf_counter()
    ref_model = load_model(args.model, device="cpu", dtype=torch.float32)
    q, _tok = leechq.load(args.artifact, device="cpu", dtype=torch.float32)
    config = SuiteConfig(n_windows=args.windows, window=args.window)
    win = eval_windows(ref_model.tokenizer, config)
    rows = []
    for arm, bits in (("float", None), ("a24", 24), ("a16", 16)):
        handles = install_hooks(q, bits) if bits else []
        kl = kl_to_reference(ref_model.model, q, win)
        for h in handles:
            h.remove()
        rows.append({"arm": arm, "hooked_layers": len(handles), "kl": kl.kl,
                     "ppl": kl.model_ppl, "ref_ppl": kl.ref_ppl, "agreement": kl.agreement})
        r = rows[-1]
        print(f"{arm:6s} layers {r['hooked_layers']:4d}  KL {r['kl']:.6f}  ppl {r['ppl']:.4f} "
              f"(ref {r['ref_ppl']:.4f})  agreement {r['agreement']:.4f}", file=sys.stderr,
              flush=True)
    doc = {"bench": "a16_quality", "artifact": args.artifact, "reference": args.model,
           "windows": win.protocol(), "tokens_fingerprint": win.fingerprint, "results": rows,
           "seconds": round(time.perf_counter() - t0, 1)}
    if args.out:
        Path(args.out).write_text(json.dumps(doc) + "\n")
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
