"""What the token embedding and the output head cost on the lattice, against 4-bit tables.

On models with a large vocabulary the two tables are a large share of the parameters
(qwen2.5-coder-0.5b: 2 × 151 936 × 896, 43 %), so the full recipe's 4-bit tables alone put its
whole-model rate above 2.7 b/param. This measures, one table at a time with every other tensor of
the reference left as it is ("isolate" mode), what each representation costs on the two held-out
sets of ``quality.py`` (in-domain: the Python docs' evaluation split; unseen: ``fortunes``):

* ``head lattice``: the head coded like a projection (Hadamard rotation, shape–gain, GPTQ error
  feedback with the Hessian of its inputs, the final norm's output on the calibration windows);
* ``embedding lattice``: the embedding coded as ``leechq quantize --lattice-embedding`` codes it
  (:func:`leechq.quant.embedding.encode_embedding`: the same coding with an identity Hessian, a
  lookup having no input statistics) and served as the product serves it, a
  :class:`~leechq.nn.lattice_embedding.LatticeEmbedding` in place of the model's embedding module;
* ``head 4-bit`` / ``embedding 4-bit``: the recipe's group-affine tables (4 bits, groups of 64);
* ``both lattice``: the two lattice tables together;
* ``head 4-bit gG`` / ``embedding 4-bit gG`` (``--groups 128,64,32``): the 4-bit tables in groups of
  ``G`` columns instead of 64 (a tied table: the embedding arm); ``--no-lattice`` measures these
  alone, without the lattice encode.

Each arm reports its table's served bits per weight, perplexity ratio, KL(reference ‖ arm) per token
and greedy agreement per set, with 95 % paired bootstrap intervals of each lattice arm and each
other group minus the 4-bit g64 arm of the same table. One JSON line last.

Usage: ``python benchmarks/table_sensitivity.py --model qwen2.5-coder-0.5b --windows 8``
(CPU; ``--device cuda`` on a GPU; ``--tables embedding`` measures the embedding's arms only;
``--model smollm2-135m --groups 128,64,32,16 --no-lattice`` the group sweep of a tied table).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quality  # the report's setup, measures and intervals


class _Enough(Exception):
    """Raised by the final norm's input hook: nothing after it is needed."""


def norm_inputs(model: Any, norm: torch.nn.Module, calib: torch.Tensor, batch: int,
                device: str) -> list[torch.Tensor]:
    """The final norm's inputs (the last decoder layer's outputs) on the calibration windows, one
    [batch, T, d] tensor per forward: what the head's block of the layer-wise pass reads."""
    states: list[torch.Tensor] = []

    def grab(_module: Any, args: tuple[Any, ...]) -> None:
        states.append(args[0].detach().float().cpu())
        raise _Enough

    handle = norm.register_forward_pre_hook(grab)
    try:
        with torch.no_grad(), quality.on_device(model, device):
            for i in range(0, calib.shape[0], batch):
                with contextlib.suppress(_Enough):
                    model(input_ids=calib[i : i + batch].to(device))
    finally:
        handle.remove()
    return states


def lattice_tables(reference: Any, calib: torch.Tensor, args: argparse.Namespace,
                   embed: str, head: str | None) -> dict[str, Any]:
    """module name → lattice record of the tables: the head by GPTQ with the Hessian of its inputs
    (the layer-wise driver), the embedding as the product codes it."""
    from leechq.config import QuantConfig
    from leechq.models.arch import arch_of
    from leechq.models.head import head_block
    from leechq.quant.embedding import encode_embedding
    from leechq.quant.layerwise import quantize_blocks

    cfg = QuantConfig(codebook=args.codebook, calib_windows=calib.shape[0],
                      calib_window_len=calib.shape[1], device=args.device)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    if head is not None:
        model = copy.deepcopy(reference)
        arch = arch_of(model)
        states = norm_inputs(model, arch.final_norm(model), calib, 4, args.device)
        # the product's head block (leechq quantize --lattice-head), here the only block
        run = quantize_blocks([head_block(model, arch, 0)], states, cfg, progress=True)
        out.update(run.records)
    out[embed] = encode_embedding(reference.get_submodule(embed).weight, cfg, name=embed,
                                  progress=True)
    quality.log(f"lattice tables encoded: {time.perf_counter() - t0:.1f} s")
    return out


def _install(model: Any, name: str, table: Any) -> None:
    """Put ``table`` in ``model``'s module ``name``: a lattice-coded embedding as the served
    :class:`LatticeEmbedding` (float32 on the CPU), anything else as the dense weight."""
    from leechq.formats.quantized_weight import QuantizedWeight
    from leechq.nn.lattice_embedding import LatticeEmbedding
    from leechq.utils.modules import embedding_scale

    module = model.get_submodule(name)
    if isinstance(table, QuantizedWeight) and isinstance(module, torch.nn.Embedding):
        served = LatticeEmbedding.from_record(table, embedding_scale(module))
        served.finalize("cpu", torch.float32)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, served)
        return
    w = table.dequantize(torch.float32) if isinstance(table, QuantizedWeight) else table
    with torch.no_grad():
        module.weight.copy_(w)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--codebook", default="tetra", choices=("tetra", "ball"))
    ap.add_argument("--windows", type=int, default=8, help="held-out windows per set")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--calib-tokens", type=int, default=8192)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--tables", default="both", choices=("both", "embedding"),
                    help="measure both tables' arms, or the embedding's only")
    ap.add_argument("--groups", default="64", metavar="G[,G...]",
                    help="the 4-bit arms' group sizes (64: the recipe's; each other G adds an "
                         "arm 'TABLE 4-bit gG') [default: 64]")
    ap.add_argument("--no-lattice", action="store_true",
                    help="the 4-bit arms only: no lattice encode")
    args = ap.parse_args(argv)
    groups = quality.distinct_list(ap, "--groups", args.groups, int, "group sizes >= 2",
                                   lambda g: g >= 2)
    if 64 not in groups:
        ap.error(f"--groups: 64, the recipe's group, must be among them, got {groups}")
    # what quality.real_setup reads
    args.calib_data, args.train_windows = None, [2]
    args.in_domain, args.unseen_domain = "pydoc", "fortunes"

    from leechq.formats.accounting import raw_served_bits, record_served_bits
    from leechq.formats.artifact import GroupAffine
    from leechq.models.arch import arch_of

    reference, sets, roles = quality.real_setup(args.model, args)
    arch = arch_of(reference)
    embed = arch.embed_path
    head = getattr(arch, "head_path", None)
    tied = head is not None and (reference.get_submodule(head).weight
                                 is reference.get_submodule(embed).weight)
    if tied or args.tables == "embedding":
        head = None  # (tied: one table, the embedding arm changes the head too)
    quality.log(f"{args.model}: tables {embed}"
                + (f", {head}" if head else " (tied head)" if tied else ""))
    lattice: dict[str, tuple[Any, float]] = {}
    if not args.no_lattice:
        records = lattice_tables(reference, roles["calib"], args, embed, head)
        lattice = {n: (r, record_served_bits(r) / (r.d_out * r.d_in)) for n, r in records.items()}
    arms: dict[str, dict[str, tuple[Any, float]]] = {}
    others: list[tuple[str, str]] = []  # (arm, the 4-bit g64 arm it is compared with)
    for name, label in ((head, "head"), (embed, "embedding")):
        if name is None:
            continue
        w = reference.get_submodule(name).weight.detach().float()
        for group in groups:
            ga = GroupAffine.quantize(w, 4, group)
            bits, n = raw_served_bits(ga)
            arm = f"{label} 4-bit" + ("" if group == 64 else f" g{group}")
            arms[arm] = {name: (ga.dequantize(torch.float32), bits / n)}
            if group != 64:
                others.append((arm, f"{label} 4-bit"))
        if lattice:
            arms[f"{label} lattice"] = {name: lattice[name]}
            others.append((f"{label} lattice", f"{label} 4-bit"))
    if head is not None and lattice:
        arms["both lattice"] = dict(lattice)

    from leechq.eval.ppl import window_nll
    from leechq.quant.row_scales import model_logits

    ref: dict[str, tuple[list[torch.Tensor], list[float]]] = {}
    for dset, ids in sets.items():
        with quality.on_device(reference, args.device):
            logits = [model_logits(reference, ids[i : i + 1]).float().cpu()
                      for i in range(ids.shape[0])]
        ref[dset] = (logits, [float(window_nll(r, ids[i : i + 1])[0])
                              for i, r in enumerate(logits)])
    quality.log("reference logits ready")
    rows, measured = [], {d: {} for d in sets}
    for arm, tensors in arms.items():
        model = copy.deepcopy(reference)
        for name, (table, _) in tensors.items():
            _install(model, name, table)
        for dset, ids in sets.items():
            with quality.on_device(model, args.device):
                measured[dset][arm] = quality.per_window(model, ref[dset][0], ids)
            s = quality.summarize(measured[dset][arm], ref[dset][1])
            bits = {n.rsplit(".", 1)[-1]: round(b, 4) for n, (_, b) in tensors.items()}
            rows.append({"model": args.model, "arm": arm, "set": dset, "bits_per_weight": bits,
                         **s})
            quality.log(f"{dset}: {arm} ({bits} b/w) ppl x {s['ppl_ratio']:.4f}, KL "
                        f"{s['kl']:.4f}, agreement {s['agreement']:.4f}")
        del model
    intervals = []
    for dset in sets:
        for a, b in others:
            intervals.append({"set": dset, "arm": a, "vs": b, "ci95": quality.paired_bootstrap(
                measured[dset][a], measured[dset][b], ref[dset][1], args.boot)})
    print(json.dumps({"model": args.model, "codebook": args.codebook,
                      "windows": [args.windows, args.window], "calib_tokens": args.calib_tokens,
                      "rows": rows, "intervals": intervals}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
