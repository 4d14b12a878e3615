"""``leechq inspect OUT``: what an artifact holds and costs, under each accounting rule apart.

Implements docs/architecture.md §1 (``cli/inspect.py``) over
:func:`leechq.formats.accounting.artifact_report`. Per-matrix rates are printed by projection kind
(every matrix with ``--matrices``), then the three rates of docs/format.md §4, each on
its own line with its own denominator, never combined:

1. kernel bits per quantized weight (what a kernel streams: payload + f32 tail + f32 row scale);
2. whole-model bits per parameter (everything the served model keeps, embedding included);
3. the on-disk rate (file bytes × 8 per parameter).

The lattice code itself (48 bits per 24 weights with one gain bit) is shown for reference as the
"code" column; it is none of the three.

A published Tetra directory (``quant_method: "llvq"``, docs/format.md §5) gets the same report
(:func:`tetra_report`): its records are read and verified by
:func:`leechq.formats.tetra_read.read_tetra_dir` (``model.safetensors`` against
``artifact_sha256``, or every field against ``llvq-digest.json``), and the same three rules count
them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any


def format_report(report: dict[str, Any], directory: str, all_matrices: bool = False) -> str:
    """Human-readable text of an :func:`artifact_report` result."""
    lines: list[str] = []
    counts, rates, cfg = report["counts"], report["rates"], report["config"]
    lines.append(f"artifact   {directory}")
    if "format" in report:
        lines.append(f"format     {report['format']}")
    if "integrity" in report:
        lines.append(f"integrity  {report['integrity']}")
    else:
        lines.append(
            "integrity  sha256 of every file verified against the manifest"
            if report.get("verified")
            else "integrity  NOT verified (--no-verify): sizes, schema and tensors checked, "
            "hashes not"
        )
    lines.append(
        f"codebook   {report['codebook']} + {cfg['gain_bits']} gain bit(s), "
        f"rotation {'on' if cfg['rotate'] else 'off'}, "
        f"int4 modules {cfg['int4_modules'] or 'none'}, "
        f"embedding {cfg['embedding_encoding']}"
        + (", head on the lattice" if cfg.get("lattice_head") else "")
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


def tetra_report(directory: str | os.PathLike[str], *, verify: bool = True) -> dict[str, Any]:
    """:func:`leechq.formats.accounting.artifact_report`'s dict for a published Tetra directory
    (same keys and rules), plus ``format`` and ``integrity`` (what was verified, in words).

    Raises:
        ArtifactError, FingerprintMismatch, IncompatibleVersion: the directory cannot be read
            (:func:`leechq.formats.tetra_read.read_tetra_dir`; the message names the file and
            field).
    """
    from leechq.codebooks import get
    from leechq.formats.accounting import accounting_report
    from leechq.formats.artifact import GroupAffine
    from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
    from leechq.formats.tetra_dir import DENSE_DIGEST_FILE, DIGEST_FILE, MODEL_FILE
    from leechq.formats.tetra_read import read_tetra_dir

    root = Path(directory)
    d = read_tetra_dir(root, verify=verify)
    body = accounting_report(d.records, list(d.raw.values()), get("tetra").label_bits, root)
    qc = d.quantization_config
    emb = d.raw.get("model.embed_tokens.weight")
    dense = (" (" + DENSE_DIGEST_FILE + " present, not checked: `leechq convert` checks it)"
             if (root / DENSE_DIGEST_FILE).is_file() else "")
    if not verify:
        integrity = ("NOT verified (--no-verify): descriptors, sizes and tensors checked, "
                     "hashes not")
    elif (root / DIGEST_FILE).is_file():
        integrity = f"every field's sha256 verified against {DIGEST_FILE}{dense}"
    else:
        integrity = f"sha256 of {MODEL_FILE} verified against artifact_sha256{dense}"
    lattice = [r for r in d.records.values() if isinstance(r, QuantizedWeight)]
    return {
        "format": f"published Tetra directory (quant_method 'llvq', llvq_layout_version "
                  f"{qc.get('llvq_layout_version')})",
        "codebook": "tetra",
        "verified": bool(verify),
        "integrity": integrity,
        "config": {
            "gain_bits": 1,
            "rotate": any(r.rotation is not None for r in lattice),
            # module names without their layer prefix, as a leechq artifact's config names them
            "int4_modules": sorted({re.sub(r"^model\.layers\.\d+\.", "", n)
                                    for n, r in d.records.items() if isinstance(r, Int4Weight)}),
            "embedding_encoding": f"int{emb.bits}" if isinstance(emb, GroupAffine) else "keep",
        },
        **body,
    }


def run(args: argparse.Namespace) -> int:
    """Print the report of ``args.artifact``, a leechq artifact or a published Tetra directory
    (text, or JSON with ``--json``)."""
    from leechq.formats.accounting import artifact_report
    from leechq.models.convert import is_tetra_dir

    verify = not getattr(args, "no_verify", False)
    if is_tetra_dir(args.artifact):
        report = tetra_report(args.artifact, verify=verify)
    else:
        report = artifact_report(args.artifact, verify=verify)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        print(format_report(report, str(args.artifact), all_matrices=args.matrices))
    return 0
