"""Packed 4/8-bit token embedding and output head: the tables stay group-affine on the device.

For ``leechq.load``, transformers and serving. A :class:`PackedEmbedding` holds one group-affine
table — ``qweight`` uint8 [vocab, dim/2] (4 bits, low nibble = even column) or [vocab, dim]
(8 bits), f16 ``scales`` and ``biases`` [vocab, ceil(dim/group)] — as buffers on its device, and
never a dense copy of it. A :class:`PackedHead` computes logits from a table: the embedding's own
(a tied head: the very same module and buffers, no second copy) or one of its own (an untied
4/8-bit ``lm_head``). Under ``torch.compile`` every lookup and the Triton matvec are opaque custom
ops (:mod:`leechq.nn.custom_ops`).

Execution, fixed once by ``finalize(device, dtype, prefer)`` (rule A4, as
:class:`leechq.nn.linear.LeechqLinear`):

* embedding rows: the Triton gather (:func:`leechq.kernels.triton.ops.int4_embedding` /
  ``int8_embedding``) on CUDA, else the reference twin (:mod:`leechq.kernels.reference`) on the
  CPU, or the same exact arithmetic without a host sync on another device. Every path applies the
  table's rule ``f32(scale)·f32(q) + f32(bias)`` (two roundings) and then casts once to the
  activation dtype, so a lookup equals the dequantized dense table's row bit for bit;
* head: the Triton int4/int8 matvec for 1..8 activation rows (the decode step); more rows (a
  prefill) and the reference path dequantize the table ``chunk_rows`` vocabulary rows at a time
  and multiply each chunk in the activation dtype, so no dense [vocab, dim] table is ever held.

What this module does not do: read artifacts (``leechq.formats.artifact``), decide which tables are
packed (``leechq.models.load``), or write them back (``leechq.models.save`` uses
:meth:`PackedEmbedding.to_group_affine`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.int8_weight import Int8Weight
from leechq.formats.quantized_weight import Int4Weight
from leechq.nn import custom_ops
from leechq.nn.linear import Execution, ReferencePathWarning

Table = Int4Weight | Int8Weight
"""A packed table as the kernels take it (``d_out`` = vocabulary rows, ``d_in`` = dim)."""

CHUNK_ELEMENTS = 1 << 24
"""Dequantized elements per head chunk (64 MiB of float32): bounds the transient memory of the
chunked head path."""

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_PREFERS = ("auto", "reference", "fused")


def _check_finalize_args(dtype: torch.dtype, prefer: str, what: str) -> None:
    if dtype not in _DTYPES:
        raise InvalidInput(f"{what} serves float32/float16/bfloat16, not {dtype}")
    if prefer not in _PREFERS:
        raise InvalidInput(f"prefer must be 'auto', 'reference' or 'fused', got {prefer!r}")


def _cast_dtype(fn: Any, dtype: torch.dtype) -> torch.dtype:
    """The serving dtype after ``Module._apply(fn)``: what ``fn`` makes of a ``dtype`` tensor when
    that is a serving dtype (``model.half()``, ``model.to(torch.bfloat16)``), else ``dtype``."""
    cast = fn(torch.empty(0, dtype=dtype)).dtype
    return cast if cast in _DTYPES else dtype


def _target_device(device: torch.device | str | None, current: torch.device) -> torch.device:
    """``device`` (default ``current``) with a CUDA index made explicit, so that it compares equal
    to the device a tensor reports."""
    dev = torch.device(device) if device is not None else current
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _select(request: Any, prefer: str) -> tuple[Any, str | None]:
    """(Triton kernel class or None for the reference path, why no kernel when one was wanted).

    CPU + "auto" and "reference" take the reference path; "fused" insists on a Triton kernel (on
    the CPU only under ``TRITON_INTERPRET=1``) and raises :class:`KernelUnavailable` otherwise.
    """
    from leechq.kernels.select import choose

    if prefer == "reference" or (prefer == "auto" and request.device.type == "cpu"):
        return None, None
    try:
        return choose(request, "triton"), None
    except KernelUnavailable as exc:
        if prefer == "fused":
            raise
        return None, str(exc)


class ScaledLookup(nn.Module):
    """What the token-embedding modules share (:class:`PackedEmbedding`,
    :class:`~leechq.nn.lattice_embedding.LatticeEmbedding`): the preference of the last
    ``finalize``, the ``embed_scale`` factor rounded to the output dtype, the token-id check, and a
    dtype cast (``model.half()``) that changes only the output dtype — the buffers named by
    :attr:`KEPT_DTYPES` (all floating ones when None) keep theirs — and re-finalizes a finalized
    module on its (new) device. A subclass sets ``execution`` in ``finalize`` and names its
    device by :meth:`_device`."""

    KEPT_DTYPES: tuple[str, ...] | None = None

    def __init__(self, embed_scale: float = 1.0) -> None:
        super().__init__()
        self._embed_scale = float(embed_scale)
        self._out_scale = self._embed_scale  # rounded to the output dtype by finalize
        self.execution: Execution | None = None
        self._prefer = "auto"

    @property
    def prefer(self) -> str:
        """The kernel preference of the last :meth:`finalize` ("auto" before any)."""
        return self._prefer

    @property
    def embed_scale(self) -> float:
        """The factor on every looked-up row (1.0: none)."""
        return self._embed_scale

    @embed_scale.setter
    def embed_scale(self, value: float) -> None:
        self._embed_scale = float(value)
        self._out_scale = self._rounded_scale()

    def _rounded_scale(self) -> float:
        """``embed_scale`` rounded to the output dtype (a plain float: no tensor in forward)."""
        if self.execution is None or self._embed_scale == 1.0:
            return self._embed_scale
        return float(torch.tensor(self._embed_scale, dtype=self.execution.dtype))

    def _flat_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` flattened, or :class:`InvalidInput` unless an int32/int64 tensor."""
        if not isinstance(ids, torch.Tensor) or ids.dtype not in (torch.int32, torch.int64):
            got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise InvalidInput(f"{type(self).__name__} takes int32/int64 token ids, got {got}")
        return ids.reshape(-1)

    def _scaled(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows`` times the factor rounded to the output dtype, as transformers scales them."""
        return rows * self._out_scale if self._out_scale != 1.0 else rows

    def _device(self) -> torch.device:
        raise NotImplementedError

    def finalize(self, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32, *, prefer: str = "auto") -> Execution:
        raise NotImplementedError

    def _finalize_device(self, device: torch.device | str | None, dtype: torch.dtype,
                         prefer: str, what: str) -> torch.device:
        """The first steps of a subclass's ``finalize``: check ``dtype`` and ``prefer`` (errors
        naming the class ``what``), resolve ``device`` (default: :meth:`_device`, a CUDA index made
        explicit), refuse the meta device, and move the module's buffers there when they are
        elsewhere (``execution`` cleared first, so that :meth:`_apply` does not re-finalize on the
        way). Returns the resolved device."""
        _check_finalize_args(dtype, prefer, what)
        device = _target_device(device, self._device())
        if device.type == "meta":
            raise InvalidInput(f"{what}.finalize: cannot finalize on the meta device")
        if self._device() != device:
            self.execution = None  # _apply must not re-finalize on the way
            super().to(device)
        return device

    def _apply(self, fn: Any, recurse: bool = True) -> ScaledLookup:
        names = self.KEPT_DTYPES
        kept = {n: b for n, b in self._buffers.items() if b is not None
                and (n in names if names is not None else b.is_floating_point())}
        super()._apply(fn, recurse)
        for n, old in kept.items():
            new = self._buffers[n]
            if new is not None and new.dtype != old.dtype:
                self._buffers[n] = old.to(new.device)
        if self.execution is not None:  # moved: the lookups must read the moved tensors
            self.finalize(self._device(), _cast_dtype(fn, self.execution.dtype),
                          prefer=self._prefer)
        return self


class PackedEmbedding(ScaledLookup):
    """A token embedding whose table stays packed: ids int [...] → [..., dim] (activation dtype).

    Build with :meth:`from_group_affine` or :meth:`from_table`, then :meth:`finalize` once on the
    device (``.to(device)`` after finalize re-finalizes on the new device with the same preference;
    a dtype cast of the module changes the output dtype and leaves the f16 scales and biases
    untouched).

    Attributes:
        bits: 4 or 8.
        num_embeddings, embedding_dim: the table's shape (vocabulary rows, dim).
        group: columns per scale/bias group.
        qweight: uint8 buffer [vocab, dim·bits/8]; scales, biases: float16 buffers [vocab, groups].
        embed_scale: factor on every looked-up row (1.0: none). A module that replaces a scaled
            word embedding (Gemma's √dim) carries the factor it applied; ``forward`` rounds it to
            the output dtype and multiplies, as transformers does. Not part of the table (not
            saved); the tied :class:`PackedHead` reads the unscaled table.
        execution: how ``forward`` computes once finalized (None before).
    """

    KEPT_DTYPES = ("scales", "biases")  # f16: a bf16 cast would change them

    def __init__(self, bits: int, num_embeddings: int, embedding_dim: int, group: int,
                 qweight: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                 embed_scale: float = 1.0) -> None:
        super().__init__(embed_scale)
        if bits not in (4, 8):
            raise InvalidInput(f"a packed table has 4 or 8 bits, got {bits}")
        self.bits = int(bits)
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.group = int(group)
        # The kernels' record classes validate every shape and dtype (and name the bad tensor).
        self._make_table(qweight, scales, biases)
        self.register_buffer("qweight", qweight.detach().contiguous())
        self.register_buffer("scales", scales.detach().contiguous())
        self.register_buffer("biases", biases.detach().contiguous())
        self._lookup: Callable[[torch.Tensor], torch.Tensor] = self._unfinalized
        self._key = 0  # the lookup's custom-op key (leechq.nn.custom_ops), set by finalize

    def _device(self) -> torch.device:
        return self.qweight.device

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_table(cls, table: Table) -> PackedEmbedding:
        """A module over an :class:`Int4Weight` or :class:`Int8Weight` [vocab, dim] (tensors
        kept)."""
        if isinstance(table, Int4Weight):
            bits = 4
        elif isinstance(table, Int8Weight):
            bits = 8
        else:
            raise InvalidInput(
                f"PackedEmbedding needs an Int4Weight or Int8Weight, got {type(table)}")
        return cls(bits, table.d_out, table.d_in, table.group, table.qweight, table.scales,
                   table.biases)

    @classmethod
    def from_group_affine(cls, ga: Any) -> PackedEmbedding:
        """A module over a 2-D :class:`leechq.formats.artifact.GroupAffine` (an artifact's table).

        Raises:
            InvalidInput: the tensor is not 2-D, or its parts have the wrong shapes or dtypes.
        """
        if len(ga.dims) != 2:
            raise InvalidInput(f"a packed embedding table is 2-D, got dims {list(ga.dims)}")
        return cls(ga.bits, ga.dims[0], ga.dims[1], ga.group, ga.qweight, ga.scales, ga.biases)

    def _make_table(self, qweight: torch.Tensor, scales: torch.Tensor,
                    biases: torch.Tensor) -> Table:
        kind = Int4Weight if self.bits == 4 else Int8Weight
        return kind(self.num_embeddings, self.embedding_dim, qweight, scales, biases, self.group)

    def table(self) -> Table:
        """The table as the kernels take it, over the module's current buffers (no copy)."""
        return self._make_table(self.qweight, self.scales, self.biases)

    def to_group_affine(self) -> Any:
        """The table as an artifact tensor: a :class:`GroupAffine` of CPU tensors (for saving)."""
        from leechq.formats.artifact import GroupAffine

        return GroupAffine((self.num_embeddings, self.embedding_dim), self.bits, self.group,
                           self.qweight.cpu(), self.scales.cpu(), self.biases.cpu())

    # ------------------------------------------------------------------ memory

    def packed_bytes(self) -> int:
        """Bytes the table holds on its device (codes + f16 scales + f16 biases)."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.biases))

    def dense_bytes(self, dtype: torch.dtype = torch.bfloat16) -> int:
        """Bytes a dense [vocab, dim] table of ``dtype`` would hold (what packing saves)."""
        size = torch.empty((), dtype=dtype).element_size()
        return self.num_embeddings * self.embedding_dim * size

    # ------------------------------------------------------------------ exact dequantization

    def dequantize_rows(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows ``start:stop`` of the table, dequantized exactly: float32 [stop-start, dim].

        ``f32(scale)·f32(q) + f32(bias)`` with two roundings (separate multiply and add), on the
        table's device, bit-identical to :meth:`GroupAffine.dequantize`.
        """
        stop = self.num_embeddings if stop is None else stop
        return self._dequantize(self.qweight[start:stop], self.scales[start:stop],
                                self.biases[start:stop])

    def _dequantize(self, q: torch.Tensor, s: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.bits == 4:
            q = torch.stack((q & 0x0F, q >> 4), dim=-1).reshape(q.shape[0], self.embedding_dim)
        col_group = torch.arange(self.embedding_dim, device=q.device) // self.group
        prod = s.to(torch.float32)[:, col_group] * q.to(torch.float32)  # rounded before the add
        return prod + b.to(torch.float32)[:, col_group]

    # ------------------------------------------------------------------ finalize

    def finalize(self, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32, *, prefer: str = "auto") -> Execution:
        """Choose how ``forward`` computes on ``device`` (moving the table there).

        Args:
            device: target device (default: where the table is).
            dtype: the output (activation) dtype: float32, float16 or bfloat16.
            prefer: "auto" (the Triton gather on an accelerator when it can run, the reference
                otherwise, with a :class:`ReferencePathWarning` on an accelerator; reference on
                the CPU), "reference", or "fused" (Triton or :class:`KernelUnavailable`; on the
                CPU only under ``TRITON_INTERPRET=1``).

        Returns:
            The :class:`Execution` (path "fused" or "reference").
        """
        from leechq.kernels.select import Request

        device = self._finalize_device(device, dtype, prefer, "PackedEmbedding")
        layout = f"int{self.bits}"
        kernel, reason = _select(Request(layout, 1, device, dtype, op="embedding",
                                         d_out=self.num_embeddings, d_in=self.embedding_dim,
                                         group=self.group), prefer)
        table = self.table()
        dim = self.embedding_dim
        if kernel is not None:
            fn = kernel.function(layout)
            self._lookup = lambda flat: fn(flat, table, out_dtype=dtype)
            name: str | None = kernel.name
        elif device.type == "cpu":
            from leechq.kernels import reference

            fn = reference.int4_embedding if self.bits == 4 else reference.int8_embedding
            self._lookup = lambda flat: fn(flat, table).to(dtype)
            name = f"reference-int{self.bits}-embedding"
        else:  # the twin's range check reads the ids on the host: no sync here (CUDA graphs)
            q, s, b = self.qweight, self.scales, self.biases
            self._lookup = lambda flat: self._dequantize(
                q.index_select(0, flat), s.index_select(0, flat), b.index_select(0, flat)
            ).to(dtype).reshape(-1, dim)
            name = f"torch-int{self.bits}-embedding"
        self._key = custom_ops.register(self._lookup)
        self._prefer = prefer
        path = "fused" if kernel is not None else "reference"
        self.execution = Execution(path, str(device), dtype, kernel=name, reason=reason)
        self._out_scale = self._rounded_scale()
        if reason is not None:
            warnings.warn(f"PackedEmbedding [{self.num_embeddings}x{dim}, int{self.bits}] on "
                          f"{device} runs the reference path: {reason}", ReferencePathWarning,
                          stacklevel=2)
        return self.execution

    # ------------------------------------------------------------------ forward

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the table times ``embed_scale``: ids int32/int64 [...] → [..., dim] of the
        finalize dtype.

        Out-of-range ids raise :class:`InvalidInput` on the CPU (reference twin); on an
        accelerator they are not checked (no host sync), as in ``torch.nn.functional.embedding``.
        """
        flat = self._flat_ids(ids).contiguous()
        if self.execution is None:
            return self._unfinalized(flat)
        rows = custom_ops.packed_embedding(flat, self._key, self.embedding_dim,
                                           self.execution.dtype)
        return self._scaled(rows).reshape(*ids.shape, self.embedding_dim)

    def _unfinalized(self, flat: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("PackedEmbedding was never finalized: call finalize(device, dtype) "
                           "(leechq.load does it on load)")

    def extra_repr(self) -> str:
        path = self.execution.path if self.execution is not None else "unfinalized"
        scale = f", embed_scale={self.embed_scale:g}" if self.embed_scale != 1.0 else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}, "
                f"group={self.group}{scale}, path={path}")


class PackedHead(nn.Module):
    """Logits from a packed table: x [..., dim] float → [..., vocab] of the finalize dtype.

    ``y = x Wᵀ`` with ``W`` the table's exact dequantization. The table is a submodule: for a
    tied head it *is* the input :class:`PackedEmbedding` (one set of buffers, moved once); an
    untied head owns its own.

    Attributes:
        table: the :class:`PackedEmbedding` whose table is the head matrix.
        tied: whether the table is the input embedding's.
        chunk_rows: vocabulary rows dequantized at a time on the chunked path.
        execution: how ``forward`` computes once finalized (None before).
    """

    def __init__(self, table: PackedEmbedding, tied: bool, chunk_rows: int | None = None) -> None:
        super().__init__()
        if not isinstance(table, PackedEmbedding):
            raise InvalidInput(f"PackedHead needs a PackedEmbedding, got {type(table).__name__}")
        self.table = table
        self.tied = bool(tied)
        self.chunk_rows = int(chunk_rows or max(1, CHUNK_ELEMENTS // table.embedding_dim))
        if self.chunk_rows < 1:
            raise InvalidInput(f"chunk_rows must be positive, got {chunk_rows}")
        self.in_features = table.embedding_dim
        self.out_features = table.num_embeddings
        self.execution: Execution | None = None
        self._prefer = "auto"
        self._matvec: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._key = 0  # the Triton matvec's custom-op key (0: none)
        self._max_rows = 0
        self._dtype = torch.float32

    @property
    def prefer(self) -> str:
        """The kernel preference of the last :meth:`finalize` ("auto" before any)."""
        return self._prefer

    @classmethod
    def tied_to(cls, embedding: PackedEmbedding, chunk_rows: int | None = None) -> PackedHead:
        """The head of a tied model: it reads ``embedding``'s table (no copy)."""
        return cls(embedding, tied=True, chunk_rows=chunk_rows)

    @classmethod
    def from_group_affine(cls, ga: Any, chunk_rows: int | None = None) -> PackedHead:
        """An untied head over its own 2-D :class:`GroupAffine` [vocab, dim]."""
        return cls(PackedEmbedding.from_group_affine(ga), tied=False, chunk_rows=chunk_rows)

    def packed_bytes(self) -> int:
        """Bytes of the head's table on its device (for a tied head: the embedding's, shared)."""
        return self.table.packed_bytes()

    def finalize(self, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32, *, prefer: str = "auto") -> Execution:
        """Choose how ``forward`` computes on ``device`` (moving an untied table there).

        Args:
            device: target device (default: where the table is). A tied head's table must
                already be there (the embedding is finalized first).
            dtype: activation and logits dtype.
            prefer: "auto" (the Triton matvec for ≤ 8 rows on an accelerator, chunked
                dequantize + matmul beyond; chunked on the CPU), "reference" (always chunked) or
                "fused" (the Triton matvec must be available, :class:`KernelUnavailable`
                otherwise; more than 8 rows still take the chunked path).

        Returns:
            The :class:`Execution` (path "fused" or "reference").
        """
        from leechq.kernels.select import MAX_TRITON_ROWS, Request

        _check_finalize_args(dtype, prefer, "PackedHead")
        t = self.table
        device = _target_device(device, t.qweight.device)
        if t.qweight.device != device:
            if self.tied:
                raise InvalidInput(f"a tied PackedHead reads the embedding's table, which is on "
                                   f"{t.qweight.device}, not {device}: move the embedding first")
            self.execution = None
            super().to(device)
        kernel, reason = _select(Request(f"int{t.bits}", 1, device, dtype,
                                         d_out=t.num_embeddings, d_in=t.embedding_dim,
                                         group=t.group), prefer)
        self._matvec = None
        self._key = 0
        self._max_rows = 0
        name = "chunked-dequantize-matmul"
        if kernel is not None:
            fn, table = kernel.function(f"int{t.bits}"), t.table()
            self._matvec = lambda x2: fn(x2, table).to(dtype)
            self._key = custom_ops.register(self._matvec)
            self._max_rows = MAX_TRITON_ROWS
            name = f"{kernel.name} (≤{MAX_TRITON_ROWS} rows; chunked beyond)"
        self._dtype = dtype
        self._prefer = prefer
        self.execution = Execution("fused" if kernel is not None else "reference", str(device),
                                   dtype, kernel=name, reason=reason)
        if reason is not None:
            warnings.warn(f"PackedHead [{t.num_embeddings}x{t.embedding_dim}, int{t.bits}] on "
                          f"{device} runs the chunked reference path: {reason}",
                          ReferencePathWarning, stacklevel=2)
        return self.execution

    def _apply(self, fn: Any, recurse: bool = True) -> PackedHead:
        super()._apply(fn, recurse)
        if self.execution is not None:
            self.finalize(self.table.qweight.device, _cast_dtype(fn, self.execution.dtype),
                          prefer=self._prefer)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``x Wᵀ``: x float [..., dim] → [..., vocab] of the finalize dtype."""
        if self.execution is None:
            raise RuntimeError("PackedHead was never finalized: call finalize(device, dtype) "
                               "(leechq.load does it on load)")
        if not x.is_floating_point() or x.shape[-1] != self.in_features:
            raise InvalidInput(f"PackedHead takes float [..., {self.in_features}], got "
                               f"{x.dtype} {list(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self._matvec is not None and 1 <= x2.shape[0] <= self._max_rows:
            y = custom_ops.fused_linear(x2.contiguous(), self._key, self.out_features, self._dtype)
        else:
            y = self._chunked(x2.to(self._dtype))
        return y.reshape(*lead, self.out_features)

    def _chunked(self, x2: torch.Tensor) -> torch.Tensor:
        """``x Wᵀ`` with ``W`` dequantized ``chunk_rows`` rows at a time (exact f32 rows cast to
        the activation dtype, as the dense table would be): [M, vocab]."""
        t = self.table
        y = torch.empty(x2.shape[0], t.num_embeddings, dtype=self._dtype, device=x2.device)
        for start in range(0, t.num_embeddings, self.chunk_rows):
            stop = min(start + self.chunk_rows, t.num_embeddings)
            w = t.dequantize_rows(start, stop).to(self._dtype)
            y[:, start:stop] = F.linear(x2, w)
        return y

    def extra_repr(self) -> str:
        path = self.execution.path if self.execution is not None else "unfinalized"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"tied={self.tied}, path={path}")
