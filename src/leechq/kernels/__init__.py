"""Layer 3: compute on packed layouts — reference twins in torch, Triton kernels, kernel selection.

* :mod:`leechq.kernels.reference` — pure-torch twins of every kernel (f64 inside), the oracle of
  the tests and the CPU path;
* :mod:`leechq.kernels.triton` — the Triton kernels (imported only when a kernel is called; this
  package imports without triton);
* :mod:`leechq.kernels.select` — the dispatch table: ``choose(Request(...))`` over one ordered
  list of kernel classes with ``can_implement(request) → (ok, reason)``, and ``plan_linear``
  for ``nn``;
* :mod:`leechq.kernels.tables` — device tables derived from the codebooks' tables.

docs/kernels.md describes the layouts, the kernel contracts, the selection order and tolerances.
"""
