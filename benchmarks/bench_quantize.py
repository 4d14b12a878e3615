"""Quantization time of the leechq pipeline on real model shapes (random weights, no download).

Builds a transformers model from a known config with only the first ``--layers`` decoder blocks,
random weights (N(0, 0.02), as an untrained init) and random calibration tokens, runs the real
pipeline (Hessians, rotation, per-matrix centroids, block GPTQ with the codebook search, pass 2)
and reports seconds per transformer block, encoder blocks/s, and the projected time for the full
depth. Quantization time does not depend on weight values beyond the encoder's data-dependent
pruning, so random weights give a fair time (never a quality number). Also prints the time per
driver phase (Hessians, factors, the concurrent GPTQ loops, records, pass 2, checkpoint) and a P13
spot check: the first rows of every record, decoded on the CPU by the artifact's decoder, must equal
the weights the model evaluates bit for bit (the pipeline un-rotates them on the device).

Usage:
    python benchmarks/bench_quantize.py --model qwen3-8b --layers 1 --codebook tetra --device cuda
Prints a table and a last-line JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time

import torch

SHAPES = {
    # name: (config class, kwargs, full depth)
    "smollm2-135m": (
        "LlamaConfig",
        dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
             vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
             rope_theta=100000.0),
        30,
    ),
    "qwen2.5-0.5b": (
        "Qwen2Config",
        dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
             vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True),
        24,
    ),
    "qwen3-8b": (
        "Qwen3Config",
        dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, vocab_size=151936,
             max_position_embeddings=40960, tie_word_embeddings=False),
        36,
    ),
}


def _git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build_model(name: str, layers: int) -> torch.nn.Module:
    import transformers

    cls_name, kwargs, _ = SHAPES[name]
    config = getattr(transformers, cls_name)(num_hidden_layers=layers, **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return model.eval()


def p13_spot_check(model: torch.nn.Module, records: dict, rows: int = 8) -> bool:
    """Decode the first ``rows`` rows of every lattice record on the CPU (the artifact's decoder)
    and compare them bit for bit with the weights the model now evaluates (which the pipeline
    un-rotated on the device)."""
    from leechq.formats.quantized_weight import QuantizedWeight

    ok = True
    for name, rec in records.items():
        if not isinstance(rec, QuantizedWeight):
            continue
        part = QuantizedWeight(
            codebook=rec.codebook, d_out=min(rows, rec.d_out), d_in=rec.d_in,
            labels=rec.labels[:rows], gains=rec.gains[:rows], row_scales=rec.row_scales[:rows],
            centroids=rec.centroids, tail=rec.tail[:rows], rotation=rec.rotation,
        )
        have = model.get_submodule(name).weight.detach()[:rows].float().cpu()
        if not torch.equal(part.dequantize(), have):
            print(f"P13 MISMATCH in {name}")
            ok = False
    return ok


def main() -> None:
    from leechq.config import QuantConfig
    from leechq.models.quantize import quantize_model_in_place

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SHAPES), default="smollm2-135m")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--codebook", default="tetra")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--calib-windows", type=int, default=64)
    ap.add_argument("--calib-len", type=int, default=2048)
    args = ap.parse_args()

    _, _, depth = SHAPES[args.model]
    model = build_model(args.model, args.layers)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    windows = torch.randint(0, vocab, (args.calib_windows, args.calib_len), generator=g)
    config = QuantConfig(codebook=args.codebook, device=args.device,
                         calib_windows=args.calib_windows, calib_window_len=args.calib_len)
    n_blocks = sum(
        m.weight.numel() // 24
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and ".layers." in name
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        mq = quantize_model_in_place(model, windows, config, progress=False, checkpoint_dir=tmp)
        wall = time.perf_counter() - t0
    p13 = p13_spot_check(model, mq.records)
    per_layer = mq.seconds / args.layers
    device = "cuda" if (args.device in ("auto", "cuda") and torch.cuda.is_available()) else "cpu"
    gpu = torch.cuda.get_device_name() if device == "cuda" else "none"
    row = {
        "model": args.model, "codebook": args.codebook, "device": device, "gpu": gpu,
        "layers_run": args.layers, "full_depth": depth,
        "calib_tokens": args.calib_windows * args.calib_len,
        "lattice_blocks_per_layer": n_blocks // args.layers,
        "capture_s": round(mq.capture_seconds, 2),
        "quantize_s_per_layer": round(per_layer, 2),
        "blocks_per_s": round(n_blocks / mq.seconds, 1),
        "projected_full_model_s": round(per_layer * depth + mq.capture_seconds, 1),
        "wall_s": round(wall, 2),
        "phase_s": {k: round(v, 2) for k, v in mq.phase_seconds.items()},
        "p13_spot_check": p13,
    }
    print(f"{'model':14s} {'codebook':8s} {'device':6s} {'s/layer':>9s} {'blocks/s':>10s} "
          f"{'full model (projected)':>24s}")
    print(f"{args.model:14s} {args.codebook:8s} {device:6s} {per_layer:9.2f} "
          f"{row['blocks_per_s']:10.0f} {row['projected_full_model_s']/60:21.1f} min")
    print("phases (s, all layers): " + ", ".join(f"{k} {v:.2f}" for k, v in row["phase_s"].items()))
    print(f"P13 spot check (record decode == evaluated weights): {p13}")
    print(json.dumps({"bench": "quantize", "git": _git_sha(), "results": [row]}))


if __name__ == "__main__":
    main()
