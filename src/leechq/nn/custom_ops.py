"""The fused kernels as opaque torch custom ops, so ``torch.compile`` traces a loaded model.

A finalized module's fused path is a Python callable over packed device tensors (a
:class:`leechq.kernels.select.LinearPlan`, an embedding gather). Left visible to dynamo, its Triton
kernels would be traced as user kernels and inductor would generate code around them, which fails
for kernels with inline assembly. Here each callable is registered under an integer key and reached
through one of two custom ops whose only tensor input is the activation:

* ``leechq::fused_linear(x, key, d_out, dtype)``: ``x [..., d_in] -> y [..., d_out]`` of ``dtype``
  (linear projections and the packed head's matvec);
* ``leechq::packed_embedding(ids, key, dim, dtype)``: int ids ``[...] -> [..., dim]`` of ``dtype``.

Each op has a fake (shape) implementation, so dynamo and inductor see a call with a known output
shape and dtype and leave the kernels alone. The registry holds its callables weakly: a callable
lives as long as the module that registered it. Registration needs only torch (no triton, no CUDA).

Modules call :func:`fused_linear` / :func:`packed_embedding`, which dispatch through the op only
while compiling; eager calls go to the callable directly (the op dispatch costs host time per call,
which a batch-1 decode step would feel).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable

import torch

from leechq.errors import InvalidInput

Kernel = Callable[[torch.Tensor], torch.Tensor]

_REGISTRY: weakref.WeakValueDictionary[int, Kernel] = weakref.WeakValueDictionary()
_KEYS = itertools.count(1)


def register(fn: Kernel) -> int:
    """Register ``fn`` (a weak-referenceable callable: a plan object or a bound method, not a bare
    lambda that nothing else holds) and return its key. The caller keeps ``fn`` alive."""
    key = next(_KEYS)
    _REGISTRY[key] = fn
    return key


def _lookup(key: int) -> Kernel:
    fn = _REGISTRY.get(key)
    if fn is None:
        raise InvalidInput(f"leechq custom op: no live kernel under key {key} (its module was "
                           "freed or never finalized)")
    return fn


@torch.library.custom_op("leechq::fused_linear", mutates_args=())
def _fused_linear_op(x: torch.Tensor, key: int, d_out: int, dtype: torch.dtype) -> torch.Tensor:
    y = _lookup(key)(x)
    # An op's output may not alias its input; a kernel returns a fresh tensor, but be sure.
    return y.clone() if y.data_ptr() == x.data_ptr() else y


@_fused_linear_op.register_fake
def _(x: torch.Tensor, key: int, d_out: int, dtype: torch.dtype) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], d_out), dtype=dtype)


@torch.library.custom_op("leechq::packed_embedding", mutates_args=())
def _packed_embedding_op(ids: torch.Tensor, key: int, dim: int, dtype: torch.dtype
                         ) -> torch.Tensor:
    return _lookup(key)(ids)


@_packed_embedding_op.register_fake
def _(ids: torch.Tensor, key: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    return ids.new_empty((*ids.shape, dim), dtype=dtype)


def fused_linear(x: torch.Tensor, key: int, d_out: int, dtype: torch.dtype) -> torch.Tensor:
    """``x [..., d_in] -> [..., d_out]`` of ``dtype`` by the kernel registered under ``key``
    (through ``leechq::fused_linear`` while compiling, directly otherwise)."""
    if torch.compiler.is_compiling():
        return torch.ops.leechq.fused_linear(x, key, d_out, dtype)
    return _lookup(key)(x)


def packed_embedding(ids: torch.Tensor, key: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Token ids ``[...] -> [..., dim]`` of ``dtype`` by the gather registered under ``key``
    (through ``leechq::packed_embedding`` while compiling, directly otherwise)."""
    if torch.compiler.is_compiling():
        return torch.ops.leechq.packed_embedding(ids, key, dim, dtype)
    return _lookup(key)(ids)
