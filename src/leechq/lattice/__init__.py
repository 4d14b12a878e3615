"""Layer 0: the exact Leech-lattice core (Golay code, Λ24 membership, classes, index, search).

Pure Python/numpy and integer-exact; imports no torch. See leech-core.md §1–§4.
"""
