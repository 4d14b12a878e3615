"""The codebook fingerprint of index format v1: a 64-bit FNV-1a hash of the whole index map.

Implements docs/lattice.md §5. The hash covers the Golay generator and canonical word order, the
class layout (ranges and magnitude levels of all 383 classes of Λ24(13)) and the decoded points of
seven probe indices per class, so any silent change of generator, word order, class order, digit
order or sign convention changes it (pitfall P12). Format v1 is pinned to ``0x338f420f11866319``;
artifacts store it and readers compare it (``FingerprintMismatch``).

Probes are decoded with the scalar reference :func:`leechq.lattice.indexing.decode_index`.
"""

from __future__ import annotations

from functools import cache

from leechq.lattice.classes import ball_size, class_table
from leechq.lattice.golay import GENERATOR, golay_code
from leechq.lattice.indexing import FORMAT_MAX_SHELL, decode_index
from leechq.utils.splitmix import mix64

EXPECTED_FINGERPRINT = 0x338F420F11866319
"""The reference's value for format v1 (pjmalandrino/llvq ``fingerprint()``)."""

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1
_TAG = b"llvq codebook fingerprint v1"
_LEVEL_SLOTS = 5


class _Fnv1a64:
    """Incremental 64-bit FNV-1a over little-endian integers."""

    def __init__(self) -> None:
        self.state = _FNV_OFFSET

    def bytes(self, data: bytes) -> None:
        state = self.state
        for byte in data:
            state = ((state ^ byte) * _FNV_PRIME) & _MASK64
        self.state = state

    def u64(self, value: int) -> None:
        self.bytes((value & _MASK64).to_bytes(8, "little"))

    def i32(self, value: int) -> None:
        self.bytes(value.to_bytes(4, "little", signed=True))

    def byte(self, value: int) -> None:
        self.bytes(bytes([value]))


def _probe(h: _Fnv1a64, index: int, limit: int) -> None:
    h.u64(index)
    if 0 <= index <= limit:
        h.byte(1)
        for coordinate in decode_index(index, FORMAT_MAX_SHELL).tolist():
            h.i32(coordinate)
    else:
        h.byte(0)


@cache
def codebook_fingerprint() -> int:
    """The v1 fingerprint computed from this build's index map (docs/lattice.md §5).

    Returns:
        A 64-bit integer; equals :data:`EXPECTED_FINGERPRINT` for a correct implementation.
    """
    limit = ball_size(FORMAT_MAX_SHELL)
    h = _Fnv1a64()
    h.bytes(_TAG)
    h.u64(24)
    h.u64(limit)
    h.u64(GENERATOR)
    words = golay_code().words.tolist()
    h.u64(len(words))
    for word in words:
        h.u64(word)
    classes = class_table(FORMAT_MAX_SHELL)
    h.u64(len(classes))
    for number, cls in enumerate(classes):
        lo, hi = cls.first_index, cls.last_index
        h.u64(lo)
        h.u64(hi)
        levels = cls.levels()  # count descending, then value descending; 0 included when present
        nonzero = sum(count for value, count in levels if value != 0)
        h.u64(len(levels))
        h.u64(nonzero)
        h.u64(int(cls.odd))
        h.u64(cls.shell)
        padded = list(levels) + [(0, 0)] * (_LEVEL_SLOTS - len(levels))
        for value, count in padded:
            h.i32(value)
            h.byte(count)
        card = hi - lo + 1
        probes = [lo + card * j // 4 for j in range(4)] + [hi]
        probes += [lo + mix64(number ^ mix64(k)) % card for k in (0, 1)]
        for index in probes:
            _probe(h, index, limit)
    _probe(h, 0, limit)
    _probe(h, limit + 1, limit)
    return h.state


def codebook_fingerprint_hex() -> str:
    """:func:`codebook_fingerprint` as 16 lower-case hex digits ("338f420f11866319")."""
    return f"{codebook_fingerprint():016x}"
