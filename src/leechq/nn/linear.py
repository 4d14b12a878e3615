"""``LeechqLinear``: the quantized linear module of ``leechq.load``, transformers and serving.

A module holds one canonical record — a lattice-coded :class:`~leechq.formats.quantized_weight.
QuantizedWeight` (ball or Tetra) or an :class:`~leechq.formats.quantized_weight.Int4Weight` — plus
an optional bias, and serves it through one of two execution paths fixed once by :meth:`finalize`:

* **dense** (the reference path; always used on CPU): the record is dequantized *once*, at finalize,
  into a natural-basis ``[d_out, d_in]`` weight of the serving dtype, and ``forward`` is
  ``F.linear``. Chosen over "rotate the activation, dot with the rotated-basis weight" because it is
  bit-identical to :meth:`QuantizedWeight.dequantize` (its f64 un-rotation) by construction,
  costs no rotation per call, and uses the CPU's fastest matmul. Its price is memory: the dense
  weight is resident, so the CPU path demonstrates quality, not compression.
* **fused** (CUDA, where a kernel of :mod:`leechq.kernels.select` can implement the record): the
  record is repacked into the kernel's layout at finalize; ``forward`` rotates the activation with
  the stored tables (lattice records) and calls the fused dequant+matvec. When no kernel can, the
  module falls back to the dense path and warns with every rejection reason. Lattice kernels
  multiply the activation rounded to 16 bits whatever the serving dtype (int4: the serving dtype);
  the output is in the serving dtype. The precision and its per-output tolerance are the contract
  of ``docs/contracts.md``. Under ``torch.compile`` the fused product is one opaque custom op
  (:mod:`leechq.nn.custom_ops`), so ``fullgraph=True`` traces it.

Nothing in ``forward`` reads a tensor value on the host, builds state, or branches on anything but
the number of activation rows (batch-size kernel selection, A4).

What this module does *not* do: parse artifacts (``leechq.formats.artifact``), decide which linears
are quantized (``leechq.nn.replace``), or pick kernels by itself (``leechq.kernels.select``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from leechq.errors import InvalidInput, KernelUnavailable
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables
from leechq.nn import custom_ops

Record = QuantizedWeight | Int4Weight
"""A canonical quantized matrix."""


class ReferencePathWarning(UserWarning):
    """A LeechqLinear on an accelerator runs the dense reference path; the message says why."""


@dataclass(frozen=True)
class Execution:
    """How a finalized module computes: ``path`` ("dense" or "fused"), the kernel name (fused) and,
    for the dense path on an accelerator, why no kernel was used; ``members``: the matrices the
    module computes (1 for a ``LeechqLinear``; a group's fused run: the matrices it holds)."""

    path: str
    device: str
    dtype: torch.dtype
    kernel: str | None = None
    reason: str | None = None
    members: int = 1


def record_kind(record: Record) -> str:
    """``"tetra"``, ``"ball"`` or ``"int4"``."""
    if isinstance(record, QuantizedWeight):
        return record.codebook
    if isinstance(record, Int4Weight):
        return "int4"
    raise InvalidInput(f"not a quantized record: {type(record).__name__}")


class LeechqLinear(nn.Module):
    """A linear layer whose weight is a canonical quantized record.

    Build it with :meth:`from_record` (the record is known) and call :meth:`finalize` once before
    the first ``forward``. Shapes follow ``nn.Linear``: ``x [..., in_features] -> y [...,
    out_features]``.

    Attributes:
        in_features, out_features: the matrix shape (``d_in``, ``d_out``).
        record: the canonical record, kept on the CPU (it is what ``state_dict`` serializes).
        bias: ``nn.Parameter [out_features]`` or None.
        execution: how the module computes once finalized (None before).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.record: Record | None = None
        self._canonical: dict[str, torch.Tensor] | None = None
        self.execution: Execution | None = None
        if bias:
            self.bias: nn.Parameter | None = nn.Parameter(
                torch.zeros(self.out_features), requires_grad=False
            )
        else:
            self.register_parameter("bias", None)
        # The dense path's weight: a non-persistent buffer, so .to() moves it, state_dict skips it.
        self.register_buffer("weight_dense", None, persistent=False)
        self._fused: Any = None
        self._fused_key = 0
        self._prefer = "auto"
        self._shared_rotation: Any = None
        self._forward_impl = self._forward_unfinalized

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_record(cls, record: Record, bias: torch.Tensor | None = None) -> LeechqLinear:
        """A module holding ``record`` (moved to the CPU) and ``bias [d_out]`` (any float dtype)."""
        module = cls(record.d_in, record.d_out, bias=bias is not None)
        module.set_record(record)
        if bias is not None:
            if tuple(bias.shape) != (record.d_out,):
                raise InvalidInput(
                    f"bias of shape {list(bias.shape)} for a record with d_out={record.d_out}"
                )
            module.bias = nn.Parameter(bias.detach().to("cpu").clone(), requires_grad=False)
        return module

    @classmethod
    def placeholder(cls, name: str, desc: Mapping[str, Any], bias: bool) -> LeechqLinear:
        """A module whose record is still to be loaded (the transformers path).

        Registers one buffer per artifact tensor of the record (``codes``, ``row_scales``, ... on
        the meta device when built under ``torch.device("meta")``) so that the host framework's
        loader fills them by name; :meth:`materialize` then turns them into the canonical record.

        Args:
            name: module name (for messages).
            desc: the record descriptor of ``quantization_config.records``.
            bias: whether the replaced linear had a bias.
        """
        from leechq.nn.records import record_tensor_specs

        module = cls(int(desc["d_in"]), int(desc["d_out"]), bias=bias)
        module.descriptor = dict(desc)
        module.record_name = name
        for suffix, (shape, dtype) in record_tensor_specs(desc).items():
            module.register_buffer(suffix, torch.empty(shape, dtype=dtype))
        return module

    def materialize(self, rotations: Mapping[str, RotationTables]) -> Record:
        """Build the canonical record from the loaded placeholder buffers, then drop the buffers.

        Raises:
            ArtifactError: a buffer was never loaded, or holds an inconsistent record.
        """
        from leechq.nn.records import record_from_tensors, record_tensor_specs

        desc = getattr(self, "descriptor", None)
        if desc is None:
            raise InvalidInput("LeechqLinear.materialize: not a placeholder module")
        suffixes = list(record_tensor_specs(desc))
        tensors = {s: getattr(self, s) for s in suffixes}
        record = record_from_tensors(self.record_name, desc, tensors, rotations)
        for s in suffixes:
            delattr(self, s)
        del self.descriptor
        self.set_record(record)
        # The loaded bytes are the canonical tensors: keep them (on the CPU) for state_dict.
        self._canonical = {k: v.detach().to("cpu") for k, v in tensors.items()}
        return record

    def set_record(self, record: Record) -> None:
        """Attach (or replace) the canonical record; the module must be finalized again after."""
        if not isinstance(record, (QuantizedWeight, Int4Weight)):
            raise InvalidInput(
                f"LeechqLinear needs a QuantizedWeight or Int4Weight, got {type(record)}"
            )
        if (record.d_out, record.d_in) != (self.out_features, self.in_features):
            raise InvalidInput(
                f"record of shape [{record.d_out}, {record.d_in}] for a LeechqLinear of shape "
                f"[{self.out_features}, {self.in_features}]"
            )
        self.record = record
        self._canonical = None
        self.execution = None
        self.weight_dense = None
        self._fused = None
        self._forward_impl = self._forward_unfinalized

    @property
    def kind(self) -> str:
        """``"tetra"``, ``"ball"`` or ``"int4"`` (``"unset"`` before a record is attached)."""
        return "unset" if self.record is None else record_kind(self.record)

    # ------------------------------------------------------------------ finalize

    def finalize(
        self,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        *,
        prefer: str = "auto",
        fused_runtime: Any = None,
    ) -> Execution:
        """Prepare the record for ``forward`` on ``device`` (all repacking happens here, A4).

        Args:
            device: target device (default: the bias's device, else CPU).
            dtype: activation and output dtype (float32, float16 or bfloat16).
            prefer: "auto" (on an accelerator: fused where a Triton kernel can implement the
                record, dense otherwise, with a :class:`ReferencePathWarning` giving the reasons;
                on the CPU: dense), "reference" (always dense) or "fused" (a Triton kernel or
                :class:`KernelUnavailable`; on the CPU only under ``TRITON_INTERPRET=1``).
            fused_runtime: a shared per-device runtime from :func:`leechq.nn.fused.runtime_for`
                (rotation tables cached once per group); built on demand when None.

        Returns:
            The chosen :class:`Execution`.

        Raises:
            InvalidInput: no record attached, or an unsupported dtype/preference.
            KernelUnavailable: ``prefer="fused"`` and no kernel can implement the record.
        """
        if self.record is None:
            raise InvalidInput("LeechqLinear.finalize: no record attached (build with from_record)")
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise InvalidInput(f"LeechqLinear serves float32/float16/bfloat16, not {dtype}")
        if prefer not in ("auto", "reference", "fused"):
            raise InvalidInput(f"prefer must be 'auto', 'reference' or 'fused', got {prefer!r}")
        if device is None:
            device = self.bias.device if self.bias is not None else torch.device("cpu")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self._prefer = prefer
        if device.type == "meta":
            raise InvalidInput("LeechqLinear.finalize: cannot finalize on the meta device")
        if self.bias is not None:
            self.bias = nn.Parameter(
                self.bias.detach().to(device=device, dtype=dtype), requires_grad=False
            )
        reason: str | None = None
        # CPU + "auto" goes straight to the dense path; "fused" on the CPU is honoured when the
        # Triton interpreter is on (TRITON_INTERPRET=1: the CI route to the kernels).
        if prefer == "fused" or (prefer == "auto" and device.type != "cpu"):
            from leechq.nn import fused

            try:
                plan = fused.plan(self.record, device, dtype, runtime=fused_runtime)
            except KernelUnavailable as exc:
                if prefer == "fused":
                    raise
                reason = str(exc)
            else:
                self.weight_dense = None
                plan.shared = self._shared_rotation
                self._fused = plan
                self._fused_key = custom_ops.register(plan)
                self._forward_impl = self._forward_fused
                self.execution = Execution("fused", str(device), dtype, kernel=plan.kernel_name)
                return self.execution
        self.weight_dense = self.record.dequantize(torch.float32).to(device=device, dtype=dtype)
        self._fused = None
        self._forward_impl = self._forward_dense
        self.execution = Execution("dense", str(device), dtype, reason=reason)
        if reason is not None:
            warnings.warn(
                f"LeechqLinear [{self.out_features}x{self.in_features}, {self.kind}] on {device} "
                "runs the "
                f"dense reference path: {reason}",
                ReferencePathWarning,
                stacklevel=2,
            )
        return self.execution

    def share_rotation(self, slot: Any) -> None:
        """Use ``slot`` (a :class:`leechq.nn.fused.SharedRotation`) for the input rotation, shared
        with the other modules that read the same activation (fused path only)."""
        self._shared_rotation = slot
        if self._fused is not None:
            self._fused.shared = slot

    def _apply(self, fn: Any, recurse: bool = True) -> LeechqLinear:
        # ``.to(device)`` / ``.half()`` of a finalized module: the served form (a packed plan or
        # the dense weight) is rebuilt from the record for the new device and dtype, with the same
        # preference; the old dense weight is dropped first so it is not copied for nothing.
        ex = self.execution
        if ex is None:
            return super()._apply(fn, recurse)
        before = torch.empty(0, device=ex.device, dtype=ex.dtype)
        after = fn(before)
        dtype = after.dtype if after.dtype in (torch.float32, torch.float16,
                                               torch.bfloat16) else ex.dtype
        if after.device == before.device and dtype == ex.dtype:
            return super()._apply(fn, recurse)
        self.weight_dense = None
        super()._apply(fn, recurse)
        self.finalize(after.device, dtype, prefer=self._prefer)
        return self

    # ------------------------------------------------------------------ forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``y = x Wᵀ + b``: x [..., in_features] -> y [..., out_features] (the finalize dtype)."""
        return self._forward_impl(x)

    def _forward_unfinalized(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(
            f"LeechqLinear [{self.out_features}x{self.in_features}] was never finalized: call "
            "finalize(device, dtype) (leechq.load and the transformers quantizer do it on load)"
        )

    def _forward_dense(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_dense, self.bias)

    def _forward_fused(self, x: torch.Tensor) -> torch.Tensor:
        # One opaque custom op while compiling (leechq.nn.custom_ops), the plan itself otherwise.
        y = custom_ops.fused_linear(x, self._fused_key, self.out_features, self.execution.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y

    # ------------------------------------------------------------------ serialization

    def _save_to_state_dict(
        self, destination: dict[str, Any], prefix: str, keep_vars: bool
    ) -> None:
        # The canonical record is what a LeechqLinear serializes, never its served form: the same
        # tensors the artifact holds, so save → load is byte-identical.
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.record is not None:
            if self._canonical is None:  # packed once, then kept (about 2 bits per weight)
                from leechq.nn.records import record_tensors

                self._canonical = record_tensors(self.record)
            for name, tensor in self._canonical.items():
                destination[prefix + name] = tensor

    def extra_repr(self) -> str:
        path = self.execution.path if self.execution is not None else "unfinalized"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, kind={self.kind}, path={path}"
        )
