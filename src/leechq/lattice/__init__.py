"""Layer 0: the exact Leech-lattice core (Golay code, Λ24 membership, classes, index, search).

Pure Python/numpy and integer-exact; imports no torch. See docs/lattice.md §1–§6. Tables are built
lazily on first use, never at import.
"""

from __future__ import annotations

from leechq.lattice.classes import LatticeClass, ball_size, class_table, index_bits, shell_size
from leechq.lattice.fingerprint import (
    EXPECTED_FINGERPRINT,
    codebook_fingerprint,
    codebook_fingerprint_hex,
)
from leechq.lattice.golay import golay_code
from leechq.lattice.indexing import (
    FORMAT_MAX_SHELL,
    decode_index,
    decode_indices,
    encode_point,
    encode_points,
)
from leechq.lattice.leech import golay_word, golay_words, is_member, members, shell_of

__all__ = [
    "EXPECTED_FINGERPRINT",
    "FORMAT_MAX_SHELL",
    "LatticeClass",
    "ball_size",
    "class_table",
    "codebook_fingerprint",
    "codebook_fingerprint_hex",
    "decode_index",
    "decode_indices",
    "encode_point",
    "encode_points",
    "golay_code",
    "golay_word",
    "golay_words",
    "index_bits",
    "is_member",
    "members",
    "shell_of",
    "shell_size",
]
