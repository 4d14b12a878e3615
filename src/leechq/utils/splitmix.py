"""SplitMix64: the deterministic generator behind rotations, fingerprints and Gaussian benchmarks.

Implements docs/quantizer.md §3 (state update, finalizer, uniform and Box–Muller Gaussian draws) and
the finalizer used by the codebook fingerprint (docs/lattice.md §5). Everything is exact 64-bit
integer arithmetic in Python; Gaussians use the C library's ``log``/``cos`` through :mod:`math`,
scalar, as the spec requires for bit-exact rotation tables. A vectorized numpy twin is provided for
bulk Gaussian streams where last-ulp agreement with libm is not part of any format (benchmarks).
"""

from __future__ import annotations

import math

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64 finalizer (no increment), modulo 2**64."""
    z &= MASK64
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return z


class SplitMix64:
    """The SplitMix64 stream: ``state += golden gamma`` then the finalizer."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        """Next 64-bit output."""
        self.state = (self.state + GOLDEN_GAMMA) & MASK64
        return mix64(self.state)

    def uniform(self) -> float:
        """Uniform draw in [0, 1): ``(next >> 11) * 2**-53``."""
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))

    def gaussian(self) -> float:
        """One standard normal (Box–Muller, cosine branch); consumes two outputs."""
        u1 = ((self.next_u64() >> 11) + 1) / float((1 << 53) + 1)
        u2 = (self.next_u64() >> 11) * (1.0 / (1 << 53))
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    def gaussians(self, n: int) -> np.ndarray:
        """``n`` standard normals as float64 [n], drawn exactly like :meth:`gaussian` (vectorized).

        The integer stream is reproduced bit for bit; ``log``/``cos`` are numpy's, which may differ from
        libm in the last ulp. Use :meth:`gaussian` where a format depends on the bits.
        """
        if n <= 0:
            return np.zeros(0, dtype=np.float64)
        outputs = self.next_u64_array(2 * n)
        hi = (outputs >> np.uint64(11)).astype(np.float64)
        u1 = (hi[0::2] + 1.0) / float((1 << 53) + 1)
        u2 = hi[1::2] * (1.0 / (1 << 53))
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def next_u64_array(self, n: int) -> np.ndarray:
        """The next ``n`` outputs as uint64 [n] (vectorized, bit-identical to :meth:`next_u64`)."""
        with np.errstate(over="ignore"):
            steps = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(GOLDEN_GAMMA)
            z = np.uint64(self.state) + steps
            z ^= z >> np.uint64(30)
            z *= np.uint64(0xBF58476D1CE4E5B9)
            z ^= z >> np.uint64(27)
            z *= np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
        self.state = (self.state + n * GOLDEN_GAMMA) & MASK64
        return z
