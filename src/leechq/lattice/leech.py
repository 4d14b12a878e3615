"""Membership in the integer embedding L = √8·Λ24 and the shell of a lattice point.

Implements docs/lattice.md §2.1–§2.2. A vector x ∈ Z^24 is in L iff, for one parity p ∈ {0, 1}:
(i) every x_i ≡ p (mod 2); (ii) the word with bit i = ((x_i − p)/2) mod 2 (Euclidean mod) is a
codeword of the extended Golay code G24 (``lattice.golay``); (iii) Σ x_i ≡ 4p (mod 8). Members have
squared norm 16·m with m the shell (m = 0 for the origin; Shell(1) is empty).

Scalar functions take any sequence of 24 integers and compute with Python ints; :func:`members` and
:func:`golay_words` are their vectorized numpy twins (int64 arithmetic, exact for |x_i| < 2^31).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from leechq.errors import InvalidInput, NotInCodebook
from leechq.lattice.golay import golay_code

DIM = 24
"""Dimension of the lattice (coordinates per block)."""


def as_int_point(point: Sequence[int] | np.ndarray, what: str = "point") -> list[int]:
    """Validate and convert one point to a list of 24 Python ints.

    Args:
        point: a sequence of 24 integers (list, tuple or integer numpy array of shape [24]).
        what: name of the argument, used in error messages.

    Returns:
        The coordinates as Python ints.

    Raises:
        InvalidInput: wrong length or a non-integer coordinate.
    """
    if isinstance(point, np.ndarray):
        if point.shape != (DIM,):
            raise InvalidInput(f"{what} must have shape (24,), got {point.shape}")
        if not np.issubdtype(point.dtype, np.integer):
            raise InvalidInput(f"{what} must have an integer dtype, got {point.dtype}")
        return [int(v) for v in point.tolist()]
    coords = list(point)
    if len(coords) != DIM:
        raise InvalidInput(f"{what} must have 24 coordinates, got {len(coords)}")
    try:
        return [operator.index(v) for v in coords]
    except TypeError:
        raise InvalidInput(f"{what} must contain integers only, got {coords!r}") from None


def golay_word(point: Sequence[int] | np.ndarray) -> int:
    """The 24-bit word of docs/lattice.md §2.1: bit i = ((x_i − p)/2) mod 2 with p = x_0 mod 2
    (Euclidean mods).

    For an even member this is {i : x_i ≡ 2 (mod 4)}; for an odd member {i : x_i ≡ 3 (mod 4)}.
    The word is computed for any integer vector; membership is not checked.

    Args:
        point: 24 integers.

    Returns:
        The word as an int in [0, 2^24).
    """
    coords = as_int_point(point)
    parity = coords[0] % 2
    word = 0
    for i, value in enumerate(coords):
        word |= (((value - parity) // 2) % 2) << i
    return word


def _membership_failure(coords: list[int]) -> str | None:
    """Name the first docs/lattice.md §2.1 condition the point fails, or None if it is a member."""
    parity = coords[0] % 2
    if any(v % 2 != parity for v in coords):
        return "coordinates do not all have the same parity (condition (i))"
    word = 0
    for i, value in enumerate(coords):
        word |= (((value - parity) // 2) % 2) << i
    if not golay_code().is_codeword(word):
        return f"word 0x{word:06x} is not a Golay codeword (condition (ii))"
    if sum(coords) % 8 != 4 * parity:
        return f"coordinate sum {sum(coords)} is not ≡ {4 * parity} (mod 8) (condition (iii))"
    return None


def is_member(point: Sequence[int] | np.ndarray) -> bool:
    """Whether 24 integers form a point of L = √8·Λ24 (docs/lattice.md §2.1).

    Args:
        point: 24 integers (the origin is a member).

    Returns:
        True iff the parity, Golay and sum conditions hold for one coset.

    Raises:
        InvalidInput: not 24 integers.
    """
    return _membership_failure(as_int_point(point)) is None


def golay_words(points: np.ndarray) -> np.ndarray:
    """Vectorized :func:`golay_word`: int array [..., 24] -> int64 words [...].

    Args:
        points: integer array [..., 24].

    Returns:
        int64 [...], bit i = ((x_i − p)/2) mod 2 with p = x_0 mod 2 per point.
    """
    x = _as_int_array(points)
    parity = x[..., :1] & 1
    bits = ((x - parity) >> 1) & 1  # arithmetic shift = floor division: Euclidean mod 2
    return (bits << np.arange(DIM, dtype=np.int64)).sum(axis=-1)


def members(points: np.ndarray) -> np.ndarray:
    """Vectorized :func:`is_member`: int array [..., 24] -> bool [...].

    Args:
        points: integer array [..., 24] (any integer dtype; computed in int64).

    Returns:
        bool [...], True where the point is in √8·Λ24.

    Raises:
        InvalidInput: last dimension is not 24 or the dtype is not integer.
    """
    x = _as_int_array(points)
    parity = x[..., :1] & 1
    same_parity = np.all((x & 1) == parity, axis=-1)
    sum_ok = (x.sum(axis=-1) & 7) == 4 * parity[..., 0]
    in_code = golay_code().contains(golay_words(x))
    return same_parity & sum_ok & in_code


def squared_norm(point: Sequence[int] | np.ndarray) -> int:
    """‖x‖² of 24 integers, exactly (Python ints)."""
    return sum(v * v for v in as_int_point(point))


def shell_of(point: Sequence[int] | np.ndarray) -> int:
    """The shell m = ‖x‖²/16 of a lattice point (0 for the origin).

    Args:
        point: 24 integers.

    Returns:
        m, with ‖x‖² = 16·m.

    Raises:
        NotInCodebook: the point is not in √8·Λ24 (the message names the failing condition) or its
            squared norm is not a multiple of 16 (impossible for a true member).
        InvalidInput: not 24 integers.
    """
    coords = as_int_point(point)
    failure = _membership_failure(coords)
    if failure is not None:
        raise NotInCodebook(f"point {coords} is not in √8·Λ24: {failure}")
    norm = sum(v * v for v in coords)
    if norm % 16:
        raise NotInCodebook(f"point {coords} has squared norm {norm}, not a multiple of 16")
    return norm // 16


def _as_int_array(points: np.ndarray) -> np.ndarray:
    x = np.asarray(points)
    if x.ndim == 0 or x.shape[-1] != DIM:
        raise InvalidInput(f"points must have shape [..., 24], got {x.shape}")
    if not np.issubdtype(x.dtype, np.integer):
        raise InvalidInput(f"points must have an integer dtype, got {x.dtype}")
    return x.astype(np.int64, copy=False)
