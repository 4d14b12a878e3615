"""The codebook fingerprint of index format v1 (docs/lattice.md §5; pitfall P12 of
docs/quantizer.md §9)."""

from __future__ import annotations

import pytest

from leechq.lattice import fingerprint as fp
from leechq.lattice.fingerprint import (
    EXPECTED_FINGERPRINT,
    codebook_fingerprint,
    codebook_fingerprint_hex,
)


def test_fingerprint_matches_the_reference() -> None:
    assert codebook_fingerprint() == EXPECTED_FINGERPRINT == 0x338F420F11866319
    assert codebook_fingerprint_hex() == "338f420f11866319"


def test_fnv1a_primitive_known_values() -> None:
    h = fp._Fnv1a64()
    assert h.state == 0xCBF29CE484222325  # hash of the empty input
    h.bytes(b"a")
    assert h.state == 0xAF63DC4C8601EC8C  # published FNV-1a 64 test vector
    h = fp._Fnv1a64()
    h.bytes(b"foobar")
    assert h.state == 0x85944171F73967E8
    le = fp._Fnv1a64()
    le.u64(0x0102)
    manual = fp._Fnv1a64()
    manual.bytes(bytes([2, 1, 0, 0, 0, 0, 0, 0]))
    assert le.state == manual.state
    neg = fp._Fnv1a64()
    neg.i32(-1)
    manual = fp._Fnv1a64()
    manual.bytes(b"\xff\xff\xff\xff")
    assert neg.state == manual.state


def test_fingerprint_detects_a_changed_index_map(monkeypatch: pytest.MonkeyPatch) -> None:
    # A silent permutation of the map (here: two coordinates swapped on decode) must change it.
    real = fp.decode_index

    def swapped(index: int, max_shell: int = 13):  # type: ignore[no-untyped-def]
        point = real(index, max_shell)
        point[[0, 1]] = point[[1, 0]]
        return point

    monkeypatch.setattr(fp, "decode_index", swapped)
    assert fp.codebook_fingerprint.__wrapped__() != EXPECTED_FINGERPRINT
