"""The per-item accounting rules (formats/accounting.py), exact on hand-sized records and tensors.

The written-artifact report is exercised on a real artifact in ``test_artifact.py``
(``test_accounting_rates_are_separate``); its agreement with :func:`whole_model_bits` in
``tests/quant/test_recipe.py``.
"""

from __future__ import annotations

import torch

from leechq.formats.accounting import raw_served_bits, record_bits, whole_model_bits
from leechq.formats.group_affine import GroupAffine
from leechq.formats.quantized_weight import Int4Weight


def test_int4_record_bits_count_codes_and_one_scale_pair_per_group() -> None:
    rec = Int4Weight.quantize(torch.randn(3, 100), group=64)  # two groups a row, the second short
    b = record_bits(rec, label_bits=0)
    assert b == {"weights": 300, "code": 1200, "kernel": 1200 + 32 * 6,
                 "served": 1200 + 32 * 6, "stored": 1200 + 32 * 6}


def test_raw_tensors_count_floats_at_16_bits_and_integers_at_their_width() -> None:
    assert raw_served_bits(torch.zeros(5, 7, dtype=torch.float32)) == (16.0 * 35, 35)
    assert raw_served_bits(torch.zeros(5, 7, dtype=torch.bfloat16)) == (16.0 * 35, 35)
    assert raw_served_bits(torch.zeros(4, dtype=torch.int64)) == (64.0 * 4, 4)
    assert raw_served_bits(torch.zeros(4, dtype=torch.uint8)) == (8.0 * 4, 4)


def test_group_affine_tables_count_code_bits_and_one_scale_pair_per_group() -> None:
    table = GroupAffine.quantize(torch.randn(6, 130), bits=4, group=64)  # three groups a row
    assert raw_served_bits(table) == (6 * 130 * 4 + 32 * 6 * 3, 6 * 130)


def test_whole_model_bits_sums_records_and_raw_tensors() -> None:
    rec = Int4Weight.quantize(torch.randn(3, 100), group=64)
    bits = whole_model_bits({"a": rec}, {"norm": torch.ones(10)})
    assert bits.parameters == 310
    assert bits.record_weights == 300
    assert bits.served_bits == 1200 + 32 * 6 + 16 * 10
    assert bits.bits_per_param == bits.served_bits / 310
