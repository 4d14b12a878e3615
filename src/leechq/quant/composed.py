"""A quantized model made differentiable in every stored continuous number (the codes frozen).

Each quantized linear or table becomes a :class:`ComposedLinear` / :class:`ComposedEmbedding`
whose weight is composed from frozen parts and trainable factors (see :mod:`leechq.quant.tune` for
the table of groups); every norm weight gets a factor. No weight-sized tensor is kept between
forward and backward (:class:`_ComposedOp`): a lattice weight is recomposed in the backward under
autograd; a group-affine weight (an int4 matrix, a head or embedding table) is composed
:data:`ROW_CHUNK` rows at a time in both directions, its factors' gradients computed directly
from each chunk, and an embedding composes only the rows a lookup names. :func:`fold` turns the
factors back into records and raw tensors of the artifact's formats.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.codebooks.base import BLOCK
from leechq.errors import InvalidInput
from leechq.formats.artifact import GroupAffine
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables
from leechq.utils.modules import embedding_scale


class NotComposable(InvalidInput):
    """A module of the model cannot be made differentiable in its stored numbers (tuning refuses
    it; the full recipe then leaves the tuning step out)."""


GROUPS = ("row_scales", "centroids", "int4", "tables", "norms", "biases")
"""The parameter groups, in the order of :mod:`leechq.quant.tune`'s table."""


# --------------------------------------------------------------------------------------------------
# composed weights


def lattice_factors(record: QuantizedWeight, device: torch.device | str | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """A lattice record split into what tuning keeps frozen, in the rotated basis, computed on
    ``device`` (default: the record's).

    Returns:
        ``(U float64 [d_out, n_blocks·24], G int32 [d_out, n_blocks], T float64 [d_out, tail] or
        None)``: ``U`` is the rotated decode of the blocks with every centroid replaced by 1 (zeros
        where the block's centroid is 0), ``G`` the blocks' gain indices and ``T`` the rotated
        tail, so that ``Qᵀ [c[G] ⊙ U, T]`` (each block's centroid times its 24 values, the tail
        appended, then un-rotated) is the record's decode.

    One copy of the weight whatever the number of centroids: the gain index picks the centroid
    per block when the weight is composed.
    """
    rot = record.dequantize_rotated(device)
    dev = rot.device
    d_out, nb = record.d_out, record.n_blocks
    c = record.centroids.to(device=dev, dtype=torch.float64)
    gains = record.gains.to(dev)
    picked = c[gains.long()][..., None]  # [d_out, nb, 1]: one centroid per block
    blocks = rot[:, : nb * BLOCK].reshape(d_out, nb, BLOCK)
    unit = torch.where(picked != 0.0, blocks / torch.where(picked != 0.0, picked, 1.0), 0.0)
    tail = rot[:, nb * BLOCK :] if record.tail_cols > 0 else None
    return unit.reshape(d_out, nb * BLOCK), gains.to(torch.int32), tail


_HADAMARD: dict[tuple[int, str], torch.Tensor] = {}


def _hadamard(n: int, device: torch.device) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order ``n`` (a power of two), float32 on ``device``."""
    key = (n, str(device))
    if key not in _HADAMARD:
        h = torch.ones(1, 1)
        while h.shape[0] < n:
            h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
        _HADAMARD[key] = h.to(device)
    return _HADAMARD[key]


class _Unrotation:
    """``Qᵀ`` along the rows of a float32 weight, differentiable, for composing during tuning.

    The same map as :func:`leechq.formats.rotation.apply_rotation_transpose` (the ``Q_odd``ᵀ mix
    over the ``k`` groups, the Walsh–Hadamard transform of each group of ``m`` scaled by 1/√m,
    the signs) computed with two matrix products instead of butterflies. With ``m = a·b`` a row
    viewed as a ``(k·a) × b`` matrix ``X`` maps to ``K X H_b`` with ``K = Q_oddᵀ ⊗ H_a`` (the mix
    and the transform act on different axes, so they combine). Float32 accuracy, not the exact
    reader's bits (tuning only needs the former).
    """

    def __init__(self, tables: RotationTables, device: torch.device) -> None:
        m = tables.pow2
        a = m // min(m, 64)  # b = 64 columns (or all of a small group) keeps both products wide
        small_t = torch.as_tensor(tables.small.T.copy(), dtype=torch.float32)  # [k, k]
        self.left = torch.kron(small_t, _hadamard(a, torch.device("cpu"))).to(device)
        self.right = _hadamard(m // a, device)
        signs = torch.as_tensor(tables.signs, dtype=torch.float32, device=device)
        self.signs = signs / math.sqrt(m)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        d, n = x.shape
        v = torch.matmul(x.reshape(d, self.left.shape[0], self.right.shape[0]), self.right)
        return torch.matmul(self.left, v).reshape(d, n) * self.signs


class _ComposedOp(torch.autograd.Function):
    """``op(x, compose())`` whose backward recomposes the weight instead of saving it (or, for a
    group-affine weight, computes its factors' gradients directly, :meth:`_Composed.direct`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, owner: Any, *params: torch.Tensor) -> torch.Tensor:
        ctx.owner = owner
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(x)
        with torch.no_grad():
            return owner.value(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        owner = ctx.owner
        direct = owner.direct(x, g)
        if direct is not None:
            gx, by_name = direct
            gx = None if gx is None or not ctx.needs_input_grad[0] else gx.to(ctx.x_dtype)
            names = [n for n, _ in sorted(owner.named_parameters())]
            return (gx, None, *[by_name.get(n) if ctx.needs_input_grad[2 + i] else None
                                for i, n in enumerate(names)])
        trainable = [p for p in owner.trainable() if p.requires_grad]
        with torch.enable_grad():
            w, b = owner.compose()
        gx, gw, gb = owner.op_backward(x, w.detach(), g)
        outs = [w] + ([b] if b is not None and b.requires_grad else [])
        grads = [gw] + ([gb] if b is not None and b.requires_grad else [])
        pairs = [(o, gr) for o, gr in zip(outs, grads, strict=True) if o.requires_grad]
        got = (
            torch.autograd.grad([o for o, _ in pairs], trainable, [gr for _, gr in pairs],
                                allow_unused=True)
            if pairs and trainable else [None] * len(trainable)
        )
        by_id = {id(p): gr for p, gr in zip(trainable, got, strict=True)}
        gx = None if gx is None or not ctx.needs_input_grad[0] else gx.to(ctx.x_dtype)
        return (gx, None, *[by_id.get(id(p)) for p in owner.trainable()])


class _Composed(nn.Module):
    """Base of the composed modules: ``trainable()`` lists every factor in a fixed order."""

    compute_dtype: torch.dtype

    def trainable(self) -> list[torch.Tensor]:
        return [p for _, p in sorted(self.named_parameters())]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ComposedOp.apply(x, self, *self.trainable())

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """The module's output for ``x`` (no gradients): ``op(x, compose())``."""
        w, b = self.compose()
        return self.op(x, w, b)

    def direct(self, x: torch.Tensor, g: torch.Tensor
               ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]] | None:
        """``(input gradient, {parameter name: gradient})`` computed without recomposing the
        whole weight under autograd, or None (the backward then recomposes it)."""
        return None


ROW_CHUNK = 8192
"""Rows of a group-affine weight (an int4 matrix, a head or embedding table) composed at once:
its forward and backward never hold more than this many float32 rows of it."""


def _affine_rows(m: Any, rows: slice | torch.Tensor) -> torch.Tensor:
    """Rows ``rows`` (a slice or an int64 index) of a group-affine module's weight, f32
    [n, cols]: ``s0·ρ`` and ``b0 + s0·δ`` per group times the codes."""
    s0 = m.s0[rows]
    s = (s0 * m.rho[rows])[:, m.col_group]
    b = (m.b0[rows] + s0 * m.delta[rows])[:, m.col_group]
    return s * m.codes[rows].float() + b


def _affine_factor_grads(m: Any, rows: slice | torch.Tensor, gw: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of ``ρ`` and ``δ`` at ``rows`` from the weight's gradient there (f32
    [n, cols]): ``∂W/∂ρ = s0·codes`` and ``∂W/∂δ = s0`` within each group."""
    n, groups = gw.shape[0], m.s0.shape[1]
    codes = m.codes[rows].float()
    by_code = torch.zeros(n, groups, device=gw.device).index_add_(1, m.col_group, gw * codes)
    by_one = torch.zeros(n, groups, device=gw.device).index_add_(1, m.col_group, gw)
    s0 = m.s0[rows]
    return s0 * by_code, s0 * by_one


def _affine_factors(module: nn.Module, scales: torch.Tensor, biases: torch.Tensor,
                    train: bool, device: torch.device) -> None:
    module.register_buffer("s0", scales.to(device=device, dtype=torch.float32))
    module.register_buffer("b0", biases.to(device=device, dtype=torch.float32))
    ones = torch.ones_like(module.s0)
    zeros = torch.zeros_like(module.s0)
    if train:
        module.rho = nn.Parameter(ones)
        module.delta = nn.Parameter(zeros)
    else:
        module.register_buffer("rho", ones)
        module.register_buffer("delta", zeros)


def _affine_compose(m: Any) -> torch.Tensor:
    """The whole group-affine weight, f32 of the module's ``dims`` (:func:`_affine_rows` of every
    row)."""
    return _affine_rows(m, slice(None)).reshape(m.dims)


def _affine_fold(m: Any) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        s = (m.s0 * m.rho).to(torch.float16).cpu()
        b = (m.b0 + m.s0 * m.delta).to(torch.float16).cpu()
    return s, b


class ComposedLinear(_Composed):
    """A linear whose weight is composed from a lattice record, an int4 record or a table.

    Args:
        source: :class:`QuantizedWeight`, :class:`Int4Weight` or :class:`GroupAffine` (2-D).
        bias: the linear's bias or None (trainable with ``groups`` ∋ "biases").
        groups: the trainable groups (see the module docstring).
        device, compute_dtype: where the frozen parts live and the matmul's dtype.
    """

    def __init__(self, source: Any, bias: torch.Tensor | None, groups: tuple[str, ...],
                 device: torch.device, compute_dtype: torch.dtype) -> None:
        super().__init__()
        self.compute_dtype = compute_dtype
        self.source = source
        if isinstance(source, QuantizedWeight):
            self.kind = "lattice"
            self.out_features, self.in_features = source.d_out, source.d_in
            self.n_blocks = source.n_blocks
            unit, gidx, tail = lattice_factors(source, device)
            self.register_buffer("unit", unit.to(device=device, dtype=compute_dtype))
            self.register_buffer("gidx", gidx.to(device))
            self.register_buffer("tail", None if tail is None else
                                 tail.to(device=device, dtype=compute_dtype))
            self.unrotate = (None if source.rotation is None
                             else _Unrotation(source.rotation, device))
            c = source.centroids.to(torch.float32)
            self.register_buffer("c0", c.to(device))
            if "centroids" in groups:
                self.gamma = nn.Parameter(torch.ones(c.numel(), device=device))
            else:
                self.register_buffer("gamma", torch.ones(c.numel(), device=device))
            lam = torch.ones(source.d_out, device=device)
            if "row_scales" in groups:
                self.lam = nn.Parameter(lam)
            else:
                self.register_buffer("lam", lam)
        else:
            kind = "int4" if isinstance(source, Int4Weight) else "tables"
            if kind == "tables" and len(source.dims) != 2:
                raise InvalidInput("a composed linear needs a 2-D table")
            self.kind = kind
            d_out, d_in = (source.d_out, source.d_in) if kind == "int4" else source.dims
            self.out_features, self.in_features = d_out, d_in
            self.dims = (d_out, d_in)
            self.register_buffer("codes", source.codes().to(device=device, dtype=compute_dtype))
            self.register_buffer("col_group", torch.arange(d_in, device=device) // source.group)
            _affine_factors(self, source.scales, source.biases, kind in groups, device)
        if bias is None:
            self.bias = None
        elif "biases" in groups:
            self.bias = nn.Parameter(bias.detach().to(device=device, dtype=torch.float32))
        else:
            self.register_buffer("bias", bias.detach().to(device=device, dtype=torch.float32))

    def compose(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight [d_out, d_in] (f32) and bias [d_out] (f32) or None."""
        if self.kind == "lattice":
            d_out, nb = self.out_features, self.n_blocks
            coef = (self.gamma * self.c0).index_select(0, self.gidx.reshape(-1)).reshape(d_out, nb)
            w = self.unit.float().reshape(d_out, nb, BLOCK) * (coef * self.lam[:, None])[..., None]
            w = w.reshape(d_out, nb * BLOCK)
            if self.tail is not None:
                w = torch.cat((w, self.tail.float()), dim=1)
            if self.unrotate is not None:
                with torch.autocast(w.device.type, enabled=False):  # f32 under the caller's amp
                    w = self.unrotate(w)
        else:
            w = _affine_compose(self)
        return w, self.bias

    def op(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        cd = self.compute_dtype
        return F.linear(x.to(cd), w.to(cd), None if b is None else b.to(cd))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "lattice":
            return super().value(x)
        cd = self.compute_dtype
        xc = x.to(cd)
        parts = [F.linear(xc, _affine_rows(self, slice(r, r + ROW_CHUNK)).to(cd))
                 for r in range(0, self.out_features, ROW_CHUNK)]
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        return y if self.bias is None else y + self.bias.to(cd)

    def direct(self, x: torch.Tensor, g: torch.Tensor
               ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]] | None:
        """A group-affine weight: the input gradient and the factors' gradients ``ρ``, ``δ`` (and
        the bias's) ROW_CHUNK rows at a time (a lattice weight: None)."""
        if self.kind == "lattice":
            return None
        cd = self.compute_dtype
        g2 = g.reshape(-1, self.out_features)
        train = isinstance(self.rho, nn.Parameter)
        x2 = x.reshape(-1, self.in_features).float() if train else None
        gx = torch.zeros(g2.shape[0], self.in_features, device=g.device)
        g_rho = torch.zeros_like(self.s0) if train else None
        g_delta = torch.zeros_like(self.s0) if train else None
        for r in range(0, self.out_features, ROW_CHUNK):
            rows = slice(r, r + ROW_CHUNK)
            gr = g2[:, rows]
            gx += (gr.to(cd) @ _affine_rows(self, rows).to(cd)).float()
            if train:
                g_rho[rows], g_delta[rows] = _affine_factor_grads(self, rows, gr.float().T @ x2)
        out: dict[str, torch.Tensor] = {}
        if train:
            out.update(rho=g_rho, delta=g_delta)
        if isinstance(self.bias, nn.Parameter):
            out["bias"] = g2.float().sum(0)
        return gx.reshape(*x.shape[:-1], self.in_features), out

    def op_backward(self, x: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[Any, ...]:
        cd = self.compute_dtype
        gx = g.to(cd) @ w.to(cd)
        g2 = g.reshape(-1, g.shape[-1]).float()
        gw = g2.T @ x.reshape(-1, x.shape[-1]).float()
        return gx, gw, g2.sum(0)

    def fold(self) -> Any:
        """The trained source record (lattice / int4 record or table)."""
        src = self.source
        if self.kind == "lattice":
            lam = self.lam.detach().to("cpu", torch.float64)
            if bool(torch.isnan(lam).any()):
                raise InvalidInput("tuning produced non-finite row factors")
            lam = lam.clamp(min=0.0)
            scales = torch.where(lam == 1.0, src.row_scales, lam * src.row_scales)
            cent = src.centroids
            gains = src.gains
            if isinstance(self.gamma, nn.Parameter):
                gam = self.gamma.detach().to("cpu", torch.float64).clamp(min=0.0)
                cent = torch.where(gam == 1.0, cent, gam * cent)
                order = torch.argsort(cent, stable=True)
                if not torch.equal(order, torch.arange(cent.numel())):
                    rank = torch.empty_like(order)
                    rank[order] = torch.arange(cent.numel())
                    cent = cent[order]
                    gains = rank[gains.long()].to(torch.uint8)
            return dataclasses.replace(src, row_scales=scales, centroids=cent, gains=gains)
        s, b = _affine_fold(self)
        return dataclasses.replace(src, scales=s, biases=b)

    def folded_bias(self) -> torch.Tensor | None:
        return None if self.bias is None else self.bias.detach().cpu().clone()


class ComposedEmbedding(_Composed):
    """An embedding whose table is composed from a :class:`GroupAffine` table (see ComposedLinear);
    ``share`` reuses another composed module's factors (a tied head and its embedding);
    ``embed_scale`` multiplies every looked-up row, as the scaled embeddings of the Gemma families
    do (the factor rounded to the output dtype first, as transformers does)."""

    def __init__(self, source: GroupAffine, groups: tuple[str, ...], device: torch.device,
                 compute_dtype: torch.dtype, share: ComposedLinear | None = None,
                 embed_scale: float = 1.0) -> None:
        super().__init__()
        self.compute_dtype = compute_dtype
        self.kind = "tables"
        self.source = source
        self.dims = tuple(source.dims)
        self.embed_scale = float(embed_scale)
        if share is not None:
            for name in ("codes", "col_group", "s0", "b0"):
                self.register_buffer(name, getattr(share, name))
            for name in ("rho", "delta"):
                t = getattr(share, name)
                if isinstance(t, nn.Parameter):
                    setattr(self, name, t)
                else:
                    self.register_buffer(name, t)
        else:
            self.register_buffer("codes", source.codes().to(device=device, dtype=compute_dtype))
            self.register_buffer("col_group",
                                 torch.arange(source.cols, device=device) // source.group)
            _affine_factors(self, source.scales, source.biases, "tables" in groups, device)

    def compose(self) -> tuple[torch.Tensor, None]:
        return _affine_compose(self), None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.embed_scale == 1.0:
            return out
        return out * torch.tensor(self.embed_scale, dtype=out.dtype)

    def value(self, ids: torch.Tensor) -> torch.Tensor:
        """The looked-up rows, composed for each id (a repeated id once per occurrence; no
        device sync, nothing vocabulary-sized)."""
        flat = ids.reshape(-1)
        rows = _affine_rows(self, flat).to(self.compute_dtype)
        return rows.reshape(*ids.shape, self.dims[1])

    def direct(self, ids: torch.Tensor, g: torch.Tensor
               ) -> tuple[None, dict[str, torch.Tensor]] | None:
        """The factors' gradients from the looked-up rows alone (ids have no gradient): each
        occurrence's contribution, summed into its row."""
        if not isinstance(self.rho, nn.Parameter):
            return None, {}
        flat = ids.reshape(-1)
        per_rho, per_delta = _affine_factor_grads(self, flat,
                                                  g.reshape(-1, self.dims[1]).float())
        g_rho = torch.zeros_like(self.s0).index_add_(0, flat, per_rho)
        g_delta = torch.zeros_like(self.s0).index_add_(0, flat, per_delta)
        return None, {"rho": g_rho, "delta": g_delta}

    def fold(self) -> GroupAffine:
        s, b = _affine_fold(self)
        return dataclasses.replace(self.source, scales=s, biases=b)


class _NormFactor(nn.Module):
    """Forward pre-hook state of a norm: ``weight ← w0·ν`` with a trainable ``ν``."""

    def __init__(self, w0: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w0", w0.detach().to(torch.float32))
        self.nu = nn.Parameter(torch.ones_like(self.w0))


# --------------------------------------------------------------------------------------------------
# attaching to a model


@dataclass
class Attached:
    """The composed modules and norm factors swapped into a model (see :func:`attach`)."""

    linears: dict[str, ComposedLinear] = field(default_factory=dict)
    embeddings: dict[str, ComposedEmbedding] = field(default_factory=dict)
    tables: dict[str, tuple[str, ...]] = field(default_factory=dict)  # table -> module names
    norms: dict[str, _NormFactor] = field(default_factory=dict)  # raw name -> factor
    originals: dict[str, nn.Module] = field(default_factory=dict)
    norm_params: dict[str, nn.Parameter] = field(default_factory=dict)
    hooks: list[Any] = field(default_factory=list)
    parked: torch.device | None = None  # where the originals return to (they wait on the CPU)

    def parameters(self) -> dict[str, nn.Parameter]:
        """Every trainable factor by a stable name (shared factors once)."""
        out: dict[str, nn.Parameter] = {}
        seen: set[int] = set()
        groups = [*self.linears.items(), *self.embeddings.items(), *self.norms.items()]
        for owner, module in groups:
            for pname, p in sorted(module.named_parameters()):
                if id(p) not in seen:
                    seen.add(id(p))
                    out[f"{owner}:{pname}"] = p
        return out


def _swap(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, leaf)
    setattr(parent, leaf, new)
    return old


def _is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower()


def attach(model: nn.Module, records: Mapping[str, Any], raw: Mapping[str, Any],
           groups: tuple[str, ...], device: torch.device,
           compute_dtype: torch.dtype, bar: Any = None) -> Attached:
    """Swap composed modules into ``model`` for every record and table; add norm factors.

    Args:
        model: the student (its quantized linears hold the records' decode).
        records: module name → :class:`QuantizedWeight` / :class:`Int4Weight`.
        raw: stored tensor name → dense tensor or :class:`GroupAffine`; tables (GroupAffine) are
            composed wherever the model uses their parameter (a tied head too); 1-D norm weights
            get factors with ``groups`` ∋ "norms".
        groups, device, compute_dtype: see :class:`ComposedLinear`.
        bar: a progress bar advanced by one per record and per table (composing a lattice
            record decodes it), or None.

    Returns:
        :class:`Attached`; undo with :func:`detach`.
    """
    att = Attached()
    if device.type == "cuda":  # each swapped-out dense weight waits on the CPU
        att.parked = device

    def swap(name: str, new: nn.Module) -> None:
        old = _swap(model, name, new)
        att.originals[name] = old
        if att.parked is not None:
            old.to("cpu")

    try:
        for name, rec in records.items():
            module = model.get_submodule(name)
            bias = getattr(module, "bias", None)
            new = ComposedLinear(rec, bias, groups, device, compute_dtype)
            swap(name, new)
            att.linears[name] = new
            if bar is not None:
                bar.update(1)
        for tname, ga in raw.items():
            if not isinstance(ga, GroupAffine):
                continue
            param = model.get_parameter(tname)
            users = [(n, m) for n, m in model.named_modules(remove_duplicate=False)
                     if getattr(m, "weight", None) is param]
            lin_share: ComposedLinear | None = None
            for n, m in users:
                if isinstance(m, nn.Linear):
                    lin_share = ComposedLinear(ga, m.bias, groups, device, compute_dtype)
                    swap(n, lin_share)
                    att.linears[n] = lin_share
            for n, m in users:
                if isinstance(m, nn.Embedding):
                    emb = ComposedEmbedding(ga, groups, device, compute_dtype, share=lin_share,
                                            embed_scale=embedding_scale(m))
                    _check_same_rows(n, m, emb)
                    swap(n, emb)
                    att.embeddings[n] = emb
                    lin_share = lin_share or emb  # type: ignore[assignment]
                elif not isinstance(m, nn.Linear):
                    raise InvalidInput(f"table {tname} is used by {type(m).__name__} {n}")
            att.tables[tname] = tuple(n for n, _ in users)
            if bar is not None:
                bar.update(1)
        if "norms" in groups:
            for tname, t in raw.items():
                mod_name, _, leaf = tname.rpartition(".")
                if not (isinstance(t, torch.Tensor) and t.dim() == 1 and leaf == "weight"):
                    continue
                module = model.get_submodule(mod_name)
                if not _is_norm(module):
                    continue
                param = module.weight
                factor = _NormFactor(param).to(device)
                del module._parameters["weight"]
                module.weight = (factor.w0 * factor.nu).to(param.dtype)

                def hook(mod: nn.Module, args: Any, f: _NormFactor = factor) -> None:
                    mod.weight = f.w0 * f.nu

                att.hooks.append(module.register_forward_pre_hook(hook))
                att.norms[tname] = factor
                att.norm_params[tname] = param
    except BaseException:
        detach(model, att)
        raise
    return att


@torch.no_grad()
def _check_same_rows(name: str, original: nn.Module, composed: ComposedEmbedding) -> None:
    """Refuse to train through a composed embedding that does not give the rows ``original``
    gives (an embedding subclass whose forward does more than a lookup and ``embed_scale``)."""
    ids = torch.arange(min(8, composed.dims[0]), device=composed.codes.device)
    want = original(ids.to(original.weight.device)).float().to(ids.device)
    got = composed(ids).float()
    err = float((got - want).abs().max())
    if not err <= 1e-2 * float(want.abs().max()) + 1e-6:
        raise NotComposable(
            f"tuning: the embedding {name} ({type(original).__name__}) is not a table lookup "
            f"times embed_scale (its composed twin differs by {err:.3g}); quantize without "
            "tuning (--tune-steps 0)"
        )


def detach(model: nn.Module, att: Attached) -> None:
    """Put the original modules and norm parameters back (inverse of :func:`attach`).

    Ends the attachment: each composed module's buffers (its frozen parts) are released before
    its original returns to the device, so a CUDA device never holds both a weight's frozen parts
    and its dense original. :func:`fold` what was trained first.
    """
    for h in att.hooks:
        h.remove()
    for tname, param in att.norm_params.items():
        module = model.get_submodule(tname.rpartition(".")[0])
        if "weight" in module.__dict__:
            del module.__dict__["weight"]
        module.weight = param
    for name, module in att.originals.items():
        composed = _swap(model, name, module)
        for key in list(composed._buffers):
            composed._buffers[key] = None
        if att.parked is not None:
            module.to(att.parked)


def fold(att: Attached, records: Mapping[str, Any], raw: Mapping[str, Any]
         ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trained records and raw tensors (name → new value) from the current factors."""
    new_records = {n: att.linears[n].fold() for n in records}
    new_raw: dict[str, Any] = {}
    for tname, users in att.tables.items():
        first = users[0]
        mod = att.linears.get(first) or att.embeddings[first]
        new_raw[tname] = mod.fold()
    for n in records:
        b = att.linears[n].folded_bias()
        key = f"{n}.bias"
        if b is not None and isinstance(raw.get(key), torch.Tensor) and isinstance(
                att.linears[n].bias, nn.Parameter):
            new_raw[key] = b.to(raw[key].dtype)
    for tname, f in att.norms.items():
        with torch.no_grad():
            new_raw[tname] = (f.w0 * f.nu).detach().cpu().to(raw[tname].dtype)
    return new_records, new_raw


def set_raw(model: nn.Module, raw: Mapping[str, Any]) -> None:
    """Copy raw tensors (dense or the decode of a :class:`GroupAffine`) into ``model``."""
    for name, t in raw.items():
        param = model.get_parameter(name)
        value = t.dequantize(torch.float32) if isinstance(t, GroupAffine) else t
        with torch.no_grad():
            param.copy_(value.to(device=param.device, dtype=param.dtype))
