"""Mixture-of-experts weights stored as one 3-D parameter, split into one linear per expert matrix.

transformers 5 stores the experts of Qwen3-MoE, Mixtral and friends as a module (``*Experts``) with
two 3-D parameters: ``gate_up_proj`` [experts, 2·intermediate, hidden] (gate rows, then up rows) and
``down_proj`` [experts, hidden, intermediate], and a forward ``(hidden_states [tokens, hidden],
top_k_index [tokens, k], top_k_weights [tokens, k]) → [tokens, hidden]``. The quantizer and the
loaders work on ``nn.Linear`` modules, one record per module, so :func:`split_experts` replaces each
such module by :class:`ExpertLinears`: the same computation over ``ModuleList``\\ s of linears named
``gate_up_proj.<e>`` and ``down_proj.<e>`` — each expert's matrices are their own records (own rows,
own row scales, own Hessian from the tokens routed to that expert). The dense split is exact (the
rows are copied), so a split model computes what the fused one does.

Only the layout above is accepted: transposed storage or expert biases are refused with a clear
error rather than guessed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from leechq.errors import UnsupportedArchitecture


class ExpertLinears(nn.Module):
    """The experts of one sparse MLP as separate linears (the eager forward of transformers'
    ``*Experts`` modules).

    Attributes:
        num_experts: experts.
        gate_up_proj: ``ModuleList`` of ``nn.Linear(hidden, 2·intermediate)`` (gate rows first).
        down_proj: ``ModuleList`` of ``nn.Linear(intermediate, hidden)``.
        act_fn: the activation applied to the gate half.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, act_fn: nn.Module):
        super().__init__()
        self.num_experts = num_experts
        self.gate_up_proj = nn.ModuleList(
            nn.Linear(hidden, 2 * intermediate, bias=False) for _ in range(num_experts)
        )
        self.down_proj = nn.ModuleList(
            nn.Linear(intermediate, hidden, bias=False) for _ in range(num_experts)
        )
        self.act_fn = act_fn

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """Route each token to its experts and sum their weighted outputs.

        Args:
            hidden_states: [tokens, hidden].
            top_k_index: int64 [tokens, k] chosen experts.
            top_k_weights: [tokens, k] their weights.

        Returns:
            [tokens, hidden] in the dtype of ``hidden_states``.
        """
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            if not 0 <= e < self.num_experts:
                continue
            token_idx, pos = torch.where(top_k_index == e)
            x = hidden_states[token_idx]
            gate, up = self.gate_up_proj[e](x).chunk(2, dim=-1)
            y = self.down_proj[e](self.act_fn(gate) * up)
            y = y * top_k_weights[token_idx, pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out


def is_fused_experts(module: nn.Module) -> bool:
    """Whether ``module`` keeps its experts as 3-D ``gate_up_proj``/``down_proj`` parameters."""
    params = module._parameters
    gu, down = params.get("gate_up_proj"), params.get("down_proj")
    return gu is not None and down is not None and gu.dim() == 3 and down.dim() == 3


def _check(name: str, module: nn.Module) -> tuple[int, int, int]:
    gu, down = module.gate_up_proj, module.down_proj
    extra = sorted(set(module._parameters) - {"gate_up_proj", "down_proj"})
    if extra or getattr(module, "is_transposed", False) or getattr(module, "has_bias", False):
        raise UnsupportedArchitecture(
            f"{name} ({type(module).__name__}) stores its experts with "
            f"{'parameters ' + ', '.join(extra) if extra else 'a transposed or biased layout'}; "
            "leechq splits only gate_up_proj [E, 2I, H] and down_proj [E, H, I]"
        )
    e, two_i, h = gu.shape
    if two_i % 2 or tuple(down.shape) != (e, h, two_i // 2) or not hasattr(module, "act_fn"):
        raise UnsupportedArchitecture(
            f"{name} ({type(module).__name__}): gate_up_proj {list(gu.shape)} and down_proj "
            f"{list(down.shape)} are not the [E, 2I, H] / [E, H, I] expert layout leechq splits"
        )
    return e, h, two_i // 2


def split_experts(model: nn.Module, copy_weights: bool = True) -> list[str]:
    """Replace every fused-experts module of ``model`` by an :class:`ExpertLinears`.

    Args:
        model: any module tree (a meta skeleton included: with ``copy_weights=False`` the new
            linears are created on the device of the fused parameters and left uninitialized).
        copy_weights: copy each expert's rows into its linear.

    Returns:
        The qualified names of the replaced modules.

    Raises:
        UnsupportedArchitecture: a fused-experts module of another layout.
    """
    targets = [(n, m) for n, m in model.named_modules() if n and is_fused_experts(m)]
    for name, module in targets:
        e, h, i = _check(name, module)
        gu, down = module.gate_up_proj, module.down_proj
        with torch.device(gu.device):
            new = ExpertLinears(e, h, i, module.act_fn).to(gu.dtype)
        new.requires_grad_(gu.requires_grad)
        if copy_weights and gu.device.type != "meta":
            with torch.no_grad():
                for k in range(e):
                    new.gate_up_proj[k].weight.copy_(gu[k])
                    new.down_proj[k].weight.copy_(down[k])
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, new)
    return [n for n, _ in targets]


def needs_split(record_names: Any) -> bool:
    """Whether artifact records name split experts (``…gate_up_proj.<e>``, ``…down_proj.<e>``)."""
    for name in record_names:
        parts = str(name).rsplit(".", 2)
        if len(parts) == 3 and parts[1] in ("gate_up_proj", "down_proj") and parts[2].isdigit():
            return True
    return False
