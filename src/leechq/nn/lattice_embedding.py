"""A token embedding coded on the lattice: ids → rows decoded from the codes, never a dense table.

For ``leechq.load`` and serving. A :class:`LatticeEmbedding` holds the table's record in its
codebook's served layout (``tetra48`` words for Tetra, ``planes14`` records for the ball codebook:
6 or 14 bytes per 24-value block) with the exact float64 row scales and gain centroids, the tail
columns and the rotation's tables, as buffers on its device. A lookup gathers the rows' codes and
decodes them with torch operations on that device — the codebook's decoder (Tetra) or the class
table (Planes14), the block scale ``c_g · s_row / √‖y‖²`` in float64 with the correctly rounded
square root from a table of the shells, the tail, the inverse rotation in float64 — then narrows to
float32 once and casts to the activation dtype: each row equals the same row of
:meth:`QuantizedWeight.dequantize` bit for bit, on every device. Nothing syncs with the host, so a
lookup can run inside a CUDA graph (after one call outside it, which builds the decoder's device
tables).

What this module does not do: encode (``leechq.quant.embedding``), read artifacts
(``leechq.formats.artifact``) or decide which table is coded (``leechq.models.load``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from leechq.errors import InvalidInput
from leechq.formats.quantized_weight import QuantizedWeight, rotated_rows
from leechq.formats.rotation import RotationTables, rotation_transpose_with
from leechq.nn.embedding import ScaledLookup
from leechq.nn.linear import Execution

MAX_SHELL = 64
"""Shells ``m`` (``‖y‖² = 16 m``) the square-root table covers; Tetra's and the ball's points lie
on shells up to 12."""


class LatticeEmbedding(ScaledLookup):
    """A lattice-coded token embedding: ids int [...] → [..., dim] (activation dtype).

    Build with :meth:`from_record`, then :meth:`finalize` once (``.to(device)`` afterwards moves
    the buffers and re-finalizes; a dtype cast of the module changes the output dtype only). Its
    ``state_dict`` holds the canonical record's tensors, as the artifact stores them.

    Attributes:
        codebook: "tetra" or "ball".
        num_embeddings, embedding_dim: the table's shape (vocabulary rows, dim).
        codes: int32 [vocab, stride], the rows' codes in the served layout (``tetra48`` words or
            ``planes14`` records).
        row_scales: float64 [vocab]; centroids: float64 [n_centroids] (ascending); tail: float32
            [vocab, dim mod 24] (rotated basis); signs, small: float64 rotation tables (or empty
            when the table was coded unrotated); roots: float64 [MAX_SHELL + 1], ``√(16 m)``.
        embed_scale: factor on every looked-up row (Gemma's √dim; 1.0: none), rounded to the
            output dtype and multiplied as transformers does. Not part of the table.
        execution: how ``forward`` computes once finalized (None before).
    """

    def __init__(self, record: QuantizedWeight, embed_scale: float = 1.0) -> None:
        super().__init__(embed_scale)
        if not isinstance(record, QuantizedWeight):
            raise InvalidInput(f"LatticeEmbedding needs a QuantizedWeight, got "
                               f"{type(record).__name__}")
        if record.codebook not in ("tetra", "ball"):
            raise InvalidInput(f"LatticeEmbedding decodes Tetra or ball codes, got codebook "
                               f"{record.codebook!r}")
        if record.centroids.numel() > 2:
            raise InvalidInput(f"LatticeEmbedding holds one gain bit (two centroids), got "
                               f"{record.centroids.numel()} centroids")
        self.codebook = record.codebook
        self.num_embeddings = record.d_out
        self.embedding_dim = record.d_in
        self.n_blocks = record.n_blocks
        self.seed = record.rotation.seed if record.rotation is not None else None
        self._n_centroids = int(record.centroids.numel())
        if self.codebook == "tetra":
            from leechq.formats.layouts.tetra48 import pack

            codes = pack(record).words
        else:
            from leechq.formats.layouts.planes14 import pack as pack14

            codes = pack14(record).records
        rot = record.rotation
        signs = torch.from_numpy(rot.signs.copy()) if rot is not None else torch.zeros(0)
        small = torch.from_numpy(rot.small.copy()) if rot is not None else torch.zeros(0, 0)
        roots = torch.tensor([math.sqrt(16 * m) for m in range(MAX_SHELL + 1)],
                             dtype=torch.float64)
        for name, t in (("codes", codes), ("row_scales", record.row_scales),
                        ("centroids", record.centroids), ("tail", record.tail),
                        ("signs", signs.to(torch.float64)), ("small", small.to(torch.float64)),
                        ("roots", roots)):
            self.register_buffer(name, t.detach().contiguous().clone())
        self._class_tables: tuple[torch.Tensor, torch.Tensor] | None = None
        self._canonical: dict[str, torch.Tensor] | None = None  # state_dict's tensors, once built

    @classmethod
    def from_record(cls, record: QuantizedWeight, embed_scale: float = 1.0) -> LatticeEmbedding:
        """A module over ``record`` (vocabulary rows × dim; its tensors are copied)."""
        return cls(record, embed_scale)

    def _device(self) -> torch.device:
        return self.codes.device

    def packed_bytes(self) -> int:
        """Bytes the module holds on its device (codes, scales, tail and tables)."""
        return sum(b.numel() * b.element_size() for b in self.buffers())

    # ------------------------------------------------------------------ the record

    def record(self) -> QuantizedWeight:
        """The canonical record back (CPU tensors), bit for bit the one it was built from."""
        rotation = None
        if self.seed is not None:
            rotation = RotationTables(n=self.embedding_dim, seed=self.seed,
                                      signs=self.signs.cpu().numpy().copy(),
                                      small=self.small.cpu().numpy().copy())
        cent = self.centroids.cpu()
        pair = cent.repeat(2)[:2] if cent.numel() == 1 else cent
        common = dict(d_out=self.num_embeddings, d_in=self.embedding_dim,
                      row_scales=self.row_scales.cpu().to(torch.float32),
                      row_centroids=pair.expand(self.num_embeddings, 2).to(torch.float32),
                      tail=self.tail.cpu(), row_scales_f64=self.row_scales.cpu(),
                      row_centroids_f64=pair.expand(self.num_embeddings, 2).contiguous(),
                      n_centroids=self._n_centroids, rotation=rotation)
        if self.codebook == "tetra":
            from leechq.formats.layouts.tetra48 import Tetra48Weight, unpack

            return unpack(Tetra48Weight(words=self.codes.cpu(), **common))
        from leechq.formats.layouts.planes14 import Planes14Weight
        from leechq.formats.layouts.planes14 import unpack as unpack14

        return unpack14(Planes14Weight(records=self.codes.cpu(), **common))

    # ------------------------------------------------------------------ decode

    def dequantize_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (int64 [T], on the module's device, in range) of the table: float32
        [T, dim], each equal to that row of :meth:`QuantizedWeight.dequantize`."""
        from leechq.kernels import reference

        codes = self.codes.index_select(0, ids)
        if self.codebook == "tetra":
            from leechq.codebooks.tetra import decode

            labels, gains = reference.tetra48_word_codes(codes, self.n_blocks)
            pts = decode(labels, validate=False).to(torch.float64)
            n2 = (pts * pts).sum(-1)
        else:
            if self._class_tables is None or self._class_tables[0].device != codes.device:
                self._class_tables = reference.planes14_class_tables(codes.device)
            pts, gains, n2 = reference.planes14_record_points(codes, self.n_blocks,
                                                              self._class_tables)
        shell = torch.clamp((n2 / 16).to(torch.int64), 0, MAX_SHELL)
        out = rotated_rows(pts, gains, self.roots[shell], self.row_scales.index_select(0, ids),
                           self.centroids, self.tail.index_select(0, ids))
        if self.seed is not None:
            out = rotation_transpose_with(out, self.signs, self.small)
        return out.to(torch.float32)

    # ------------------------------------------------------------------ finalize

    def finalize(self, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32, *, prefer: str = "auto") -> Execution:
        """Put the buffers on ``device`` and fix the output ``dtype`` (float32, float16 or
        bfloat16). Every preference runs the same torch decode (there is no fused kernel for a
        lattice lookup); ``prefer`` is kept for :meth:`to`. Returns the :class:`Execution`."""
        device = self._finalize_device(device, dtype, prefer, "LatticeEmbedding")
        self._prefer = prefer
        self.execution = Execution("reference", str(device), dtype,
                                   kernel=f"torch-lattice-{self.codebook}-embedding")
        self._out_scale = self._rounded_scale()
        if self.num_embeddings:  # builds the decoder's tables on the device now, so that the
            # first lookup inside a CUDA graph capture copies nothing from the host
            self.dequantize_rows(torch.zeros(1, dtype=torch.int64, device=device))
        return self.execution

    # ------------------------------------------------------------------ serialization

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        # The canonical record is what the module serializes, never its served buffers: the
        # tensors the artifact holds under the module's name (``codes``, ``row_scales``,
        # ``centroids``, ``tail``), so save → load is byte-identical. The rotation tables are
        # shared artifact tensors (``leechq.nn.records.rotation_tensors``), not included.
        if self._canonical is None:
            from leechq.nn.records import record_tensors

            self._canonical = record_tensors(self.record())
        for name, tensor in self._canonical.items():
            destination[prefix + name] = tensor

    # ------------------------------------------------------------------ forward

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the table times ``embed_scale``: ids int32/int64 [...] → [..., dim] of the
        finalize dtype. Out-of-range ids raise :class:`InvalidInput` on the CPU; on an accelerator
        they are not checked (no host sync), as in ``torch.nn.functional.embedding``."""
        flat = self._flat_ids(ids)
        if self.execution is None:
            raise RuntimeError("LatticeEmbedding was never finalized: call finalize(device, "
                               "dtype) (leechq.load does it on load)")
        flat = flat.to(device=self.codes.device, dtype=torch.int64)
        if flat.device.type == "cpu" and flat.numel() and (
                int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            bad = int(flat.min()) if int(flat.min()) < 0 else int(flat.max())
            raise InvalidInput(f"token id {bad} outside the embedding's "
                               f"{self.num_embeddings} rows")
        rows = self._scaled(self.dequantize_rows(flat).to(self.execution.dtype))
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        path = self.execution.path if self.execution is not None else "unfinalized"
        scale = f", embed_scale={self.embed_scale:g}" if self.embed_scale != 1.0 else ""
        return (f"{self.num_embeddings}, {self.embedding_dim}, codebook={self.codebook}"
                f"{scale}, path={path}")
