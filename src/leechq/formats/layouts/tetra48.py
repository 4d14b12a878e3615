"""The served ``tetra48`` layout: Tetra words as row-strided little-endian 6-byte records.

Follows docs/kernels.md. Each 24-column block
of a row is the 48-bit word ``label | gain << 47`` (label = the 47-bit Tetra label, gain = the 1-bit
centroid index) stored as 6 little-endian bytes; a row's words are packed back to back and the row is
zero-padded to ``stride_u32 = ceil(6·n_blocks / 8) · 2`` 32-bit words, so every row starts on a u32
boundary and the last block's two-word read window stays inside its row. The packing is a pure bit
reordering: :func:`unpack` returns the canonical :class:`QuantizedWeight` bit for bit.

Beside the words the record carries what the kernels need per row, already narrowed for the device:
``row_scales`` (f32), ``row_centroids`` (f32 [d_out, 2], one gain pair per row so that matrices
sharing an input concatenate by rows, docs/kernels.md) and the unquantized ``tail`` (f32). The exact f64
scales and centroids are kept beside them so the round trip is lossless.

The fields and methods both Tetra layouts share live on :class:`TetraRecord`; the served
``tetra64`` form of the same matrix is a type of its own (``tetra64.Tetra64Weight``). Every record
type names its layout in the class attribute ``layout``, which is what consumers dispatch on.

This module does not decode words (that needs the Tetra tables: ``leechq.kernels.reference``) and does
not know about devices beyond ``Tensor.to``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.formats.rotation import RotationTables

NAME = "tetra48"
WORD_BYTES = 6
LABEL_BITS = 47
LABEL_MASK = (1 << LABEL_BITS) - 1


def stride_u32(n_blocks: int) -> int:
    """u32 words per packed row: ``ceil(6·n_blocks / 8) · 2`` (rows padded to 8 bytes)."""
    return -(-WORD_BYTES * n_blocks // 8) * 2


@dataclass(frozen=True)
class TetraRecord:
    """A Tetra-coded matrix packed for the kernels: what every Tetra layout carries.

    The subclasses differ only in how ``words`` holds the codes (their ``layout`` and ``stride``):
    :class:`Tetra48Weight` (this module) and ``tetra64.Tetra64Weight``.

    Attributes:
        d_out: rows.
        d_in: columns; ``n_blocks = d_in // 24`` coded blocks then ``d_in % 24`` tail columns.
        words: int32 [d_out, stride], the packed codes of each row (the subclass's layout).
        row_scales: float32 [d_out], σ_row as the kernels read it.
        row_centroids: float32 [d_out, 2], the gain pair of each row's matrix.
        tail: float32 [d_out, d_in % 24], unquantized tail columns (rotated basis).
        row_scales_f64: float64 [d_out], exact σ_row (for the lossless round trip).
        row_centroids_f64: float64 [d_out, 2], exact gain pairs.
        n_centroids: stored centroids of the source matrix (1 or 2); 1 means the pair repeats.
        rotation: the input rotation the activation must receive, or None.
    """

    layout: ClassVar[str] = ""

    d_out: int
    d_in: int
    words: torch.Tensor
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
        """u32 words per row (the subclass's layout)."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        return self.words.device

    def validate(self) -> None:
        """Check every tensor's shape and dtype; raise :class:`InvalidInput` naming it."""
        expect = {
            "words": ((self.d_out, self.stride), torch.int32),
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
                    f"{type(self).__name__}.{name}: expected {dtype} {list(shape)}, got {t.dtype} "
                    f"{list(t.shape)}"
                )

    def to(self, device: torch.device | str) -> TetraRecord:
        """A copy with the kernel tensors on ``device`` (the f64 originals stay on the host)."""
        return replace(
            self,
            words=self.words.to(device).contiguous(),
            row_scales=self.row_scales.to(device).contiguous(),
            row_centroids=self.row_centroids.to(device).contiguous(),
            tail=self.tail.to(device).contiguous(),
        )

    def kernel_bytes(self) -> int:
        """Bytes a matvec streams: words (with row padding), f32 scale, f32 centroid pair, f32 tail."""
        return 4 * (self.words.numel() + self.row_scales.numel() + self.row_centroids.numel()
                    + self.tail.numel())


@dataclass(frozen=True)
class Tetra48Weight(TetraRecord):
    """A Tetra-coded matrix in the served ``tetra48`` layout: ``words`` int32
    [d_out, stride_u32(n_blocks)], the little-endian u32 view of each padded row of 6-byte words
    (fields: :class:`TetraRecord`)."""

    layout: ClassVar[str] = NAME

    @property
    def stride(self) -> int:
        """u32 words per row: :func:`stride_u32`."""
        return stride_u32(self.n_blocks)


def words_from_codes(labels: np.ndarray, gains: np.ndarray) -> np.ndarray:
    """Pack labels/gains into row-strided little-endian rows.

    Args:
        labels: uint64/int64 [d_out, n_blocks], each < 2**47.
        gains: [d_out, n_blocks] in {0, 1}.

    Returns:
        uint32 [d_out, stride_u32(n_blocks)].
    """
    labels = np.asarray(labels).astype(np.uint64)
    gains = np.asarray(gains).astype(np.uint64)
    d_out, nb = labels.shape
    if labels.size and int(labels.max()) > LABEL_MASK:
        raise InvalidInput("tetra48: a label needs more than 47 bits")
    if gains.size and int(gains.max()) > 1:
        raise InvalidInput("tetra48: a gain index above 1 (the word holds one gain bit)")
    word = labels | (gains << np.uint64(LABEL_BITS))
    le = word.astype("<u8").view(np.uint8).reshape(d_out, nb, 8)[:, :, :WORD_BYTES]
    rows = np.zeros((d_out, stride_u32(nb) * 4), dtype=np.uint8)
    rows[:, : WORD_BYTES * nb] = le.reshape(d_out, WORD_BYTES * nb)
    return rows.view("<u4").reshape(d_out, stride_u32(nb))


def codes_from_words(words: np.ndarray, n_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`words_from_codes`: (labels int64 [d_out, n_blocks], gains uint8)."""
    words = np.ascontiguousarray(np.asarray(words).astype("<u4", copy=False))
    d_out = words.shape[0]
    raw = words.view(np.uint8).reshape(d_out, -1)[:, : WORD_BYTES * n_blocks]
    padded = np.zeros((d_out, n_blocks, 8), dtype=np.uint8)
    padded[:, :, :WORD_BYTES] = raw.reshape(d_out, n_blocks, WORD_BYTES)
    word = padded.view("<u8").reshape(d_out, n_blocks)
    labels = (word & np.uint64(LABEL_MASK)).astype(np.int64)
    gains = (word >> np.uint64(LABEL_BITS)).astype(np.uint8)
    return labels, gains


def pack(qw: QuantizedWeight) -> Tetra48Weight:
    """Repack a canonical Tetra-coded matrix into the served ``tetra48`` layout.

    Raises:
        InvalidInput: the matrix is not Tetra-coded, or has more than two gain centroids.
    """
    if qw.codebook != "tetra":
        raise InvalidInput(f"tetra48 packs Tetra-coded matrices, got codebook {qw.codebook!r}")
    n_c = qw.centroids.numel()
    if n_c > 2:
        raise UnsupportedShape(f"tetra48 holds one gain bit; this matrix has {n_c} centroids")
    words = words_from_codes(qw.labels.numpy(), qw.gains.numpy())
    pair = qw.centroids.repeat(2)[:2] if n_c == 1 else qw.centroids
    cent64 = pair.to(torch.float64).expand(qw.d_out, 2).contiguous()
    out = Tetra48Weight(
        d_out=qw.d_out,
        d_in=qw.d_in,
        words=torch.from_numpy(words.view(np.int32).copy()),
        row_scales=qw.row_scales.to(torch.float32),
        row_centroids=cent64.to(torch.float32),
        tail=qw.tail.clone(),
        row_scales_f64=qw.row_scales.clone(),
        row_centroids_f64=cent64,
        n_centroids=n_c,
        rotation=qw.rotation,
    )
    out.validate()
    return out


def unpack(w: Tetra48Weight) -> QuantizedWeight:
    """The canonical matrix back from a (single-matrix) ``tetra48`` record, bit for bit.

    Raises:
        InvalidInput: the record is not a ``tetra48`` one, or concatenates matrices with
            different gain pairs.
    """
    _expect(w, Tetra48Weight, "unpack")
    cents = w.row_centroids_f64.cpu()
    if w.d_out and not bool((cents == cents[0]).all()):
        raise InvalidInput("tetra48.unpack: rows carry different centroid pairs (a fused record)")
    labels, gains = codes_from_words(w.words.cpu().numpy().view(np.uint32), w.n_blocks)
    centroids = cents[0, : w.n_centroids].clone() if w.d_out else torch.zeros(w.n_centroids)
    return QuantizedWeight(
        codebook="tetra",
        d_out=w.d_out,
        d_in=w.d_in,
        labels=torch.from_numpy(labels),
        gains=torch.from_numpy(gains),
        row_scales=w.row_scales_f64.cpu().clone(),
        centroids=centroids.to(torch.float64),
        tail=w.tail.cpu().clone(),
        rotation=w.rotation,
    )


def _expect(w: object, cls: type[TetraRecord], what: str) -> None:
    """Raise :class:`InvalidInput` unless ``w`` is a ``cls`` record (naming both layouts)."""
    if type(w) is not cls:
        got = getattr(w, "layout", "") or type(w).__name__
        raise InvalidInput(f"{cls.layout}.{what}: expected a {cls.layout} record "
                           f"({cls.__name__}), got {got}")


def concat_rows(parts: Sequence[Tetra48Weight]) -> Tetra48Weight:
    """Concatenate matrices that read the same input (q/k/v, gate/up) into one record by rows.

    Row strides, tails and the per-row gain pairs concatenate without re-encoding (docs/kernels.md).

    Raises:
        InvalidInput: the parts are not all ``tetra48`` records, differ in ``d_in`` or in rotation.
    """
    return concat_records(parts, Tetra48Weight)


def concat_records(parts: Sequence[TetraRecord], cls: type[TetraRecord]) -> TetraRecord:
    """:func:`concat_rows` for the Tetra layout of ``cls`` (every part must be a ``cls``)."""
    if not parts:
        raise InvalidInput("concat_rows needs at least one matrix")
    for p in parts:
        _expect(p, cls, "concat_rows")
    d_in = parts[0].d_in
    for p in parts:
        if p.d_in != d_in:
            raise InvalidInput(f"concat_rows: d_in {p.d_in} != {d_in}; fused matrices share an input")
        if (p.rotation is None) != (parts[0].rotation is None) or (
            p.rotation is not None and parts[0].rotation is not None
            and p.rotation.seed != parts[0].rotation.seed
        ):
            raise InvalidInput("concat_rows: fused matrices must share one input rotation")
    cat = lambda name: torch.cat([getattr(p, name) for p in parts], dim=0)  # noqa: E731
    out = cls(
        d_out=sum(p.d_out for p in parts),
        d_in=d_in,
        words=cat("words"),
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


def random_tetra48(
    d_out: int, d_in: int, *, seed: int = 0, device: torch.device | str = "cpu"
) -> Tetra48Weight:
    """A random ``tetra48`` record (every 48-bit word is a legal Tetra word, docs/kernels.md).

    Row scales are drawn in [0.5, 1.5), the gain pair is (0.8, 1.2), the tail is Gaussian. Used by
    tests and benchmarks; the tensors are generated on ``device`` directly (large shapes).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    nb = d_in // BLOCK
    stride = stride_u32(nb)
    words = torch.randint(
        -(2**31), 2**31, (d_out, stride), dtype=torch.int64, generator=g, device=device
    ).to(torch.int32)
    # Zero the padding bytes so the record is canonical.
    col_byte = torch.arange(stride, device=device) * 4
    keep_bytes = (WORD_BYTES * nb - col_byte).clamp(0, 4)
    mask = torch.where(keep_bytes >= 4, -1, (1 << (8 * keep_bytes)) - 1).to(torch.int64)
    words = (words.to(torch.int64) & mask).to(torch.int32)
    scales = torch.rand(d_out, generator=g, device=device, dtype=torch.float64) + 0.5
    cents = torch.tensor([0.8, 1.2], dtype=torch.float64, device=device).expand(d_out, 2).contiguous()
    tail = torch.randn(d_out, d_in % BLOCK, generator=g, device=device, dtype=torch.float32)
    return Tetra48Weight(
        d_out=d_out,
        d_in=d_in,
        words=words.contiguous(),
        row_scales=scales.to(torch.float32),
        row_centroids=cents.to(torch.float32),
        tail=tail,
        row_scales_f64=scales.cpu(),
        row_centroids_f64=cents.cpu(),
        n_centroids=2,
    )
