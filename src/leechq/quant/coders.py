"""Block coders: what the GPTQ loop calls to code one column group of 24 for many rows at once.

A coder turns ``v`` (float64 [rows, 24], the current error-compensated values of one 24-column
group, possibly gathered from several matrices) into codes and the exact reconstruction the loop
continues with (docs/quantizer.md §5). Per-matrix parameters (the gain centroids) may be given once
([K]) or per row ([rows, K]), so that one coder call can serve the groups of several matrices
(:func:`leechq.quant.gptq.gptq_quantize_many`). Three kinds:

* :class:`ShapeGainCoder` — the shipped rule (docs/codebooks.md §1): direction from a
  registered codebook (ONE batched search per call), gain by the norm rule against per-matrix
  Lloyd–Max centroids fitted before the loop, reconstruction in the exact f64 order of the decoder
  (:func:`leechq.codebooks.shape_gain.reconstruct`). It is the semantics of
  :func:`leechq.codebooks.shape_gain.shape_gain_encode` with per-row centroids and without host
  syncs on CUDA. For the ball, whose search yields points, the labels are *deferred*: the loop keeps
  the points and asks :meth:`ShapeGainCoder.labels_of` once per matrix at the end (the index is a
  CPU computation, ~1.4 µs per point, better paid once than in every step).
* :class:`IdentityCoder` — returns ``v`` unchanged (the control of docs/quantizer.md §1: keeps a
  layer unchanged).
* :class:`ScalarRoundCoder` — a uniform scalar grid relative to the row scale; a codebook-free
  control for tests of the loop itself.

Gain centroids (docs/quantizer.md §4) are fitted by :func:`fit_gain_levels`: on the CPU exactly
:func:`leechq.codebooks.shape_gain.fit_centroids`; on an accelerator the same Lloyd–Max iteration
run on the device (:func:`lloyd_max_device`, deterministic masked sums instead of a per-cluster
``mean``), which agrees with the CPU fit up to the rounding of the cluster sums and avoids moving
millions of samples to the host (a 12288×4096 matrix has 2.1 M samples: ~1–7 s per matrix on a CPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from leechq.codebooks import shape_gain
from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput


@dataclass
class BlockCodes:
    """Output of a coder for one column group.

    Attributes:
        labels: int64 [rows] direction labels (zeros for coders without a codebook), or None when
            the coder defers them (then ``points`` is set and the loop calls ``labels_of``).
        gains: integer [rows] gain indices.
        values: float64 [rows, 24] the reconstruction the loop continues with.
        points: int [rows, 24] the lattice points of a lattice coder (the origin for zero blocks),
            or None.
    """

    labels: torch.Tensor | None
    gains: torch.Tensor
    values: torch.Tensor
    points: torch.Tensor | None = None


class BlockCoder(Protocol):
    """What :func:`leechq.quant.gptq.gptq_quantize` needs from a quantizer.

    A coder must be row-independent: a row's codes and values never depend on the other rows of
    the call (the batched loop is checked against a serial one, bit for bit, on the CPU).
    """

    name: str
    lattice: bool  # True: codes are codebook labels + gains and form a QuantizedWeight

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        """Per-matrix parameters fitted before the loop: float64 [K] ascending centroids."""
        ...

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        """Code ``v`` float64 [rows, 24] given float64 [rows] scales and float64 centroids [K] or
        [rows, K]."""
        ...


def row_scales(w_rot: torch.Tensor) -> torch.Tensor:
    """Frozen per-row scale (docs/quantizer.md §4): ``sqrt(Σ_j W'_ij² / max(1, ⌊d_in/24⌋))``.

    Args:
        w_rot: float64 [d_out, d_in], the rotated weights before GPTQ (tail included).

    Returns:
        float64 [d_out].
    """
    d_in = w_rot.shape[1]
    return torch.sqrt((w_rot * w_rot).sum(dim=1) / float(max(1, d_in // BLOCK)))


def block_gain_samples(w_rot: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``‖block‖ / s_i`` for every full block of every row, skipping zero rows and zero blocks.

    Returns:
        float64 [n_samples].
    """
    d_out, d_in = w_rot.shape
    nb = d_in // BLOCK
    blocks = w_rot[:, : nb * BLOCK].reshape(d_out, nb, BLOCK)
    norms = torch.sqrt((blocks * blocks).sum(dim=-1))
    keep = (scales[:, None] > 0) & (norms > 0)
    rel = norms / torch.where(scales > 0, scales, torch.ones_like(scales))[:, None]
    return rel[keep]


# --------------------------------------------------------------------------------------------------
# gain levels


def lloyd_max_device(samples: torch.Tensor, bits: int, iterations: int = 40) -> torch.Tensor:
    """Lloyd–Max gain levels computed where the samples live (fast twin of
    :func:`leechq.codebooks.shape_gain.fit_centroids`).

    The same iteration (quantile start ``sorted[⌊(2j+1)n/(2K)⌋]``, nearest level with ties to the
    lower index, non-empty levels replaced by their cluster mean, re-sorted every iteration, 0 bits
    → the mean); a cluster mean is ``Σ_members x / count`` with the sum taken as a deterministic
    full reduction of the masked samples, so the result may differ from the CPU fit in the last
    bits of the levels (never in the method). No host sync.

    Args:
        samples: float [n] (n ≥ 1, finite), any device.
        bits: 0, 1 or 2 (K = 2^bits levels).
        iterations: Lloyd iterations.

    Returns:
        float64 [K] ascending, on the samples' device.
    """
    if bits < 0 or iterations < 0:
        raise InvalidInput(f"bits and iterations must be ≥ 0, got {bits} and {iterations}")
    x = torch.sort(samples.detach().to(torch.float64).reshape(-1)).values
    n = x.numel()
    if n == 0:
        raise InvalidInput("lloyd_max_device needs at least one sample")
    if bits == 0:
        return (x.sum() / n).reshape(1)
    k = 1 << bits
    idx = torch.tensor([(2 * j + 1) * n // (2 * k) for j in range(k)], device=x.device)
    levels = x[idx].clone()
    for _ in range(iterations):
        assign = shape_gain.nearest_level(x, levels)
        sums, counts = [], []
        for j in range(k):
            member = assign == j
            sums.append(torch.where(member, x, 0.0).sum())
            counts.append(member.sum())
        total = torch.stack(sums)
        count = torch.stack(counts).to(torch.float64)
        levels = torch.where(count > 0, total / count.clamp_min(1.0), levels)
        levels = torch.sort(levels).values
    return levels


def fit_gain_levels(samples: torch.Tensor, bits: int, iterations: int = 40) -> torch.Tensor:
    """Per-matrix gain centroids (docs/quantizer.md §4), float64 [K] ascending on samples' device.

    On the CPU this is exactly :func:`leechq.codebooks.shape_gain.fit_centroids` (the reference);
    elsewhere :func:`lloyd_max_device` (same method, device-rounded cluster sums).
    """
    if samples.device.type == "cpu":
        return shape_gain.fit_centroids(samples, bits, iterations=iterations)
    if not bool(torch.isfinite(samples).all()):
        raise InvalidInput("gain samples contain non-finite values")
    return lloyd_max_device(samples, bits, iterations)


# --------------------------------------------------------------------------------------------------
# shape–gain pieces with per-row levels


def _row_levels(levels: torch.Tensor, rows: int, device: torch.device) -> torch.Tensor:
    """Centroids as float64 [rows, K] (a [K] vector is shared by every row)."""
    levels = levels.to(device=device, dtype=torch.float64)
    if levels.dim() == 1:
        return levels.unsqueeze(0).expand(rows, -1)
    if levels.dim() != 2 or levels.shape[0] != rows:
        raise InvalidInput(f"centroids must be [K] or [{rows}, K], got {list(levels.shape)}")
    return levels


def choose_gains_rows(
    norms: torch.Tensor, scales: torch.Tensor, levels: torch.Tensor
) -> torch.Tensor:
    """The norm rule (docs/codebooks.md §1 step 3) with per-row levels: the same float64 ops as
    :func:`leechq.codebooks.shape_gain.choose_gains` (nearest level, ties to the lower index; a zero
    scale picks level 0).

    Args:
        norms: float64 [N] block norms.
        scales: float64 [N] row scales.
        levels: float64 [K] or [N, K] ascending centroids.

    Returns:
        int64 [N].
    """
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    relative = norms.to(torch.float64) / safe
    rows = _row_levels(levels, relative.shape[0], relative.device)
    gains = torch.argmin((relative[:, None] - rows).abs(), dim=1)  # first minimum: ties → lower
    return torch.where(scales > 0, gains, torch.zeros_like(gains))


def block_norms(points: torch.Tensor) -> torch.Tensor:
    """Correctly rounded ``sqrt(‖p‖²)`` of integer points, float64 [N] (0 for the origin).

    On the CPU through :func:`leechq.codebooks.shape_gain.exact_norms` (torch's vectorized CPU
    float64 sqrt is not always correctly rounded); on CUDA the device's float64 ``sqrt``, which is
    IEEE correctly rounded, so no host round trip is needed.
    """
    if points.device.type == "cuda":
        norm2 = (points.to(torch.int64) ** 2).sum(dim=-1)
        return torch.sqrt(norm2.to(torch.float64))
    return shape_gain.exact_norms(points)


def reconstruct_rows(
    points: torch.Tensor, gains: torch.Tensor, scales: torch.Tensor, levels: torch.Tensor
) -> torch.Tensor:
    """``v̂ = p·(c_g·s)/√(16m)`` in the exact f64 order of docs/codebooks.md §1 step 4 (the order of
    :func:`leechq.codebooks.shape_gain.reconstruct` and of the decoders), with per-row levels.

    Args:
        points: int [N, 24]; gains: int [N]; scales: float64 [N]; levels: float64 [K] or [N, K].

    Returns:
        float64 [N, 24].
    """
    rows = _row_levels(levels, points.shape[0], points.device)
    picked = rows.gather(1, gains.to(torch.int64)[:, None])[:, 0] * scales.to(torch.float64)
    norm = block_norms(points)
    scale = torch.where(norm > 0, picked / torch.where(norm > 0, norm, 1.0), 0.0)
    return points.to(torch.float64) * scale[:, None]


# --------------------------------------------------------------------------------------------------
# coders


class IdentityCoder:
    """Returns every block unchanged (labels and gains are zeros; not a lattice code)."""

    name = "identity"
    lattice = False

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        return torch.ones(1, dtype=torch.float64)

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        n = v.shape[0]
        return BlockCodes(
            labels=torch.zeros(n, dtype=torch.int64, device=v.device),
            gains=torch.zeros(n, dtype=torch.uint8, device=v.device),
            values=v.clone(),
        )


class ScalarRoundCoder:
    """Rounds each coordinate to the grid ``step·s_i·Z`` (a codebook-free control quantizer)."""

    name = "scalar-round"
    lattice = False

    def __init__(self, step: float = 0.5):
        if step <= 0:
            raise InvalidInput(f"scalar grid step must be positive, got {step}")
        self.step = step

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        return torch.ones(1, dtype=torch.float64)

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        unit = (self.step * row_scales / BLOCK**0.5)[:, None]
        unit = torch.where(unit > 0, unit, torch.ones_like(unit))
        q = torch.round(v / unit) * unit
        n = v.shape[0]
        return BlockCodes(
            labels=torch.zeros(n, dtype=torch.int64, device=v.device),
            gains=torch.zeros(n, dtype=torch.uint8, device=v.device),
            values=q,
        )


class ShapeGainCoder:
    """Shape–gain coding over a registered codebook (docs/codebooks.md §1).

    Args:
        codebook: registry name ("ball", "tetra", or a codebook registered by a test).
        gain_bits: 0, 1 or 2 → 1, 2 or 4 centroids per matrix.
        iters: Lloyd–Max iterations for the centroids.
    """

    lattice = True

    def __init__(self, codebook: str, gain_bits: int = 1, iters: int = 40):
        from leechq.codebooks import get

        self.codebook = get(codebook)
        self.name = codebook
        self.gain_bits = gain_bits
        self.iters = iters
        self._ball_shell = _ball_max_shell(self.codebook)
        self._tetra_decode = _tetra_decoder(self.codebook)

    def fit(self, w_rot: torch.Tensor, row_scales: torch.Tensor) -> torch.Tensor:
        samples = block_gain_samples(w_rot, row_scales)
        if samples.numel() == 0:  # an all-zero matrix: every block codes to the origin anyway
            return torch.ones(2**self.gain_bits, dtype=torch.float64)
        return fit_gain_levels(samples, self.gain_bits, self.iters)

    @property
    def defers_labels(self) -> bool:
        """True when :meth:`code` returns points only (labels from :meth:`labels_of`)."""
        return self._ball_shell is not None

    def _directions(self, v: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One batched codebook call: (labels or None, points int32 [N, 24] on v's device)."""
        if self._ball_shell is not None:
            points, _ = self.codebook.search(v)  # type: ignore[attr-defined]
            return None, points.to(v.device)
        labels = self.codebook.encode(v).to(torch.int64)
        if self._tetra_decode is not None:
            # The encoder's own labels are in range: skip the range check (a host sync on CUDA).
            return labels, self._tetra_decode(labels, validate=False).to(v.device)
        return labels, self.codebook.decode(labels).to(v.device)

    def labels_of(self, points: torch.Tensor) -> torch.Tensor:
        """Labels of codebook points (int [..., 24]) → int64 [...] on the points' device (the origin
        → 0). Used for deferred labels."""
        if self._ball_shell is None:
            raise InvalidInput(f"codebook {self.name!r} does not defer its labels")
        from leechq.lattice.indexing import encode_points

        flat = points.reshape(-1, BLOCK).to("cpu", torch.int32).numpy()
        labels = torch.from_numpy(encode_points(flat, self._ball_shell))
        return labels.reshape(points.shape[:-1]).to(points.device)

    def code(
        self, v: torch.Tensor, row_scales: torch.Tensor, centroids: torch.Tensor
    ) -> BlockCodes:
        # docs/codebooks.md §1 steps 1-3, 5: one batched direction search for every row of the call;
        # zero blocks
        # come back as (label 0, gain 0, origin). Same operations as shape_gain.shape_gain_encode.
        if v.dim() != 2 or v.shape[1] != BLOCK:
            raise InvalidInput(f"blocks must have shape [N, 24], got {list(v.shape)}")
        b64 = v.to(torch.float64)
        norms = torch.sqrt((b64 * b64).sum(dim=1))  # only compared with centroids, never stored
        zero = norms == 0
        labels, points = self._directions(v)
        scales = row_scales.to(device=v.device, dtype=torch.float64)
        gains = choose_gains_rows(norms, scales, centroids)
        if labels is not None:
            labels = torch.where(zero.to(labels.device), 0, labels)
        gains = torch.where(zero, 0, gains)
        points = torch.where(zero[:, None], 0, points).to(torch.int32)
        # docs/codebooks.md §1 step 4, in the decoder's exact f64 order.
        values = reconstruct_rows(points, gains, scales, centroids)
        return BlockCodes(
            labels=labels, gains=gains.to(torch.uint8), values=values, points=points
        )


def _tetra_decoder(codebook: object):  # type: ignore[no-untyped-def]
    """Tetra's module-level decode (it has a ``validate`` switch), or None for other codebooks."""
    try:
        from leechq.codebooks.tetra import TetraCodebook, decode
    except ImportError:  # pragma: no cover - the Tetra module is optional
        return None
    return decode if isinstance(codebook, TetraCodebook) else None


def _ball_max_shell(codebook: object) -> int | None:
    """M for the ball codebook (whose search returns points), else None."""
    try:
        from leechq.codebooks.ball import BallCodebook
    except ImportError:  # pragma: no cover - the ball module is optional
        return None
    return codebook.max_shell if isinstance(codebook, BallCodebook) else None
