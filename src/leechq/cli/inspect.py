"""``leechq inspect OUT``: what an artifact holds and costs, under each accounting rule apart.

Implements docs/architecture.md §1 (``cli/inspect.py``) over
:func:`leechq.formats.artifact.artifact_report`. Per-matrix rates are printed by projection kind
(every matrix with ``--matrices``), then the three rates of docs/format.md §4, each on
its own line with its own denominator, never combined:

1. kernel bits per quantized weight (what a kernel streams: payload + f32 tail + f32 row scale);
2. whole-model bits per parameter (everything the served model keeps, embedding included);
3. the on-disk rate (file bytes × 8 per parameter).

The lattice code itself (48 bits per 24 weights with one gain bit) is shown for reference as the
"code" column; it is none of the three.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any


def format_report(report: dict[str, Any], directory: str, all_matrices: bool = False) -> str:
    """Human-readable text of an :func:`artifact_report` result."""
    lines: list[str] = []
    counts, rates, cfg = report["counts"], report["rates"], report["config"]
    lines.append(f"artifact   {directory}")
    lines.append(
        "integrity  sha256 of every file verified against the manifest"
        if report.get("verified")
        else "integrity  NOT verified (--no-verify): sizes, schema and tensors checked, hashes not"
    )
    lines.append(
        f"codebook   {report['codebook']} + {cfg['gain_bits']} gain bit(s), "
        f"rotation {'on' if cfg['rotate'] else 'off'}, "
        f"int4 modules {cfg['int4_modules'] or 'none'}, "
        f"embedding {cfg['embedding_encoding']}"
    )
    lines.append(
        f"records    {counts['lattice_records']} lattice + {counts['int4_records']} int4; "
        f"{counts['quantized_weights']:,} quantized weights of {counts['parameters']:,} parameters"
    )
    lines.append("")
    header = f"{'matrix':<44} {'kind':<8} {'shape':>13} {'code':>7} {'kernel':>7} {'stored':>7}"
    lines.append("per-matrix rates (bits per weight of that matrix)")
    lines.append(header)
    matrices: dict[str, Any] = report["matrices"]
    if all_matrices:
        rows = [
            (
                name,
                m["kind"],
                f"{m['shape'][0]}x{m['shape'][1]}",
                m["code_bits_per_weight"],
                m["kernel_bits_per_weight"],
                m["stored_bits_per_weight"],
            )
            for name, m in matrices.items()
        ]
    else:
        groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for name, m in matrices.items():
            groups[(name.rsplit(".", 1)[-1], m["kind"])].append(m)
        rows = []
        for (leaf, kind), ms in sorted(groups.items()):
            w = [m["shape"][0] * m["shape"][1] for m in ms]
            tot = sum(w)

            def mean(
                key: str, ms: list[dict[str, Any]] = ms, w: list[int] = w, tot: int = tot
            ) -> float:
                return sum(m[key] * wi for m, wi in zip(ms, w, strict=True)) / tot

            shapes = sorted({f"{m['shape'][0]}x{m['shape'][1]}" for m in ms})
            rows.append(
                (
                    f"*.{leaf} ({len(ms)})",
                    kind,
                    shapes[0] if len(shapes) == 1 else "mixed",
                    mean("code_bits_per_weight"),
                    mean("kernel_bits_per_weight"),
                    mean("stored_bits_per_weight"),
                )
            )
    for name, kind, shape, code, kernel, stored in rows:
        lines.append(f"{name:<44} {kind:<8} {shape:>13} {code:>7.4f} {kernel:>7.4f} {stored:>7.4f}")
    lines.append("")
    lines.append("accounting (three rules with three denominators; never combine them)")
    lines.append(
        f"  1. kernel rate          {rates['kernel_bits_per_weight']:8.4f} "
        "bits per quantized weight"
        "   (payload + f32 tail + f32 row scale, projections only)"
    )
    lines.append(
        f"  2. whole-model rate     {rates['whole_model_bits_per_param']:8.4f} bits per parameter"
        "        (all weights the served model keeps, embedding included, tied head once)"
    )
    lines.append(
        f"  3. on-disk rate         {rates['on_disk_bits_per_param']:8.4f} bits per parameter"
        f"        (model.safetensors: {counts['model_safetensors_bytes']:,} bytes; whole directory "
        f"{counts['directory_bytes']:,} bytes = {rates['on_disk_directory_bits_per_param']:.4f})"
    )
    lines.append(
        f"  (for reference: the codes alone are {rates['code_bits_per_weight']:.4f} bits per "
        f"quantized weight; the records as stored {rates['projection_stored_bits_per_weight']:.4f})"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the report of ``args.artifact`` (text, or JSON with ``--json``)."""
    from leechq.formats.artifact import artifact_report

    verify = not getattr(args, "no_verify", False)
    report = artifact_report(args.artifact, verify=verify)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(format_report(report, str(args.artifact), all_matrices=args.matrices))
    return 0
