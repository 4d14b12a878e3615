"""The served ``planes14`` layout: the ball codebook unfolded into 14-byte bit-plane records.

Follows docs/kernels.md. Every 24-column block of a ball-coded matrix becomes
one 112-bit record (bit ``k`` = bit ``k & 7`` of byte ``k >> 3``, little-endian):

==========  =====================================================================
bits        field
==========  =====================================================================
0–8         class id (0 = origin, ``1 + c`` = class ``c`` of the v1 ordering)
9           gain bit
10–33       sign mask (bit j set iff coordinate j < 0; zero coordinates 0)
34–57       level plane P0 (bit 0 of each coordinate's level)
58–81       level plane P1
82–105      level plane P2
106–111     zero padding
==========  =====================================================================

A coordinate's level indexes its class's *canonical level list*: the distinct magnitudes sorted by
multiplicity descending, ties by magnitude descending. The per-class table has 512 entries
(any 9-bit id stays in bounds; unused entries decode to zeros).

Deviation from the author's flat addressing (documented in docs/kernels.md): records are laid out
row by row and each row is padded to an even number of records, ``stride_u32 = 7·ceil(n_blocks/2)``
u32 words, so a pair of records is always 7 aligned words (the kernels read records two at a time).
The padding costs at most 14 bytes per row.

Packing is a pure bit reordering of the decoded content (class, gain, signs, levels): unpacking
returns the same points and gains and, through the v1 index, the same labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import ClassVar

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, NotInCodebook, UnsupportedShape
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import RotationTables
from leechq.lattice.classes import class_table

NAME = "planes14"
RECORD_BYTES = 14
TABLE_ENTRIES = 512
MAX_LEVELS = 5
MAX_SHELL = 12
MAX_MAGNITUDE = 16
"""Magnitudes in Λ24(12) are ≤ 13; histograms are taken over 0..15."""


def stride_u32(n_blocks: int) -> int:
    """u32 words per packed row: ``7·ceil(n_blocks / 2)`` (two 14-byte records per 7 words)."""
    return 7 * (-(-n_blocks // 2))


@dataclass(frozen=True)
class Planes14Tables:
    """The per-class table in its two forms.

    Attributes:
        vals: float32 [512, 5], ``f32(|v_l| / sqrt(16 m))`` per canonical level l (spec form).
        lens: int32 [512], number of levels (entry 0, the origin: 1).
        magnitudes: int32 [512, 5], the integer magnitudes |v_l| per level.
        shells: int32 [512], m of each entry (0 for the origin and unused entries).
        kernel: int32 [512, 4], the form the Triton kernel reads: word 0 = ``128 + magnitude`` of
            levels 0..3 as bytes, word 1 = ``128 + magnitude`` of level 4 in all four bytes (so a
            level byte 5..7 of a malformed record reads level 4, as the reference does), word 2 =
            f32 bits of ``f32(1/sqrt(f64(16 m)))`` (0 for the origin), word 3 = 0.
        level_of: int8 [512, 16], magnitude → level index (−1 where the class has no such value).
        n_classes: real classes (301 for Λ24(12)).
    """

    vals: np.ndarray
    lens: np.ndarray
    magnitudes: np.ndarray
    shells: np.ndarray
    kernel: np.ndarray
    level_of: np.ndarray
    n_classes: int


@cache
def planes14_tables() -> Planes14Tables:
    """Build (once) the 512-entry class table of Λ24(12) (docs/kernels.md)."""
    classes = class_table(MAX_SHELL)
    vals = np.zeros((TABLE_ENTRIES, MAX_LEVELS), dtype=np.float32)
    mags = np.zeros((TABLE_ENTRIES, MAX_LEVELS), dtype=np.int32)
    lens = np.zeros(TABLE_ENTRIES, dtype=np.int32)
    shells = np.zeros(TABLE_ENTRIES, dtype=np.int32)
    level_of = np.full((TABLE_ENTRIES, MAX_MAGNITUDE), -1, dtype=np.int8)
    lens[0] = 1
    level_of[0, 0] = 0
    for cls in classes:
        e = 1 + cls.number
        levels = [v for v, _ in cls.levels()]
        if len(levels) > MAX_LEVELS:
            raise AssertionError(f"class {cls.number} has {len(levels)} levels (> 5)")
        inv = 1.0 / np.sqrt(np.float64(16 * cls.shell))
        for lvl, v in enumerate(levels):
            mags[e, lvl] = v
            vals[e, lvl] = np.float32(v * inv) if v else np.float32(0.0)
            level_of[e, v] = lvl
        lens[e] = len(levels)
        shells[e] = cls.shell
    kernel = np.zeros((TABLE_ENTRIES, 4), dtype=np.uint32)
    m8 = mags.astype(np.uint32) + 128
    kernel[:, 0] = m8[:, 0] | (m8[:, 1] << 8) | (m8[:, 2] << 16) | (m8[:, 3] << 24)
    kernel[:, 1] = m8[:, 4] * 0x01010101
    inv32 = np.zeros(TABLE_ENTRIES, dtype=np.float32)
    nz = shells > 0
    inv32[nz] = (1.0 / np.sqrt(16.0 * shells[nz].astype(np.float64))).astype(np.float32)
    kernel[:, 2] = inv32.view(np.uint32)
    return Planes14Tables(
        vals=vals,
        lens=lens,
        magnitudes=mags,
        shells=shells,
        kernel=kernel.view(np.int32),
        level_of=level_of,
        n_classes=len(classes),
    )


@cache
def _class_keys() -> dict[bytes, int]:
    """(parity, magnitude histogram) → table entry, for every class of Λ24(12)."""
    keys: dict[bytes, int] = {}
    for cls in class_table(MAX_SHELL):
        hist = np.zeros(MAX_MAGNITUDE + 1, dtype=np.int16)
        for v in cls.magnitudes():
            hist[v] += 1
        hist[MAX_MAGNITUDE] = int(cls.odd)
        keys[hist.tobytes()] = 1 + cls.number
    return keys


def class_ids(points: np.ndarray) -> np.ndarray:
    """Table entry of each point: int32 [...] from int points [..., 24] (0 for the origin).

    Raises:
        NotInCodebook: a point's (parity, magnitude multiset) is no class of Λ24(12).
    """
    pts = np.asarray(points).reshape(-1, BLOCK)
    mag = np.abs(pts.astype(np.int64))
    if mag.size and int(mag.max()) >= MAX_MAGNITUDE:
        raise NotInCodebook(f"a coordinate of magnitude {int(mag.max())} is outside Λ24(12)")
    hist = np.zeros((pts.shape[0], MAX_MAGNITUDE + 1), dtype=np.int16)
    for v in range(MAX_MAGNITUDE):
        hist[:, v] = (mag == v).sum(axis=1)
    hist[:, MAX_MAGNITUDE] = pts[:, 0] & 1
    uniq, inverse = np.unique(hist, axis=0, return_inverse=True)
    keys = _class_keys()
    ids_u = np.zeros(uniq.shape[0], dtype=np.int32)
    for i, row in enumerate(uniq):
        if row[0] == BLOCK:  # the origin
            continue
        entry = keys.get(np.ascontiguousarray(row).tobytes())
        if entry is None:
            raise NotInCodebook(f"a block with magnitude histogram {row[:-1].tolist()} (parity "
                                f"{int(row[-1])}) is in no class of Λ24(12)")
        ids_u[i] = entry
    return ids_u[inverse.reshape(-1)].reshape(np.asarray(points).shape[:-1])


def records_from_points(points: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Pack points and gain bits into row-strided 14-byte records.

    Args:
        points: int [d_out, n_blocks, 24], points of Λ24(12), natural order.
        gains: [d_out, n_blocks] in {0, 1}.

    Returns:
        uint32 [d_out, stride_u32(n_blocks)].
    """
    pts = np.asarray(points).astype(np.int64)
    d_out, nb, _ = pts.shape
    gains = np.asarray(gains).astype(np.uint64)
    if gains.size and int(gains.max()) > 1:
        raise InvalidInput("planes14 holds one gain bit; a gain index above 1")
    ids = class_ids(pts).astype(np.int64)
    tabs = planes14_tables()
    lvl = tabs.level_of[ids[..., None], np.abs(pts)].astype(np.int64)
    if (lvl < 0).any():
        raise NotInCodebook("a coordinate magnitude is not a level of its class")
    bit = np.int64(1) << np.arange(BLOCK, dtype=np.int64)
    plane = lambda b: (((lvl >> b) & 1) * bit).sum(axis=-1)  # noqa: E731
    signs = ((pts < 0).astype(np.int64) * bit).sum(axis=-1)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
    words = records_from_fields(
        t(ids), t(gains.astype(np.int64)), t(signs), t(plane(0)), t(plane(1)), t(plane(2))
    )
    return words.numpy().view(np.uint32)


def fields_from_records(
    records: np.ndarray, n_blocks: int
) -> dict[str, np.ndarray]:
    """Split records into fields: id, gain, signs, p0, p1, p2 (each int64 [d_out, n_blocks])."""
    words = np.ascontiguousarray(np.asarray(records).astype("<u4", copy=False))
    d_out = words.shape[0]
    raw = words.view(np.uint8).reshape(d_out, -1)[:, : RECORD_BYTES * n_blocks]
    rec = np.zeros((d_out, n_blocks, 16), dtype=np.uint8)
    rec[:, :, :RECORD_BYTES] = raw.reshape(d_out, n_blocks, RECORD_BYTES)
    lo = rec[:, :, :8].copy().view("<u8")[..., 0]
    hi = rec[:, :, 8:].copy().view("<u8")[..., 0]
    m24 = np.uint64(0xFFFFFF)
    return {
        "id": (lo & np.uint64(0x1FF)).astype(np.int64),
        "gain": ((lo >> np.uint64(9)) & np.uint64(1)).astype(np.int64),
        "signs": ((lo >> np.uint64(10)) & m24).astype(np.int64),
        "p0": ((lo >> np.uint64(34)) & m24).astype(np.int64),
        "p1": (((lo >> np.uint64(58)) | (hi << np.uint64(6))) & m24).astype(np.int64),
        "p2": ((hi >> np.uint64(18)) & m24).astype(np.int64),
        "pad": (hi >> np.uint64(42)).astype(np.int64),
    }


def points_from_records(records: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode records: (points int32 [d_out, n_blocks, 24], gains uint8 [d_out, n_blocks])."""
    f = fields_from_records(records, n_blocks)
    j = np.arange(BLOCK, dtype=np.int64)
    lvl = ((f["p0"][..., None] >> j) & 1) | (((f["p1"][..., None] >> j) & 1) << 1) | (
        ((f["p2"][..., None] >> j) & 1) << 2)
    mags = planes14_tables().magnitudes
    lvl = np.minimum(lvl, MAX_LEVELS - 1)
    mag = mags[f["id"][..., None], lvl]
    neg = (f["signs"][..., None] >> j) & 1
    pts = np.where(neg == 1, -mag, mag).astype(np.int32)
    return pts, f["gain"].astype(np.uint8)


@dataclass(frozen=True)
class Planes14Weight:
    """A ball-coded matrix in the served ``planes14`` layout.

    Attributes:
        d_out, d_in: shape; ``n_blocks = d_in // 24``.
        records: int32 [d_out, stride_u32(n_blocks)], the u32 view of each padded row of records.
        row_scales: float32 [d_out]; row_centroids: float32 [d_out, 2]; tail: float32 [d_out, d_in % 24].
        row_scales_f64, row_centroids_f64: exact originals; n_centroids: 1 or 2.
        rotation: the input rotation, or None.
    """

    layout: ClassVar[str] = NAME

    d_out: int
    d_in: int
    records: torch.Tensor
    row_scales: torch.Tensor
    row_centroids: torch.Tensor
    tail: torch.Tensor
    row_scales_f64: torch.Tensor
    row_centroids_f64: torch.Tensor
    n_centroids: int = 2
    rotation: RotationTables | None = None

    @property
    def n_blocks(self) -> int:
        return self.d_in // BLOCK

    @property
    def tail_cols(self) -> int:
        return self.d_in % BLOCK

    @property
    def stride(self) -> int:
        return stride_u32(self.n_blocks)

    @property
    def device(self) -> torch.device:
        return self.records.device

    def validate(self) -> None:
        expect = {
            "records": ((self.d_out, self.stride), torch.int32),
            "row_scales": ((self.d_out,), torch.float32),
            "row_centroids": ((self.d_out, 2), torch.float32),
            "tail": ((self.d_out, self.tail_cols), torch.float32),
            "row_scales_f64": ((self.d_out,), torch.float64),
            "row_centroids_f64": ((self.d_out, 2), torch.float64),
        }
        for name, (shape, dtype) in expect.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise InvalidInput(
                    f"Planes14Weight.{name}: expected {dtype} {list(shape)}, got {t.dtype} "
                    f"{list(t.shape)}"
                )

    def to(self, device: torch.device | str) -> Planes14Weight:
        return replace(
            self,
            records=self.records.to(device).contiguous(),
            row_scales=self.row_scales.to(device).contiguous(),
            row_centroids=self.row_centroids.to(device).contiguous(),
            tail=self.tail.to(device).contiguous(),
        )

    def kernel_bytes(self) -> int:
        """Bytes a matvec streams: records (with row padding), f32 scale and pair, f32 tail."""
        return 4 * (self.records.numel() + self.row_scales.numel() + self.row_centroids.numel()
                    + self.tail.numel())

    def points(self) -> tuple[np.ndarray, np.ndarray]:
        """Decoded (points int32 [d_out, n_blocks, 24], gains uint8 [d_out, n_blocks])."""
        return points_from_records(self.records.cpu().numpy().view(np.uint32), self.n_blocks)


def pack_points(
    points: np.ndarray,
    gains: np.ndarray,
    row_scales: torch.Tensor,
    centroids: torch.Tensor,
    tail: torch.Tensor,
    rotation: RotationTables | None = None,
) -> Planes14Weight:
    """Build a record from decoded content (points, gains) and the per-row/per-matrix scales."""
    pts = np.asarray(points)
    d_out, nb, _ = pts.shape
    n_c = centroids.numel()
    if n_c > 2:
        raise UnsupportedShape(f"planes14 holds one gain bit; this matrix has {n_c} centroids")
    pair = centroids.to(torch.float64).repeat(2)[:2] if n_c == 1 else centroids.to(torch.float64)
    cent64 = pair.expand(d_out, 2).contiguous()
    records = records_from_points(pts, gains)
    out = Planes14Weight(
        d_out=d_out,
        d_in=nb * BLOCK + tail.shape[1],
        records=torch.from_numpy(records.view(np.int32).copy()),
        row_scales=row_scales.to(torch.float32),
        row_centroids=cent64.to(torch.float32),
        tail=tail.to(torch.float32).clone(),
        row_scales_f64=row_scales.to(torch.float64).clone(),
        row_centroids_f64=cent64,
        n_centroids=n_c,
        rotation=rotation,
    )
    out.validate()
    return out


def pack(qw: QuantizedWeight) -> Planes14Weight:
    """Repack a canonical ball-coded matrix (codebook ``"ball"``, Λ24(12)) into ``planes14``."""
    if qw.codebook != "ball":
        raise InvalidInput(f"planes14 unfolds ball-coded matrices, got codebook {qw.codebook!r}")
    from leechq.lattice.indexing import decode_indices

    points = decode_indices(qw.labels.numpy(), MAX_SHELL)
    return pack_points(points, qw.gains.numpy(), qw.row_scales, qw.centroids, qw.tail, qw.rotation)


def _expect(w: object, what: str) -> None:
    """Raise :class:`InvalidInput` unless ``w`` is a :class:`Planes14Weight`."""
    if type(w) is not Planes14Weight:
        got = getattr(w, "layout", "") or type(w).__name__
        raise InvalidInput(f"planes14.{what}: expected a planes14 record (Planes14Weight), "
                           f"got {got}")


def unpack(w: Planes14Weight) -> QuantizedWeight:
    """The canonical ball-coded matrix back (labels through the v1 index), bit for bit.

    Raises:
        InvalidInput: ``w`` is not a ``planes14`` record, or concatenates different gain pairs.
    """
    from leechq.lattice.indexing import encode_points

    _expect(w, "unpack")
    cents = w.row_centroids_f64.cpu()
    if w.d_out and not bool((cents == cents[0]).all()):
        raise InvalidInput("planes14.unpack: rows carry different centroid pairs (a fused record)")
    pts, gains = w.points()
    labels = encode_points(pts, MAX_SHELL)
    return QuantizedWeight(
        codebook="ball",
        d_out=w.d_out,
        d_in=w.d_in,
        labels=torch.from_numpy(labels.astype(np.int64)),
        gains=torch.from_numpy(gains),
        row_scales=w.row_scales_f64.cpu().clone(),
        centroids=cents[0, : w.n_centroids].clone().to(torch.float64),
        tail=w.tail.cpu().clone(),
        rotation=w.rotation,
    )


def concat_rows(parts: Sequence[Planes14Weight]) -> Planes14Weight:
    """Concatenate matrices that read the same input into one record by rows (docs/kernels.md)."""
    if not parts:
        raise InvalidInput("concat_rows needs at least one matrix")
    d_in = parts[0].d_in
    for p in parts:
        _expect(p, "concat_rows")
        if p.d_in != d_in:
            raise InvalidInput(f"concat_rows: d_in {p.d_in} != {d_in}; fused matrices share an input")
    cat = lambda name: torch.cat([getattr(p, name) for p in parts], dim=0)  # noqa: E731
    out = Planes14Weight(
        d_out=sum(p.d_out for p in parts),
        d_in=d_in,
        records=cat("records"),
        row_scales=cat("row_scales"),
        row_centroids=cat("row_centroids"),
        tail=cat("tail"),
        row_scales_f64=cat("row_scales_f64"),
        row_centroids_f64=cat("row_centroids_f64"),
        n_centroids=max(p.n_centroids for p in parts),
        rotation=parts[0].rotation,
    )
    out.validate()
    return out


def records_from_fields(
    ids: torch.Tensor,
    gains: torch.Tensor,
    signs: torch.Tensor,
    p0: torch.Tensor,
    p1: torch.Tensor,
    p2: torch.Tensor,
) -> torch.Tensor:
    """Pack record fields (each int64 [d_out, n_blocks], any device) into int32 row-strided words.

    Returns:
        int32 [d_out, stride_u32(n_blocks)] on the fields' device.
    """
    d_out, nb = ids.shape
    m24 = 0xFFFFFF
    lo = (ids & 0x1FF) | ((gains & 1) << 9) | ((signs & m24) << 10) | ((p0 & m24) << 34) | (
        (p1 & 0x3F) << 58
    )
    hi = ((p1 & m24) >> 6) | ((p2 & m24) << 18)
    rec = torch.cat(
        (
            lo.contiguous().view(torch.uint8).reshape(d_out, nb, 8),
            hi.contiguous().view(torch.uint8).reshape(d_out, nb, 8)[:, :, :6],
        ),
        dim=2,
    )
    rows = torch.zeros(d_out, stride_u32(nb) * 4, dtype=torch.uint8, device=ids.device)
    rows[:, : RECORD_BYTES * nb] = rec.reshape(d_out, RECORD_BYTES * nb)
    return rows.view(torch.int32)


def random_planes14(
    d_out: int, d_in: int, *, seed: int = 0, device: torch.device | str = "cpu"
) -> Planes14Weight:
    """A random ``planes14`` record with valid class ids and level planes, built on ``device``.

    Class ids are uniform over the 301 classes and the origin; each coordinate's level is 4 with
    probability 1/8, else uniform in 0..3; signs are uniform. The content is not a set of lattice
    points (a level past a class's length decodes to 0, as the kernels and the reference agree), but
    it exercises the arithmetic and the byte traffic exactly as real records do.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    nb = d_in // BLOCK
    n_ids = 1 + planes14_tables().n_classes

    def bits24() -> torch.Tensor:
        return torch.randint(0, 1 << 24, (d_out, nb), generator=g, device=device, dtype=torch.int64)

    ids = torch.randint(0, n_ids, (d_out, nb), generator=g, device=device, dtype=torch.int64)
    gains = torch.randint(0, 2, (d_out, nb), generator=g, device=device, dtype=torch.int64)
    p2 = bits24() & bits24() & bits24()
    p0 = bits24() & ~p2
    p1 = bits24() & ~p2
    words = records_from_fields(ids, gains, bits24(), p0, p1, p2)
    scales = torch.rand(d_out, generator=g, device=device, dtype=torch.float64) + 0.5
    cents = torch.tensor([0.8, 1.2], dtype=torch.float64, device=device).expand(d_out, 2).contiguous()
    tail = torch.randn(d_out, d_in % BLOCK, generator=g, device=device, dtype=torch.float32)
    return Planes14Weight(
        d_out=d_out,
        d_in=d_in,
        records=words.contiguous(),
        row_scales=scales.to(torch.float32),
        row_centroids=cents.to(torch.float32),
        tail=tail,
        row_scales_f64=scales.cpu(),
        row_centroids_f64=cents.cpu(),
    )
