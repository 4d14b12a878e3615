"""Scalar 2-bit baselines at rates comparable to leechq, run through the same evaluation harness.

* **RTN int2 g64**: round-to-nearest, asymmetric, groups of 64 consecutive input columns of each
  row. Per group: ``s = (max − min) / 3`` and offset ``m = min``, both stored as f16; codes
  ``q = clamp(round((w − m) / s), 0, 3)``; ``ŵ = q·s + m`` (the f16 values of ``s`` and ``m`` are
  the ones used, so the accounting is honest). Storing the group minimum is the float-zero-point
  form of asymmetric quantization (GGUF Q4_1 style). Rate: ``2 + 32/64 = 2.5`` bits per weight.
* **GPTQ int2 g64**: the GPTQ algorithm (Frantar et al. 2022: column-by-column quantization with
  the inverse-Hessian error feedback, lazy batch updates of 128 columns) with the *same* group
  quantizer, whose ``s``/``m`` are computed when the sweep enters a group, from the already
  error-corrected weights. Hessians ``H = (1/N) Σ x xᵀ`` come from calibration windows, captured
  block by block: pass 1 runs the block's inputs through its original weights and accumulates one
  Hessian per shared activation (docs/quantizer.md §2: q/k/v, o, gate/up, down); the 7 matrices are
  quantized; pass 2 advances the inputs through the quantized block. Damping ``0.01·mean(diag H)``;
  linear algebra in f64. Same rate as RTN.
* **HQQ 2-bit g64** (optional): the ``hqq`` package's half-quadratic solver for scale and zero,
  when ``hqq`` imports. Its own storage: 2-bit codes, f16 scale and zero per group of 64 (2.5 b/w).

Each baseline returns a *copy* of the model with fake-quantized (dequantized, dense) weights in the
seven block projections — embeddings, norms and the head stay as they are — and its bit
accounting: kernel bits per quantized weight (codes + scales) and whole-model bits per parameter
(other parameters counted at 16 bits; a tied head counted once). Self-contained: it does not use
leechq's lattice quantizer (``leechq.quant``).
"""

from __future__ import annotations

import contextlib
import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.data.corpus import TokenWindows
from leechq.errors import InvalidInput, UnsupportedShape
from leechq.models.arch import ArchSpec, arch_of

SCALE_BITS = 16  # f16 scale
ZERO_BITS = 16  # f16 offset / zero
OTHER_PARAM_BITS = 16  # unquantized parameters, counted as f16/bf16


@dataclass
class BitAccounting:
    """Bits of a scalar-quantized model.

    Attributes:
        bits: code bits per weight.
        group: group size along the input dimension.
        n_quantized: quantized weights (block projections).
        quantized_bits: their total storage (codes + f16 scale + f16 zero per group).
        n_other: other parameters (embeddings, norms, head, biases), tied tensors counted once.
        bits_per_weight: ``quantized_bits / n_quantized`` (kernel b/w, e.g. 2.5).
        bits_per_param: whole-model ``(quantized_bits + 16·n_other) / (n_quantized + n_other)``.
    """

    bits: int
    group: int
    n_quantized: int
    quantized_bits: int
    n_other: int
    bits_per_weight: float
    bits_per_param: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly form."""
        return dict(self.__dict__)


@dataclass
class BaselineResult:
    """A fake-quantized model and how it was made.

    Attributes:
        method: ``"rtn-int2-g64"``, ``"gptq-int2-g64"`` or ``"hqq-int2-g64"`` (with the actual
            bits and group).
        model: the model copy with dequantized weights.
        accounting: :class:`BitAccounting`.
        layers: per quantized matrix, relative weight error ``‖W−Ŵ‖²/‖W‖²`` (and, for GPTQ, the
            proxy loss ratio against RTN).
        seconds: wall time.
    """

    method: str
    model: Any
    accounting: BitAccounting
    layers: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary (no model)."""
        errs = [v["rel_err"] for v in self.layers.values()]
        return {
            "method": self.method,
            "accounting": self.accounting.to_dict(),
            "mean_rel_err": sum(errs) / len(errs) if errs else float("nan"),
            "seconds": self.seconds,
        }


# ---------------------------------------------------------------------------------------------
# The group quantizer


def _check_groups(w: torch.Tensor, group: int, name: str = "weight") -> None:
    if w.dim() != 2:
        raise UnsupportedShape(f"{name}: expected a 2-D weight, got shape {tuple(w.shape)}")
    if w.shape[1] % group != 0:
        raise UnsupportedShape(
            f"{name}: input width {w.shape[1]} is not a multiple of the group size {group}"
        )


def group_params(wg: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """f16-rounded ``(scale, offset)`` of groups ``wg [..., g]``, returned in ``wg``'s dtype.

    ``scale = (max − min)/(2^bits − 1)``, ``offset = min``; a constant group gets scale 1 (its
    values are reproduced by the offset up to f16 rounding).
    """
    levels = (1 << bits) - 1
    lo = wg.amin(dim=-1)
    hi = wg.amax(dim=-1)
    scale = ((hi - lo) / levels).to(torch.float16).to(wg.dtype)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    offset = lo.to(torch.float16).to(wg.dtype)
    return scale, offset


def quantize_with(
    w: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int
) -> torch.Tensor:
    """``clamp(round((w − offset)/scale), 0, 2^bits − 1)·scale + offset`` (broadcasting)."""
    levels = (1 << bits) - 1
    q = torch.clamp(torch.round((w - offset) / scale), 0, levels)
    return q * scale + offset


def rtn_quantize(
    w: torch.Tensor, *, bits: int = 2, group: int = 64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round-to-nearest asymmetric group quantization of one matrix.

    Args:
        w: [d_out, d_in] float weight; ``d_in`` a multiple of ``group``.
        bits: code bits (2 for int2).
        group: columns per group.

    Returns:
        ``(ŵ [d_out, d_in] same dtype as w, scale f16 [d_out, d_in/group], offset f16 [...])``.

    Raises:
        UnsupportedShape: not 2-D, or width not a multiple of ``group``.
    """
    _check_groups(w, group)
    work = w.to(torch.float64 if w.dtype == torch.float64 else torch.float32)
    wg = work.reshape(w.shape[0], -1, group)
    scale, offset = group_params(wg, bits)
    w_hat = quantize_with(wg, scale.unsqueeze(-1), offset.unsqueeze(-1), bits)
    return w_hat.reshape(w.shape).to(w.dtype), scale.to(torch.float16), offset.to(torch.float16)


def proxy_loss(w: torch.Tensor, w_hat: torch.Tensor, h: torch.Tensor) -> float:
    """GPTQ's layer objective ``tr((W − Ŵ) H (W − Ŵ)ᵀ)`` in f64 (output MSE for ``H = Σxxᵀ/N``)."""
    d = (w - w_hat).to(torch.float64)
    return float(torch.einsum("ij,jk,ik->", d, h.to(torch.float64), d))


def gptq_quantize(
    w: torch.Tensor,
    h: torch.Tensor,
    *,
    bits: int = 2,
    group: int = 64,
    damp: float = 0.01,
    block: int = 128,
) -> torch.Tensor:
    """GPTQ with asymmetric f16 group parameters (the RTN grid), f64 arithmetic.

    Args:
        w: [d_out, d_in] weight.
        h: [d_in, d_in] input second moment ``Σ x xᵀ / N`` (symmetric PSD).
        bits: code bits.
        group: columns per group (a divisor of ``block``).
        damp: relative damping, ``H + damp·mean(diag H)·I``.
        block: columns per lazy-update block.

    Returns:
        ŵ [d_out, d_in] in ``w``'s dtype.

    Raises:
        UnsupportedShape: bad shapes.
        InvalidInput: ``H`` is not positive definite after damping.
    """
    _check_groups(w, group)
    d_in = w.shape[1]
    if tuple(h.shape) != (d_in, d_in):
        raise UnsupportedShape(f"Hessian shape {tuple(h.shape)} does not match weight width {d_in}")
    if block % group != 0:
        raise InvalidInput(f"block {block} must be a multiple of group {group}")
    W = w.to(torch.float64).clone()
    H = h.to(torch.float64).clone()
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.mean(torch.diag(H)) * torch.eye(d_in, dtype=torch.float64, device=H.device)
    try:
        L = torch.linalg.cholesky(H)
        Hinv = torch.cholesky_inverse(L)
        U = torch.linalg.cholesky(Hinv, upper=True)
    except RuntimeError as exc:  # torch.linalg.LinAlgError derives from RuntimeError
        raise InvalidInput(f"Hessian is not positive definite after damping {damp}: {exc}") from exc
    # The column sweep is thousands of tiny ops; on CPU, intra-op threading only adds fork/join
    # cost (30x slower on a busy 2-core machine), so it runs single-threaded.
    threads = torch.get_num_threads()
    if W.device.type == "cpu":
        torch.set_num_threads(1)
    try:
        return _gptq_sweep(W, U, bits, group, block).to(w.dtype)
    finally:
        torch.set_num_threads(threads)


def _gptq_sweep(
    W: torch.Tensor, U: torch.Tensor, bits: int, group: int, block: int
) -> torch.Tensor:
    """The GPTQ column sweep on f64 ``W`` [d_out, d_in] with ``H⁻¹ = UᵀU``; returns Ŵ (f64)."""
    d_in = W.shape[1]
    Q = torch.zeros_like(W)
    for b0 in range(0, d_in, block):
        b1 = min(b0 + block, d_in)
        W1 = W[:, b0:b1].clone()
        E1 = torch.zeros_like(W1)
        U1 = U[b0:b1, b0:b1]
        scale = offset = None
        for i in range(b1 - b0):
            if (b0 + i) % group == 0:  # enter a group: parameters from the corrected weights
                scale, offset = group_params(W1[:, i : i + group], bits)
            col = W1[:, i]
            q = quantize_with(col, scale, offset, bits)  # type: ignore[arg-type]
            Q[:, b0 + i] = q
            err = (col - q) / U1[i, i]
            W1[:, i:].addr_(err, U1[i, i:], alpha=-1.0)
            E1[:, i] = err
        W[:, b1:] -= E1 @ U[b0:b1, b1:]
    return Q


# ---------------------------------------------------------------------------------------------
# Model-level drivers


def _accounting(
    model: Any, arch: ArchSpec, bits: int, group: int, extra_bits_per_group: int
) -> BitAccounting:
    quantized = {id(m.weight) for _, _, m, _ in arch.iter_linears(model)}
    n_q = sum(m.weight.numel() for _, _, m, _ in arch.iter_linears(model))
    seen: set[int] = set()
    n_other = 0
    for p in model.parameters():
        if id(p) in quantized or id(p) in seen:
            continue
        seen.add(id(p))
        n_other += p.numel()
    q_bits = n_q * bits + (n_q // group) * extra_bits_per_group
    return BitAccounting(
        bits=bits,
        group=group,
        n_quantized=n_q,
        quantized_bits=q_bits,
        n_other=n_other,
        bits_per_weight=q_bits / n_q,
        bits_per_param=(q_bits + OTHER_PARAM_BITS * n_other) / (n_q + n_other),
    )


def _rel_err(w: torch.Tensor, w_hat: torch.Tensor) -> float:
    w64 = w.to(torch.float64)
    return float(((w64 - w_hat.to(torch.float64)) ** 2).sum() / (w64**2).sum().clamp_min(1e-300))


@torch.no_grad()
def rtn_model(
    model: Any, *, bits: int = 2, group: int = 64, inplace: bool = False
) -> BaselineResult:
    """RTN-quantize every block projection of a transformers causal LM (see module docstring).

    Args:
        model: a supported ``*ForCausalLM`` (see :mod:`leechq.models.arch`).
        bits: code bits.
        group: columns per group.
        inplace: modify ``model`` instead of a deep copy.
    """
    start = time.perf_counter()
    arch = arch_of(model)
    target = model if inplace else copy.deepcopy(model)
    layers: dict[str, dict[str, float]] = {}
    for _, _, lin, name in arch.iter_linears(target):
        w = lin.weight.data
        w_hat, _, _ = rtn_quantize(w.float(), bits=bits, group=group)
        layers[name] = {"rel_err": _rel_err(w, w_hat)}
        lin.weight.data.copy_(w_hat.to(w.dtype))
    acc = _accounting(target, arch, bits, group, SCALE_BITS + ZERO_BITS)
    return BaselineResult(
        f"rtn-int{bits}-g{group}", target, acc, layers, time.perf_counter() - start
    )


class _StopForward(Exception):
    pass


def _capture_block_inputs(
    model: Any, arch: ArchSpec, ids: torch.Tensor
) -> list[tuple[torch.Tensor, dict[str, Any]]]:
    """Inputs (hidden states, keyword arguments) of block 0 for each calibration window."""
    first = arch.layers(model)[0]
    captured: list[tuple[torch.Tensor, dict[str, Any]]] = []

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs.pop("hidden_states")
        captured.append((hidden.detach(), dict(kwargs)))
        raise _StopForward

    handle = first.register_forward_pre_hook(hook, with_kwargs=True)
    device = next(model.parameters()).device
    try:
        for row in ids:
            with contextlib.suppress(_StopForward):
                model(input_ids=row.unsqueeze(0).to(device), use_cache=False)
    finally:
        handle.remove()
    return captured


def _block_output(block: Any, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    out = block(hidden, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


@torch.no_grad()
def gptq_model(
    model: Any,
    calibration: TokenWindows | torch.Tensor,
    *,
    bits: int = 2,
    group: int = 64,
    damp: float = 0.01,
    inplace: bool = False,
) -> BaselineResult:
    """GPTQ-quantize every block projection, block by block (see module docstring).

    Args:
        model: a supported ``*ForCausalLM``.
        calibration: calibration windows, ids int64 [N, T] (each window is run on its own).
        bits: code bits.
        group: columns per group.
        damp: relative Hessian damping.
        inplace: modify ``model`` instead of a deep copy.

    Returns:
        :class:`BaselineResult`; ``layers[name]`` has ``rel_err`` and ``proxy_vs_rtn`` (GPTQ proxy
        loss divided by RTN's on the same Hessian; < 1 means GPTQ helped).
    """
    start = time.perf_counter()
    ids = calibration.ids if isinstance(calibration, TokenWindows) else calibration
    if ids.dim() != 2 or ids.dtype != torch.int64:
        raise InvalidInput("calibration must be TokenWindows or int64 ids [N, T]")
    arch = arch_of(model)
    target = model if inplace else copy.deepcopy(model)
    inputs = _capture_block_inputs(target, arch, ids)
    layers: dict[str, dict[str, float]] = {}
    groups = arch.groups()
    for index, block in enumerate(arch.layers(target)):
        linears = arch.block_linears(block)
        # pass 1: one Hessian per shared activation, from the block's original weights
        hess: dict[int, torch.Tensor] = {}
        counts: dict[int, int] = {}
        handles = []
        for act, names in groups.items():
            lin = linears[names[0]]
            d_in = lin.weight.shape[1]
            hess[act] = torch.zeros(d_in, d_in, dtype=torch.float64, device=lin.weight.device)
            counts[act] = 0

            def hook(
                _m: Any,
                args: tuple[Any, ...],
                act: int = act,
                hess: Any = hess,
                counts: Any = counts,
            ) -> None:
                x = args[0].reshape(-1, args[0].shape[-1]).to(torch.float64)
                hess[act] += x.T @ x
                counts[act] += x.shape[0]

            handles.append(lin.register_forward_pre_hook(hook))
        try:
            for hidden, kwargs in inputs:
                _block_output(block, hidden, kwargs)
        finally:
            for h in handles:
                h.remove()
        for act, names in groups.items():
            h = hess[act] / max(counts[act], 1)
            # GPTQ treats rows independently under one Hessian, so the matrices sharing this input
            # are quantized as one row-stacked matrix (same result, fewer column sweeps)
            weights = [linears[name].weight.data for name in names]
            stacked = gptq_quantize(torch.cat(weights), h, bits=bits, group=group, damp=damp)
            for name, w, w_hat in zip(
                names, weights, stacked.split([w.shape[0] for w in weights]), strict=True
            ):
                w_rtn, _, _ = rtn_quantize(w.to(torch.float64), bits=bits, group=group)
                loss_rtn = proxy_loss(w, w_rtn, h)
                qualified = f"{arch.layers_path}.{index}.{name}"
                layers[qualified] = {
                    "rel_err": _rel_err(w, w_hat),
                    "proxy_vs_rtn": proxy_loss(w, w_hat, h) / loss_rtn if loss_rtn > 0 else 1.0,
                }
                w.copy_(w_hat)
        # pass 2: advance through the quantized block
        inputs = [(_block_output(block, hidden, kwargs), kwargs) for hidden, kwargs in inputs]
    acc = _accounting(target, arch, bits, group, SCALE_BITS + ZERO_BITS)
    return BaselineResult(
        f"gptq-int{bits}-g{group}", target, acc, layers, time.perf_counter() - start
    )


def hqq_available() -> bool:
    """Whether the optional ``hqq`` package imports."""
    try:
        from hqq.core.quantize import Quantizer  # noqa: F401
    except Exception:
        return False
    return True


@torch.no_grad()
def hqq_model(
    model: Any, *, bits: int = 2, group: int = 64, inplace: bool = False
) -> BaselineResult:
    """HQQ-quantize every block projection with the ``hqq`` package (calibration-free).

    Raises:
        ImportError: ``hqq`` is not installed (``pip install hqq``).
    """
    try:
        from hqq.core.quantize import Quantizer
    except Exception as exc:
        raise ImportError(
            "the HQQ baseline needs the optional 'hqq' package: pip install hqq"
        ) from exc
    start = time.perf_counter()
    arch = arch_of(model)
    target = model if inplace else copy.deepcopy(model)
    layers: dict[str, dict[str, float]] = {}
    for _, _, lin, name in arch.iter_linears(target):
        w = lin.weight.data
        _check_groups(w, group, name)
        q, meta = Quantizer.quantize(
            w.float(),
            nbits=bits,
            group_size=group,
            optimize=True,
            axis=1,
            compute_dtype=torch.float32,
            device=str(w.device),
            round_zero=False,
        )
        for key in ("scale", "zero"):  # stored as f16 (the accounting below says so)
            meta[key] = meta[key].to(torch.float16).to(torch.float32)
        w_hat = Quantizer.dequantize(q, meta).reshape(w.shape)
        layers[name] = {"rel_err": _rel_err(w, w_hat)}
        lin.weight.data.copy_(w_hat.to(w.dtype))
    acc = _accounting(target, arch, bits, group, SCALE_BITS + ZERO_BITS)
    return BaselineResult(
        f"hqq-int{bits}-g{group}", target, acc, layers, time.perf_counter() - start
    )


BASELINES = ("rtn-int2-g64", "gptq-int2-g64", "hqq-int2-g64")


def run_baseline(
    name: str, model: Any, calibration: TokenWindows | torch.Tensor | None = None
) -> BaselineResult:
    """Run a baseline by name (one of :data:`BASELINES`).

    Raises:
        InvalidInput: unknown name, or GPTQ without calibration windows.
    """
    if name == "rtn-int2-g64":
        return rtn_model(model)
    if name == "gptq-int2-g64":
        if calibration is None:
            raise InvalidInput("gptq-int2-g64 needs calibration windows")
        return gptq_model(model, calibration)
    if name == "hqq-int2-g64":
        return hqq_model(model)
    raise InvalidInput(f"unknown baseline {name!r}; choices: {', '.join(BASELINES)}")
