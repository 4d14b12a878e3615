"""The Tetra codebook: 47-bit labels ↔ points of √8·Λ24, bit-compatible with llvq-tetra 0.1.0.

Implements docs/codebooks.md §3: the field layout (docs/codebooks.md §3.4), the two byte conventions
of the 48-bit word (docs/codebooks.md §3.5), the integer-only decode (docs/codebooks.md §3.4,
batched torch on CPU and CUDA, with a numpy reference twin) and the inverse map of a codebook point
to its label (docs/codebooks.md §3.4). The direction search (``encode``) lives
in :mod:`leechq.codebooks.tetra_encoder`; the tables in :mod:`leechq.codebooks.tetra_tables`.

Word conventions: ``word = label | gain << 47``. On disk a block is 6 bytes, big-endian, of
``label << 1 | gain`` (gain = LSB of the 6th byte); served to kernels a block is the word's 6
little-endian bytes (gain = bit 7 of the 6th byte).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import torch

from leechq.codebooks.tetra_tables import (
    CLASS_ROWS,
    FINGERPRINT,
    LABEL_BITS,
    N0_MIXED,
    rows_ranks,
    tetra_tables,
)
from leechq.errors import ArtifactError, InvalidInput, NotInCodebook

LABEL_LIMIT = 1 << LABEL_BITS
WORD_BYTES = 6
GAIN_SHIFT = LABEL_BITS

FIELDS: dict[str, tuple[int, int]] = {
    "p": (0, 1),
    "r": (1, 1),
    "s8": (2, 6),
    "b1": (8, 1),
    "i1": (9, 11),
    "b2": (20, 4),
    "i2": (24, 11),
    "b3": (35, 1),
    "i3": (36, 11),
}
"""Field name → (lowest bit, width) of a label (docs/codebooks.md §3.4)."""


# ----------------------------------------------------------------------------------------------
# Labels and tables on a device


@cache
def _device_tables(device: str) -> dict[str, torch.Tensor]:
    """The decode tables as torch tensors on ``device`` (int64 small tables, int32 rows)."""
    t = tetra_tables()
    dev = torch.device(device)
    inverse_order = np.argsort(t.order.astype(np.int64))
    return {
        "prefixes": torch.as_tensor(t.prefixes_flat.astype(np.int64), device=dev),
        "branches": torch.as_tensor(t.branches_u16.reshape(-1).astype(np.int64), device=dev),
        "suffixes": torch.as_tensor(t.suffixes_flat.astype(np.int64), device=dev),
        "rows": torch.as_tensor(t.rows.astype(np.int32), device=dev),
        # For natural coordinate i at trio position t: section t // 8, bit t % 8 of its pattern
        # byte, rank nibble t % 8 = byte 4·section + (t % 8) // 2 of the stacked rows, shift 0 or 4.
        "section": torch.as_tensor(inverse_order // 8, device=dev).view(1, 24),
        "bit_in_byte": torch.as_tensor(inverse_order % 8, dtype=torch.uint8, device=dev),
        "rank_byte": torch.as_tensor(
            4 * (inverse_order // 8) + (inverse_order % 8) // 2, device=dev
        ).view(1, 24),
        "rank_shift": torch.as_tensor(4 * (inverse_order % 2), dtype=torch.uint8, device=dev),
    }


def _check_labels(labels: torch.Tensor, name: str = "labels") -> torch.Tensor:
    if not isinstance(labels, torch.Tensor):
        labels = torch.as_tensor(np.asarray(labels))
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise InvalidInput(f"{name} must be an integer tensor, got dtype {labels.dtype}")
    labels = labels.to(torch.int64)
    if labels.numel() and bool(((labels < 0) | (labels >= LABEL_LIMIT)).any()):
        bad = labels[(labels < 0) | (labels >= LABEL_LIMIT)].reshape(-1)[0].item()
        raise InvalidInput(
            f"{name} must lie in [0, 2^47) (the gain bit is not part of a label); found {bad}"
        )
    return labels


def split_fields(labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Field values of labels (docs/codebooks.md §3.4): int64 [...] → dict name → int64 [...]."""
    return {n: (labels >> lo) & ((1 << w) - 1) for n, (lo, w) in FIELDS.items()}


def pack_fields(**fields: Any) -> Any:
    """Inverse of :func:`split_fields`: int fields (torch, numpy or int) → int64 labels."""
    out = 0
    for name, (lo, _width) in FIELDS.items():
        out = out | (fields[name] << lo)
    return out


# ----------------------------------------------------------------------------------------------
# Decode


def decode(labels: torch.Tensor, *, validate: bool = True) -> torch.Tensor:
    """Decode Tetra labels to lattice points (docs/codebooks.md §3.4), integer-only.

    Args:
        labels: int64 [...] in [0, 2^47), any device.
        validate: check the range (one device sync on CUDA). With False, bits ≥ 47 are ignored,
            as the format's decode ignores bits ≥ 48 of a word.

    Returns:
        int32 [..., 24], natural coordinate order, on the labels' device.

    Raises:
        InvalidInput: a non-integer tensor or a label outside [0, 2^47).
    """
    if validate or not isinstance(labels, torch.Tensor):
        labels = _check_labels(labels) if validate else torch.as_tensor(np.asarray(labels))
    shape = labels.shape
    flat = labels.reshape(-1).to(torch.int64) & (LABEL_LIMIT - 1)
    tab = _device_tables(str(flat.device))
    p = flat & 1
    r = (flat >> 1) & 1
    s8 = (flat >> 2) & 63
    i2 = (flat >> 24) & 2047
    c1 = tab["prefixes"][2 * s8 + ((flat >> 8) & 1)]
    branch = tab["branches"][16 * s8 + ((flat >> 20) & 15)]
    c2 = branch & 255
    c3 = tab["suffixes"][2 * (branch >> 8) + ((flat >> 35) & 1)]
    delta = (i2 >= N0_MIXED).long()
    rows = tab["rows"]
    row1 = rows[CLASS_ROWS * r + ((flat >> 9) & 2047)]
    row2 = rows[i2 + (CLASS_ROWS - N0_MIXED) * delta]
    row3 = rows[CLASS_ROWS * (p ^ r ^ delta) + ((flat >> 36) & 2047)]
    n = flat.numel()
    # Work directly in natural order: coordinate i sits at trio position t = inverse_order[i], in
    # section t // 8 as its (t % 8)-th pattern bit and rank nibble. Byte-wide gathers keep it cheap.
    row_bytes = torch.stack((row1, row2, row3), dim=1).view(torch.uint8)  # [n, 12], little-endian
    ranks = (torch.gather(row_bytes, 1, tab["rank_byte"].expand(n, 24)) >> tab["rank_shift"]) & 15
    patterns = torch.stack((c1, c2, c3), dim=1).to(torch.uint8)  # [n, 3]
    bits = (torch.gather(patterns, 1, tab["section"].expand(n, 24)) >> tab["bit_in_byte"]) & 1
    p8 = p.to(torch.uint8).unsqueeze(1)
    # val(p + 2c, ρ) in closed form (from docs/codebooks.md §3.3): with odd = (ρ ⊕ c ⊕ p) & 1,
    # value = odd·(4ρ + 2) − (2ρ + p). Every term fits in int8 (|value| ≤ 10 for ranks ≤ 4).
    odd = ((ranks ^ bits ^ p8) & 1).to(torch.int8)
    ranks = ranks.to(torch.int8)
    natural = odd * (4 * ranks + 2) - (2 * ranks + p8.to(torch.int8))
    return natural.to(torch.int32).reshape(*shape, 24)


def decode_reference(labels: torch.Tensor) -> torch.Tensor:
    """Reference twin of :func:`decode`: a plain numpy walk of docs/codebooks.md §3.4 with the
    ``values`` table.

    Args:
        labels: int64 [...] in [0, 2^47).

    Returns:
        int32 [..., 24] natural order, on the labels' device.
    """
    labels = _check_labels(labels)
    t = tetra_tables()
    lab = labels.detach().cpu().numpy().reshape(-1).astype(np.int64)
    f = {n: (lab >> lo) & ((1 << w) - 1) for n, (lo, w) in FIELDS.items()}
    c1 = t.prefixes[f["s8"], f["b1"]].astype(np.int64)
    c2 = t.branch_c2[f["s8"], f["b2"]].astype(np.int64)
    s16 = t.branch_s16[f["s8"], f["b2"]].astype(np.int64)
    c3 = t.suffixes[s16, f["b3"]].astype(np.int64)
    rows = t.rows.astype(np.int64)
    delta = (f["i2"] >= N0_MIXED).astype(np.int64)
    row1 = rows[CLASS_ROWS * f["r"] + f["i1"]]
    row2 = np.where(delta == 1, rows[np.minimum(CLASS_ROWS + f["i2"] - N0_MIXED, 4095)], 0)
    row2 = np.where(delta == 0, rows[np.minimum(f["i2"], 4095)], row2)
    row3 = rows[CLASS_ROWS * (f["p"] ^ f["r"] ^ delta) + f["i3"]]
    trio = np.empty((lab.size, 24), dtype=np.int64)
    for s, (c, row) in enumerate(((c1, row1), (c2, row2), (c3, row3))):
        for j in range(8):
            o = f["p"] + 2 * ((c >> j) & 1)
            rank = (row >> (4 * j)) & 15
            trio[:, 8 * s + j] = t.values[o, rank]
    natural = np.empty_like(trio)
    natural[:, t.order.astype(np.int64)] = trio
    out = torch.from_numpy(natural.astype(np.int32)).reshape(*labels.shape, 24)
    return out.to(labels.device)


# ----------------------------------------------------------------------------------------------
# Points → labels (docs/codebooks.md §3.4)


@cache
def _inverse_tables() -> dict[str, np.ndarray]:
    t = tetra_tables()
    prefix_index = np.full(256, -1, dtype=np.int64)
    for s8 in range(64):
        for b1 in range(2):
            prefix_index[t.prefixes[s8, b1]] = 2 * s8 + b1
    middle_index = np.full((64, 256), -1, dtype=np.int64)
    suffix_index = np.full((64, 256), -1, dtype=np.int64)
    for s in range(64):
        middle_index[s, t.branch_c2[s]] = np.arange(16)
        suffix_index[s, t.suffixes[s]] = np.arange(2)
    rows = t.rows.astype(np.int64)
    row_sort = np.argsort(rows)
    # rank_of[o, y + 32] = ρ with val(o, ρ) = y (ρ ≤ 7), or -1.
    rank_of = np.full((4, 65), -1, dtype=np.int64)
    for o in range(4):
        for rank in range(8):
            rank_of[o, int(t.values[o, rank]) + 32] = rank
    return {
        "prefix_index": prefix_index,
        "middle_index": middle_index,
        "suffix_index": suffix_index,
        "sorted_rows": rows[row_sort],
        "sorted_pos": row_sort,
        "rank_of": rank_of,
    }


def _locate_rows(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(found, class, index within class) of packed rank vectors in the 4096 rows."""
    inv = _inverse_tables()
    pos = np.clip(np.searchsorted(inv["sorted_rows"], packed), 0, 4095)
    found = inv["sorted_rows"][pos] == packed
    flat = inv["sorted_pos"][pos]
    return found, flat // CLASS_ROWS, flat % CLASS_ROWS


def encode_point_mask(points: Any) -> tuple[np.ndarray, np.ndarray]:
    """Labels of points and whether each point is in the codebook (no exception).

    Args:
        points: integer [..., 24] (torch or numpy), natural order.

    Returns:
        (labels int64 [...], member bool [...]) as numpy arrays; labels of non-members are 0.
    """
    arr = points.detach().cpu().numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
    if arr.ndim == 0 or arr.shape[-1] != 24:
        raise InvalidInput(f"points must have last dimension 24, got shape {tuple(arr.shape)}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInput(f"points must be integers, got dtype {arr.dtype}")
    shape = arr.shape[:-1]
    t = tetra_tables()
    inv = _inverse_tables()
    y = arr.reshape(-1, 24).astype(np.int64)[:, t.order.astype(np.int64)]  # trio order
    ok = np.all(np.abs(y) <= 32, axis=1)
    y = np.where(ok[:, None], y, 0)
    p = y[:, 0] & 1
    ok &= np.all((y & 1) == p[:, None], axis=1)
    c = ((y - p[:, None]) >> 1) & 1
    ranks = inv["rank_of"][p[:, None] + 2 * c, y + 32]
    ok &= np.all(ranks >= 0, axis=1)
    ranks = np.maximum(ranks, 0)
    weights = 1 << np.arange(8, dtype=np.int64)
    nibbles = 1 << (4 * np.arange(8, dtype=np.int64))
    byte = [(c[:, 8 * s : 8 * s + 8] * weights).sum(axis=1) for s in range(3)]
    packed = [(ranks[:, 8 * s : 8 * s + 8] * nibbles).sum(axis=1) for s in range(3)]
    start = inv["prefix_index"][byte[0]]
    ok &= start >= 0
    s8, b1 = np.maximum(start, 0) >> 1, np.maximum(start, 0) & 1
    b2 = inv["middle_index"][s8, byte[1]]
    ok &= b2 >= 0
    b2 = np.maximum(b2, 0)
    s16 = t.branch_s16[s8, b2].astype(np.int64)
    b3 = inv["suffix_index"][s16, byte[2]]
    ok &= b3 >= 0
    b3 = np.maximum(b3, 0)
    found1, r, i1 = _locate_rows(packed[0])
    found2, delta, idx2 = _locate_rows(packed[1])
    found3, r3, i3 = _locate_rows(packed[2])
    ok &= found1 & found2 & found3
    ok &= np.where(delta == 0, idx2 < N0_MIXED, idx2 < CLASS_ROWS - N0_MIXED)
    ok &= r3 == (p ^ r ^ delta)
    i2 = idx2 + N0_MIXED * delta
    labels = pack_fields(p=p, r=r, s8=s8, b1=b1, i1=i1, b2=b2, i2=i2, b3=b3, i3=i3)
    labels = np.where(ok, labels, 0).astype(np.int64)
    return labels.reshape(shape), ok.reshape(shape)


def encode_point(points: Any) -> Any:
    """Label of each codebook point (docs/codebooks.md §3.4); the inverse of :func:`decode`.

    Args:
        points: integer [..., 24] natural order (torch tensor or numpy array).

    Returns:
        int64 labels [...], a torch tensor on the points' device (numpy in → numpy out).

    Raises:
        NotInCodebook: some point is not a Tetra codebook point (message names the first).
    """
    labels, member = encode_point_mask(points)
    if not member.all():
        bad = np.argwhere(~member)[0]
        raise NotInCodebook(
            f"{int((~member).sum())} of {member.size} points are not in the Tetra codebook; "
            f"first at index {tuple(int(v) for v in bad)}"
        )
    if isinstance(points, torch.Tensor):
        return torch.from_numpy(labels).to(points.device)
    return labels


# ----------------------------------------------------------------------------------------------
# Words and byte streams (docs/codebooks.md §3.5)


def _is_torch(x: Any) -> bool:
    return isinstance(x, torch.Tensor)


def words_from_labels_gains(labels: Any, gains: Any) -> Any:
    """48-bit words ``label | gain << 47``.

    Args:
        labels: int [...] in [0, 2^47) (torch or numpy).
        gains: int [...] in {0, 1}, broadcastable to labels.

    Returns:
        int64 (torch) or uint64 (numpy) words [...].
    """
    if _is_torch(labels):
        lab = _check_labels(labels)
        g = torch.as_tensor(gains, device=lab.device).to(torch.int64)
        if g.numel() and bool(((g < 0) | (g > 1)).any()):
            raise InvalidInput("gains must be 0 or 1")
        return lab | (g << GAIN_SHIFT)
    lab = np.asarray(labels)
    g = np.asarray(gains)
    if lab.size and (lab.min() < 0 or lab.max() >= LABEL_LIMIT):
        raise InvalidInput("labels must lie in [0, 2^47)")
    if g.size and (g.min() < 0 or g.max() > 1):
        raise InvalidInput("gains must be 0 or 1")
    return lab.astype(np.uint64) | (g.astype(np.uint64) << np.uint64(GAIN_SHIFT))


def labels_gains_from_words(words: Any) -> tuple[Any, Any]:
    """Split 48-bit words into (labels, gains); bits ≥ 48 are ignored (docs/codebooks.md §3.4 step
    1)."""
    if _is_torch(words):
        w = words.to(torch.int64)
        return w & (LABEL_LIMIT - 1), (w >> GAIN_SHIFT) & 1
    w = np.asarray(words).astype(np.uint64)
    labels = (w & np.uint64(LABEL_LIMIT - 1)).astype(np.int64)
    return labels, ((w >> np.uint64(GAIN_SHIFT)) & np.uint64(1)).astype(np.int64)


def _byte_stream(value: Any, big_endian: bool) -> Any:
    """Six bytes of each 48-bit value, flattened to one uint8 stream."""
    shifts = [8 * (5 - k) if big_endian else 8 * k for k in range(WORD_BYTES)]
    if _is_torch(value):
        v = value.reshape(-1).to(torch.int64)
        return torch.stack([(v >> s) & 255 for s in shifts], dim=1).to(torch.uint8).reshape(-1)
    v = np.asarray(value).astype(np.uint64).reshape(-1)
    cols = [(v >> np.uint64(s)) & np.uint64(255) for s in shifts]
    return np.stack(cols, axis=1).astype(np.uint8).reshape(-1)


def _values_from_stream(data: Any, big_endian: bool, what: str) -> Any:
    n = data.numel() if _is_torch(data) else np.asarray(data).size
    if n % WORD_BYTES:
        raise ArtifactError(
            f"{what} byte stream has {n} bytes, not a multiple of {WORD_BYTES} (one 48-bit word "
            "per block): truncated or not a Tetra stream"
        )
    shifts = [8 * (5 - k) if big_endian else 8 * k for k in range(WORD_BYTES)]
    if _is_torch(data):
        b = data.reshape(-1, WORD_BYTES).to(torch.int64)
        out = torch.zeros(b.shape[0], dtype=torch.int64, device=b.device)
        for k, s in enumerate(shifts):
            out |= b[:, k] << s
        return out
    b = np.asarray(data, dtype=np.uint8).reshape(-1, WORD_BYTES).astype(np.uint64)
    out = np.zeros(b.shape[0], dtype=np.uint64)
    for k, s in enumerate(shifts):
        out |= b[:, k] << np.uint64(s)
    return out


def disk_bytes_from_words(words: Any) -> Any:
    """On-disk stream (``msb_first_dense``): 6 big-endian bytes of ``label << 1 | gain`` a block.

    Args:
        words: [...] 48-bit words (torch int64 or numpy integer), flattened in C order.

    Returns:
        uint8 [6·n] (same library as the input).
    """
    labels, gains = labels_gains_from_words(words)
    return _byte_stream((labels << 1) | gains, big_endian=True)


def words_from_disk_bytes(data: Any) -> Any:
    """Inverse of :func:`disk_bytes_from_words`: uint8 [6·n] → words [n].

    Raises:
        ArtifactError: the stream length is not a multiple of 6.
    """
    value = _values_from_stream(data, big_endian=True, what="on-disk Tetra")
    if _is_torch(value):
        return (value >> 1) | ((value & 1) << GAIN_SHIFT)
    return (value >> np.uint64(1)) | ((value & np.uint64(1)) << np.uint64(GAIN_SHIFT))


def served_bytes_from_words(words: Any) -> Any:
    """Served (``tetra48``) stream: the 6 little-endian bytes of each word, unpadded.

    Args:
        words: [...] 48-bit words, flattened in C order.

    Returns:
        uint8 [6·n].
    """
    labels, gains = labels_gains_from_words(words)
    return _byte_stream(labels | (gains << GAIN_SHIFT), big_endian=False)


def words_from_served_bytes(data: Any) -> Any:
    """Inverse of :func:`served_bytes_from_words`: uint8 [6·n] → words [n].

    Raises:
        ArtifactError: the stream length is not a multiple of 6.
    """
    return _values_from_stream(data, big_endian=False, what="served Tetra")


# ----------------------------------------------------------------------------------------------
# The codebook object


class TetraCodebook:
    """The Tetra codebook (docs/codebooks.md): 2^47 points of √8·Λ24 with m ≤ 26.

    ``encode`` maximizes ``⟨x, y⟩/‖y‖`` over the codebook (docs/codebooks.md §3.7);
    ``decode`` is the bit-exact integer decode of docs/codebooks.md §3.4.
    """

    name = "tetra"
    dim = 24
    label_bits = LABEL_BITS

    def fingerprint(self) -> str:
        """The pinned map fingerprint ``"9c3060086c7a13e6"`` (docs/codebooks.md §3.6)."""
        return FINGERPRINT

    def decode(self, labels: torch.Tensor) -> torch.Tensor:
        """labels int64 [...] → points int32 [..., 24], natural order (see :func:`decode`)."""
        return decode(labels)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Directions x float [..., 24] → labels int64 [...]; the zero block gets label 0."""
        from leechq.codebooks.tetra_encoder import encode

        return encode(x)

    def encode_point(self, points: Any) -> Any:
        """Exact label of codebook points (see :func:`encode_point`)."""
        return encode_point(points)


__all__ = [
    "FIELDS",
    "TetraCodebook",
    "decode",
    "decode_reference",
    "disk_bytes_from_words",
    "encode_point",
    "encode_point_mask",
    "labels_gains_from_words",
    "pack_fields",
    "rows_ranks",
    "served_bytes_from_words",
    "split_fields",
    "words_from_disk_bytes",
    "words_from_labels_gains",
    "words_from_served_bytes",
]
