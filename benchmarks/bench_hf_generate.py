"""``generate`` speed through transformers: a leechq artifact loaded by ``from_pretrained`` against
the same model in fp16, batch 1, in one process.

The artifact has random codes at a real shape (every 48-bit Tetra word is legal, so random labels
make a valid matrix that decodes like a trained one; ``leechq.serve.random_codes``): Tetra
projections, int4 ``v_proj``, and a dense fp16 embedding and head or, with ``--embed-bits 4``, 4-bit
packed ones (the full recipe). The fp16 baseline is the stock transformers model of the same
config with random weights. Both run ``model.generate`` (greedy, exactly ``--new-tokens`` tokens
after a ``--prompt``-token prompt); each is warmed up once, then timed ``--repeats`` times; the
table gives the median.

On the GPU machine, from the repository root::

    PYTHONPATH=src python benchmarks/bench_hf_generate.py --shape qwen3-8b --keep /tmp/q8-hf
    PYTHONPATH=src python benchmarks/bench_hf_generate.py --shape qwen3-8b --artifact /tmp/q8-hf

On the CPU (checks that it runs; the numbers mean nothing)::

    PYTHONPATH=src python benchmarks/bench_hf_generate.py --device cpu --tiny

The last line of the output is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

TINY = dict(model_type="qwen3", vocab_size=512, hidden_size=128, intermediate_size=384,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=512,
            tie_word_embeddings=False)
"""A tiny Qwen3-shaped model (the CPU smoke run)."""


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def hf_config(shape: dict[str, Any], layers: int | None) -> Any:
    import transformers

    kw = {k: v for k, v in shape.items() if k != "model_type"}
    if layers is not None:
        kw["num_hidden_layers"] = layers
    kw.update(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return transformers.AutoConfig.for_model(shape["model_type"], **kw)


def build_artifact(out: Path, config: Any, embed_bits: int, seed: int = 0) -> Path:
    """A random-code artifact of ``config`` at ``out``: Tetra projections (q/k/v and gate/up share
    their rotation), int4 ``v_proj``, fp16 norms, a fp16 or ``embed_bits``-bit embedding and
    head."""
    from transformers import AutoModelForCausalLM

    from leechq.config import QuantConfig
    from leechq.formats.artifact import GroupAffine, write_artifact
    from leechq.formats.rotation import generate_rotation, rotation_seed
    from leechq.models.arch import arch_of
    from leechq.serve.random_codes import random_int4, random_tetra

    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    g = torch.Generator().manual_seed(seed)
    records: dict[str, Any] = {}
    rotations: dict[tuple[int, str], Any] = {}
    for layer, proj, lin, name in arch_of(skeleton).iter_linears(skeleton):
        d_out, d_in = lin.weight.shape
        if proj.name.endswith("v_proj"):
            records[name] = random_int4(d_out, d_in, g)
            continue
        key = (layer, proj.act)
        if key not in rotations:
            rotations[key] = generate_rotation(d_in, rotation_seed(layer, proj.act))
        records[name] = random_tetra(d_out, d_in, g, rotations[key])
    raw: dict[str, Any] = {}
    quantized = {f"{n}.weight" for n in records}
    for name, p in skeleton.named_parameters():
        if name in quantized:
            continue
        if p.dim() == 1:
            raw[name] = torch.ones(p.shape, dtype=torch.float16)
            continue
        t = (torch.randn(p.shape, generator=g) * 0.02).to(torch.float16)
        raw[name] = GroupAffine.quantize(t.float(), embed_bits, 64) if embed_bits else t
    qc = QuantConfig(codebook="tetra", int4_modules=("self_attn.v_proj",),
                     **({"embedding_encoding": f"int{embed_bits}", "embedding_group": 64}
                        if embed_bits else {}))
    return write_artifact(out, base_config=config.to_dict(), quant_config=qc, records=records,
                          raw=raw, provenance={"source": "random codes (bench_hf_generate)"},
                          overwrite=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_generate(model: Any, prompt: torch.Tensor, new: int, repeats: int, device: str
                  ) -> dict[str, float]:
    """Median seconds of one ``generate`` of exactly ``new`` tokens (after one warm-up)."""
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(prompt, **kw)  # warm-up: kernel compilation, first-use checks
        assert out.shape[1] == prompt.shape[1] + new, out.shape
        times = []
        for _ in range(repeats):
            sync(device)
            t0 = time.perf_counter()
            model.generate(prompt, **kw)
            sync(device)
            times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    return {"seconds": sec, "tok_s": new / sec, "ms_per_token": 1e3 * sec / new}


def main(argv: list[str] | None = None) -> int:
    from leechq.serve.random_codes import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--tiny", action="store_true", help="a tiny Qwen3-shaped model instead")
    ap.add_argument("--layers", type=int, default=None, help="keep only this many blocks")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--embed-bits", type=int, default=0, choices=(0, 4, 8),
                    help="0: fp16 embedding and head; 4/8: packed tables (the full recipe)")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--artifact", type=Path, default=None, help="reuse this artifact directory")
    ap.add_argument("--keep", type=Path, default=None, help="write the artifact here and keep it")
    args = ap.parse_args(argv)

    from transformers import AutoModelForCausalLM

    import leechq.integrations.transformers  # noqa: F401  (registers "leechq")

    dtype, device = torch.float16, args.device
    shape_name = "tiny" if args.tiny else args.shape
    config = hf_config(TINY if args.tiny else SHAPES[args.shape], args.layers)
    tmp = None
    if args.artifact is not None:
        path = args.artifact
    else:
        if args.keep is not None:
            path = args.keep
        else:
            tmp = tempfile.TemporaryDirectory(prefix="bench-hf-")
            path = Path(tmp.name) / "artifact"
        t0 = time.perf_counter()
        build_artifact(path, config, args.embed_bits)
        print(f"artifact built in {time.perf_counter() - t0:.1f} s: {path}", file=sys.stderr)
    g = torch.Generator().manual_seed(1)
    results: dict[str, dict[str, float]] = {}

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, device_map=device)
    model.eval()
    load_s = time.perf_counter() - t0
    vocab = model.config.vocab_size
    prompt = torch.randint(4, vocab, (1, args.prompt), generator=g).to(device)
    results["leechq"] = time_generate(model, prompt, args.new_tokens, args.repeats, device)
    results["leechq"]["load_s"] = load_s
    hf_cfg = model.config
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    base_cfg = hf_cfg.to_dict()
    base_cfg.pop("quantization_config", None)
    import transformers

    base = transformers.AutoConfig.for_model(base_cfg.pop("model_type"), **base_cfg)
    with torch.device(device):
        fp16 = AutoModelForCausalLM.from_config(base, dtype=dtype).eval()
    results["fp16"] = time_generate(fp16, prompt, args.new_tokens, args.repeats, device)

    speedup = results["leechq"]["tok_s"] / results["fp16"]["tok_s"]
    print(f"{'model':<10}{'tok/s':>10}{'ms/token':>11}{'s/generate':>12}")
    for name, r in results.items():
        print(f"{name:<10}{r['tok_s']:>10.1f}{r['ms_per_token']:>11.2f}{r['seconds']:>12.3f}")
    print(f"leechq/fp16: {speedup:.2f}x  (shape {shape_name}, batch 1, prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, median of {args.repeats}, {device})")
    print(json.dumps({
        "bench": "hf_generate", "shape": shape_name, "layers": hf_cfg.num_hidden_layers,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else device,
        "embed_bits": args.embed_bits, "batch": 1, "prompt": args.prompt,
        "new_tokens": args.new_tokens, "repeats": args.repeats,
        "leechq_tok_s": round(results["leechq"]["tok_s"], 2),
        "fp16_tok_s": round(results["fp16"]["tok_s"], 2), "speedup": round(speedup, 3),
        "load_s": round(load_s, 1), "git": git_sha(),
    }))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
