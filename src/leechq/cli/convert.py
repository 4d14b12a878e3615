"""``leechq convert DIR OUT``: a published Tetra checkpoint (``quant_method: "llvq"``) as a leechq
artifact.

A thin shell over :func:`leechq.models.convert.tetra_dir_to_artifact`: the records, carried tensors
and tokenizer files move over unchanged (lossless), and the artifact then loads through
``leechq.load``, ``leechq run/chat/eval/inspect`` and ``from_pretrained``. (``leechq.load`` and
``leechq run`` also accept the Tetra directory itself, converting it on the fly.)
"""

from __future__ import annotations

import argparse
import sys


def run(args: argparse.Namespace) -> int:
    """Convert ``args.source`` into ``args.out``; prints the artifact's rates at the end."""
    from leechq.cli.inspect import format_report
    from leechq.errors import InvalidInput
    from leechq.formats.accounting import artifact_report
    from leechq.models.convert import is_tetra_dir, tetra_dir_to_artifact

    if not is_tetra_dir(args.source):
        raise InvalidInput(
            f"{args.source}: not a Tetra checkpoint (no config.json with quantization_config."
            'quant_method "llvq")'
        )
    path = tetra_dir_to_artifact(
        args.source, args.out, overwrite=args.force, verify_dense=args.verify_dense
    )
    print(f"[convert] wrote {path}", file=sys.stderr)
    print(format_report(artifact_report(path), str(path)))
    return 0
