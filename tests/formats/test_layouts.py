"""Served layouts: tetra48 and planes14 round trips, byte layouts, class table, int8 rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leechq.errors import InvalidInput, NotInCodebook, UnsupportedShape
from leechq.formats import layouts
from leechq.formats.int8_weight import Int8Weight
from leechq.formats.layouts import planes14, tetra48
from leechq.formats.quantized_weight import QuantizedWeight
from leechq.lattice.classes import ball_size


def _tetra_qw(d_out: int, d_in: int, seed: int = 0, n_c: int = 2) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    nb = d_in // 24
    cents = torch.tensor([0.7, 1.3][:n_c], dtype=torch.float64)
    return QuantizedWeight(
        codebook="tetra", d_out=d_out, d_in=d_in,
        labels=torch.randint(0, 2**47, (d_out, nb), generator=g),
        gains=torch.randint(0, n_c, (d_out, nb), generator=g, dtype=torch.uint8),
        row_scales=torch.rand(d_out, generator=g, dtype=torch.float64) + 0.1,
        centroids=cents,
        tail=torch.randn(d_out, d_in % 24, generator=g),
    )


def _ball_qw(d_out: int, d_in: int, seed: int = 0) -> QuantizedWeight:
    rng = np.random.default_rng(seed)
    nb = d_in // 24
    labels = rng.integers(0, ball_size(12) + 1, size=(d_out, nb))
    labels[0, 0] = 0  # the origin
    return QuantizedWeight(
        codebook="ball", d_out=d_out, d_in=d_in,
        labels=torch.from_numpy(labels.astype(np.int64)),
        gains=torch.from_numpy(rng.integers(0, 2, size=(d_out, nb)).astype(np.uint8)),
        row_scales=torch.from_numpy(rng.random(d_out) + 0.1),
        centroids=torch.tensor([0.8, 1.2], dtype=torch.float64),
        tail=torch.from_numpy(rng.standard_normal((d_out, d_in % 24)).astype(np.float32)),
    )


@pytest.mark.parametrize(("nb", "stride"), [(1, 2), (2, 4), (106, 160), (170, 256), (405, 608)])
def test_tetra48_stride(nb: int, stride: int) -> None:
    assert tetra48.stride_u32(nb) == stride  # docs/kernels.md examples


def test_tetra48_round_trip_and_bytes() -> None:
    qw = _tetra_qw(5, 7 * 24 + 5)
    w = tetra48.pack(qw)
    back = tetra48.unpack(w)
    for name in ("labels", "gains", "row_scales", "centroids", "tail"):
        assert torch.equal(getattr(back, name), getattr(qw, name)), name
    # Row bytes = the served stream of docs/codebooks.md §3.5, then zero padding.
    from leechq.codebooks.tetra import served_bytes_from_words, words_from_labels_gains

    raw = w.words.numpy().view(np.uint8).reshape(5, -1)
    for r in range(5):
        words = words_from_labels_gains(qw.labels[r].numpy(), qw.gains[r].numpy())
        served = np.asarray(served_bytes_from_words(words), dtype=np.uint8)
        assert np.array_equal(raw[r, : 6 * 7], served)
        assert not raw[r, 6 * 7 :].any()


def test_tetra48_test_vector_bytes() -> None:
    # docs/codebooks.md §3.5: word 12c4d7902316 is served as bytes 16 23 90 d7 c4 12.
    word = 0x12C4D7902316
    words = tetra48.words_from_codes(np.array([[word & ((1 << 47) - 1)]]), np.array([[word >> 47]]))
    assert words.view(np.uint8)[0, :6].tobytes().hex() == "162390d7c412"
    word = 0x800000000000  # origin, gain 1
    words = tetra48.words_from_codes(np.array([[0]]), np.array([[1]]))
    assert words.view(np.uint8)[0, :6].tobytes().hex() == "000000000080"


def test_tetra48_single_centroid_and_concat() -> None:
    a = tetra48.pack(_tetra_qw(3, 50, seed=1, n_c=1))
    assert torch.equal(a.row_centroids[:, 0], a.row_centroids[:, 1])
    assert tetra48.unpack(a).centroids.numel() == 1
    b = tetra48.pack(_tetra_qw(4, 50, seed=2))
    ab = tetra48.concat_rows([a, b])
    assert ab.d_out == 7 and torch.equal(ab.words[3:], b.words)
    with pytest.raises(InvalidInput, match="different centroid pairs"):
        tetra48.unpack(ab)
    with pytest.raises(InvalidInput, match="d_in"):
        tetra48.concat_rows([a, tetra48.pack(_tetra_qw(2, 74))])


def test_tetra48_bad_input() -> None:
    with pytest.raises(InvalidInput, match="Tetra"):
        tetra48.pack(_ball_qw(2, 48))
    with pytest.raises(UnsupportedShape, match="centroids"):
        qw = _tetra_qw(2, 48)
        qw.centroids = torch.tensor([0.5, 0.7, 0.9, 1.1], dtype=torch.float64)
        tetra48.pack(qw)
    w = tetra48.pack(_tetra_qw(2, 48))
    from dataclasses import replace

    with pytest.raises(InvalidInput, match="words"):
        replace(w, words=w.words[:, :1].contiguous()).validate()


def test_registry() -> None:
    assert layouts.names() == ["planes14", "tetra48", "tetra64"]
    assert layouts.get("tetra48").codebook == "tetra"
    with pytest.raises(InvalidInput, match="choices"):
        layouts.get("slot32")


def test_planes14_class_table() -> None:
    t = planes14.planes14_tables()
    assert t.n_classes == 301 and t.vals.shape == (512, 5) and t.kernel.shape == (512, 4)
    assert t.lens[0] == 1 and not t.vals[0].any() and t.kernel[0, 2] == 0
    assert int(t.lens.max()) <= 5 and not t.lens[1 + 301 :].any()
    # vals[l] = f32(|v|/sqrt(16 m)), level 0 the most frequent magnitude
    e = 1 + 0
    m = t.shells[e]
    assert t.vals[e, 1] == np.float32(t.magnitudes[e, 1] / np.sqrt(16.0 * m))


def test_planes14_round_trip() -> None:
    qw = _ball_qw(4, 5 * 24 + 7)
    w = planes14.pack(qw)
    assert w.records.shape == (4, planes14.stride_u32(5)) == (4, 21)
    from leechq.lattice.indexing import decode_indices

    pts, gains = w.points()
    assert np.array_equal(pts, decode_indices(qw.labels.numpy(), 12))
    assert np.array_equal(gains, qw.gains.numpy())
    back = planes14.unpack(w)
    for name in ("labels", "gains", "row_scales", "centroids", "tail"):
        assert torch.equal(getattr(back, name), getattr(qw, name)), name


def test_planes14_record_bits() -> None:
    # One hand-built point: (-4, 4, 0, ..., 0) is class "two 4s" of shell 2.
    pt = np.zeros((1, 1, 24), dtype=np.int64)
    pt[0, 0, 0], pt[0, 0, 1] = -4, 4
    rec = planes14.records_from_points(pt, np.array([[1]]))
    f = planes14.fields_from_records(rec, 1)
    t = planes14.planes14_tables()
    cid = int(f["id"][0, 0])
    assert t.shells[cid] == 2 and f["gain"][0, 0] == 1 and f["signs"][0, 0] == 1
    lvl4 = list(t.magnitudes[cid]).index(4)
    plane = [f["p0"], f["p1"], f["p2"]]
    for j in range(24):
        level = sum(((int(plane[b][0, 0]) >> j) & 1) << b for b in range(3))
        assert level == (lvl4 if j < 2 else list(t.magnitudes[cid]).index(0))
    assert f["pad"][0, 0] == 0
    raw = rec.view(np.uint8)[0]
    assert raw[0] | (raw[1] & 1) << 8 == cid  # class id in bits 0..8, little-endian


def test_planes14_rejects_non_members() -> None:
    pt = np.zeros((1, 1, 24), dtype=np.int64)
    pt[0, 0, 0] = 3
    with pytest.raises(NotInCodebook):
        planes14.records_from_points(pt, np.array([[0]]))
    with pytest.raises(InvalidInput, match="ball"):
        planes14.pack(_tetra_qw(2, 48))


def test_planes14_random_records_decode() -> None:
    w = planes14.random_planes14(6, 3 * 24 + 2, seed=3)
    pts, gains = w.points()
    t = planes14.planes14_tables()
    assert pts.shape == (6, 3, 24) and set(np.unique(gains)) <= {0, 1}
    assert np.abs(pts).max() <= t.magnitudes.max()


def test_int8_weight_exact_rule() -> None:
    torch.manual_seed(0)
    w = torch.randn(3, 150)
    q = Int8Weight.quantize(w, group=64)
    assert q.scales.shape == (3, 3) and q.qweight.dtype == torch.uint8
    col = torch.arange(150) // 64
    s = q.scales.float()[:, col]
    b = q.biases.float()[:, col]
    assert torch.equal(q.dequantize(), (s * q.qweight.float()) + b)
    assert float(((q.dequantize() - w).abs() / s).max()) <= 0.5 + 1e-3
    with pytest.raises(InvalidInput, match="qweight"):
        Int8Weight(3, 150, q.qweight[:, :10], q.scales, q.biases)
