"""Whole-model accounting of records that are still in memory (before an artifact is written).

Implements rule 2 of docs/format.md §4 ("whole-model b/param") for planning: the
full-model recipe chooses int4 matrices and table widths under a bits-per-parameter budget before
anything is on disk. The per-record rule is :func:`leechq.formats.artifact._record_bits` (reused,
not restated); raw tensors follow :func:`leechq.formats.artifact.artifact_report`'s rule (float
tensors at 16 bits, group-affine tables at their code bits plus f16 scale and offset per group).
A test pins :func:`whole_model_bits` to ``artifact_report``'s ``whole_model_bits_per_param`` on a
written artifact, so the two cannot drift apart. Kernel b/w and on-disk rate are not computed here:
they belong to the written file (``artifact_report``), and the three are never mixed
(docs/format.md §4).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from leechq.formats.artifact import GroupAffine, _record_bits
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight


@dataclass(frozen=True)
class ModelBits:
    """Served bits and parameters of a model held as records + raw tensors.

    Attributes:
        served_bits: every weight bit the served model keeps (rule 2).
        parameters: all parameters, embedding included, a tied head counted once.
        record_bits: the part of ``served_bits`` in quantized records.
        record_weights: weights in quantized records.
    """

    served_bits: float
    parameters: int
    record_bits: float
    record_weights: int

    @property
    def bits_per_param(self) -> float:
        """Whole-model bits per parameter."""
        return self.served_bits / max(1, self.parameters)


def record_served_bits(rec: QuantizedWeight | Int4Weight) -> float:
    """Served bits of one record (rule 2: payload, f16 tail, f32 row scales and centroids; int4
    with f16 scale and offset per group)."""
    label_bits = 0
    if isinstance(rec, QuantizedWeight):
        from leechq.codebooks import get

        label_bits = get(rec.codebook).label_bits
    return float(_record_bits(rec, label_bits)["served"])


def raw_served_bits(t: torch.Tensor | GroupAffine | QuantizedWeight) -> tuple[float, int]:
    """``(served bits, parameters)`` of one raw tensor (float at 16 bits, integers at their width,
    group-affine at its code bits plus 32 bits per group, a lattice-coded table at its record's
    served bits)."""
    if isinstance(t, QuantizedWeight):
        return record_served_bits(t), t.d_out * t.d_in
    if isinstance(t, GroupAffine):
        n = t.rows * t.cols
        return float(n * t.bits + 32 * t.scales.numel()), n
    bits = 16 if t.is_floating_point() else 8 * t.element_size()
    return float(t.numel() * bits), int(t.numel())


def whole_model_bits(
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, torch.Tensor | GroupAffine],
) -> ModelBits:
    """Rule-2 bits of a model given as records and raw tensors (tied aliases excluded from ``raw``).

    Returns:
        :class:`ModelBits`; ``bits_per_param`` equals the artifact's ``whole_model_bits_per_param``
        once written.
    """
    rec_bits = 0.0
    rec_weights = 0
    for rec in records.values():
        rec_bits += record_served_bits(rec)
        rec_weights += rec.d_out * rec.d_in
    raw_bits = 0.0
    raw_params = 0
    for t in raw.values():
        b, n = raw_served_bits(t)
        raw_bits += b
        raw_params += n
    return ModelBits(rec_bits + raw_bits, rec_weights + raw_params, rec_bits, rec_weights)
