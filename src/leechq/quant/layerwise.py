"""The sequential, resumable block-by-block driver (generic: no model-specific code).

Implements the sequential procedure of docs/quantizer.md §2. For transformer block t:

1. pass 1: push the calibration hidden states, which already went through the *quantized* blocks
   0..t−1, through block t with its *original* weights, accumulating one Hessian per distinct linear
   input (act 0..3);
2. per activation: rotate with the effective seed ``rotation_seed(t, act)``, damp, factor once (an
   input no calibration row reached — an expert never routed to — gets the identity Hessian);
3. code every linear of the block (block GPTQ, or int4 for the matrices the config keeps at 4 bits)
   and write the dequantized weights back into the module (the exact weights the artifact decodes
   to, P13). The GPTQ loops of all lattice linears of the block run concurrently
   (:func:`leechq.quant.gptq.gptq_quantize_many`: one coder call per column step serves every
   matrix), and the evaluated weights are un-rotated on the compute device;
4. pass 2: advance the hidden states through the now-quantized block.

The model glue describes each block as a :class:`Block` (its linears, which activation each reads, a
forward over one batch of hidden states, and how to move it to the compute device). Memory is
bounded by one block plus the hidden states. After each block the driver can commit a checkpoint
(that block's records and the advanced hidden states, written atomically); a restarted run with the
same run identity skips finished blocks, and a different identity is refused (pitfall P12).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

from leechq.codebooks.base import BLOCK
from leechq.config import QuantConfig
from leechq.errors import ArtifactError, InvalidInput, LeechqError
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.formats.rotation import RotationTables, generate_rotation, rotation_seed
from leechq.quant.coders import BlockCoder, IdentityCoder, ScalarRoundCoder, ShapeGainCoder
from leechq.quant.gptq import GPTQJob, GPTQResult, gptq_quantize_many, quantize_int4
from leechq.quant.hessian import HessianAccumulator, capture_inputs, prepare_factor

log = logging.getLogger("leechq.quant")

Record = QuantizedWeight | Int4Weight | GPTQResult
"""What the driver produces per linear: a lattice record, an int4 record, or (control coders only) a
:class:`GPTQResult` that is not a storable code."""


@dataclass
class LinearSpec:
    """One linear layer of a block.

    Attributes:
        name: full module name (e.g. ``model.layers.3.self_attn.q_proj``), the record key.
        module: the ``torch.nn.Linear`` (its ``weight`` is replaced by the dequantized matrix).
        act: index of the input activation it reads (0: attention input, 1: attention output,
            2: MLP input, 3: MLP product); linears with the same act share a Hessian and a rotation.
        int4: keep this matrix as int4 instead of the lattice.
    """

    name: str
    module: torch.nn.Module
    act: int
    int4: bool = False


class Block(Protocol):
    """A transformer block as the driver sees it."""

    index: int
    linears: list[LinearSpec]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """One batch of hidden states [batch, seq, d] → the block's output (same shape)."""
        ...

    def activate(self, device: torch.device, dtype: torch.dtype) -> AbstractContextManager[None]:
        """Context in which the block lives on ``device`` in ``dtype`` (restored on exit)."""
        ...


def make_coder(config: QuantConfig) -> BlockCoder:
    """The block coder named by the config: a registered codebook with shape–gain coding, or one of
    the controls ("identity", "scalar-round")."""
    if config.codebook == "identity":
        return IdentityCoder()
    if config.codebook == "scalar-round":
        return ScalarRoundCoder()
    return ShapeGainCoder(config.codebook, config.gain_bits, config.centroid_iters)


def resolve_device(name: str) -> torch.device:
    """ "auto" → CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidInput("config.device is 'cuda' but no CUDA device is available")
    return torch.device(name)


# --------------------------------------------------------------------------------------------------
# progress


class Progress:
    """Progress over matrices with the block position in the description (P4: true totals).

    Attributes:
        n_blocks: blocks in the run.
        total: matrices in the run.
        done: matrices finished (including those skipped on resume).
    """

    def __init__(self, n_blocks: int, total: int, enabled: bool = True, initial: int = 0):
        self.n_blocks = n_blocks
        self.total = total
        self.done = initial
        self._bar = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                initial=initial,
                unit="matrix",
                dynamic_ncols=True,
                desc=f"leechq block ?/{n_blocks}",
            )

    def block(self, t: int) -> None:
        if self._bar is not None:
            self._bar.set_description(f"leechq block {t + 1}/{self.n_blocks}")

    def matrix(self, name: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(name)

    def step(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# --------------------------------------------------------------------------------------------------
# checkpoints


def _rotation_tensors(
    prefix: str, rot: RotationTables | None, out: dict[str, torch.Tensor]
) -> None:
    if rot is not None:
        out[f"{prefix}.rot_signs"] = torch.from_numpy(rot.signs.copy())
        out[f"{prefix}.rot_small"] = torch.from_numpy(rot.small.copy())


def _load_rotation(
    prefix: str, meta: dict[str, Any], t: dict[str, torch.Tensor]
) -> RotationTables | None:
    if meta.get("seed") is None:
        return None
    return RotationTables(
        n=meta["d_in"],
        seed=int(meta["seed"]),
        signs=t[f"{prefix}.rot_signs"].numpy(),
        small=t[f"{prefix}.rot_small"].numpy(),
    )


def records_to_tensors(
    records: dict[str, Record],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Flatten records into named tensors + a JSON-able description (the checkpoint form)."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    for name, rec in records.items():
        if isinstance(rec, QuantizedWeight):
            for f in ("labels", "gains", "row_scales", "centroids", "tail"):
                tensors[f"{name}.{f}"] = getattr(rec, f).contiguous()
            _rotation_tensors(name, rec.rotation, tensors)
            meta[name] = {
                "kind": "lattice",
                "codebook": rec.codebook,
                "d_out": rec.d_out,
                "d_in": rec.d_in,
                "seed": None if rec.rotation is None else str(rec.rotation.seed),
            }
        elif isinstance(rec, Int4Weight):
            for f in ("qweight", "scales", "biases"):
                tensors[f"{name}.{f}"] = getattr(rec, f).contiguous()
            meta[name] = {"kind": "int4", "d_out": rec.d_out, "d_in": rec.d_in, "group": rec.group}
        elif isinstance(rec, GPTQResult):
            for f in ("weight_rot", "labels", "gains", "row_scales", "centroids"):
                tensors[f"{name}.{f}"] = getattr(rec, f).cpu().contiguous()
            _rotation_tensors(name, rec.rotation, tensors)
            meta[name] = {
                "kind": "control",
                "coder": rec.coder,
                "lattice": rec.lattice,
                "d_in": rec.d_in,
                "seed": None if rec.rotation is None else str(rec.rotation.seed),
            }
        else:
            raise InvalidInput(f"{name}: cannot checkpoint a record of type {type(rec).__name__}")
    return tensors, meta


def records_from_tensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> dict[str, Record]:
    """Inverse of :func:`records_to_tensors`."""
    out: dict[str, Record] = {}
    for name, m in meta.items():
        if m["kind"] == "lattice":
            out[name] = QuantizedWeight(
                codebook=m["codebook"],
                d_out=m["d_out"],
                d_in=m["d_in"],
                labels=tensors[f"{name}.labels"],
                gains=tensors[f"{name}.gains"],
                row_scales=tensors[f"{name}.row_scales"],
                centroids=tensors[f"{name}.centroids"],
                tail=tensors[f"{name}.tail"],
                rotation=_load_rotation(name, m, tensors),
            )
        elif m["kind"] == "int4":
            out[name] = Int4Weight(
                d_out=m["d_out"],
                d_in=m["d_in"],
                qweight=tensors[f"{name}.qweight"],
                scales=tensors[f"{name}.scales"],
                biases=tensors[f"{name}.biases"],
                group=m["group"],
            )
        else:
            out[name] = GPTQResult(
                coder=m["coder"],
                lattice=m["lattice"],
                weight_rot=tensors[f"{name}.weight_rot"],
                labels=tensors[f"{name}.labels"],
                gains=tensors[f"{name}.gains"],
                row_scales=tensors[f"{name}.row_scales"],
                centroids=tensors[f"{name}.centroids"],
                rotation=_load_rotation(name, m, tensors),
            )
    return out


def _atomic_save(
    tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None
) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _atomic_write_text(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Checkpoint:
    """A resumable run directory.

    Layout: ``run.json`` (run identity, blocks done, per-block stats; the commit point, written
    last), ``block_NNNN.safetensors`` (that block's records), ``states_NNNN.safetensors`` (hidden
    states after block NNNN; only the latest is kept). A crash loses at most the block in flight.

    Args:
        directory: where to keep the run (created if missing).
        run_id: identity of the run (config digest + model + calibration); a directory holding a
            different identity is refused.
        n_blocks: number of blocks of the run.
    """

    def __init__(self, directory: str | os.PathLike[str], run_id: str, n_blocks: int):
        self.dir = Path(directory)
        self.run_id = run_id
        self.n_blocks = n_blocks
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state = self._load_or_init()

    def _load_or_init(self) -> dict[str, Any]:
        path = self.dir / "run.json"
        if not path.exists():
            return {"run_id": self.run_id, "n_blocks": self.n_blocks, "done": 0, "stats": {}}
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"checkpoint {path} is unreadable: {exc}") from exc
        if not isinstance(state, dict):
            raise ArtifactError(f"checkpoint {path} is not a JSON object")
        done, stats = state.get("done"), state.get("stats")
        if not isinstance(done, int) or isinstance(done, bool) or not 0 <= done <= self.n_blocks:
            raise ArtifactError(
                f"checkpoint {path}: field 'done' must be an integer in [0, {self.n_blocks}], "
                f"got {done!r}"
            )
        if not isinstance(stats, dict):
            raise ArtifactError(f"checkpoint {path}: field 'stats' must be an object")
        if state.get("run_id") != self.run_id or state.get("n_blocks") != self.n_blocks:
            raise InvalidInput(
                f"checkpoint {self.dir} belongs to a different run (run id "
                f"{state.get('run_id')!r}, {state.get('n_blocks')} blocks) than this one "
                f"({self.run_id!r}, {self.n_blocks} blocks): the configuration, model or "
                "calibration data changed; use a new checkpoint directory"
            )
        return state

    @property
    def done(self) -> int:
        """Blocks committed."""
        return int(self.state["done"])

    def load_block(self, t: int) -> dict[str, Record]:
        path = self.dir / f"block_{t:04d}.safetensors"
        try:
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as fh:
                meta = json.loads((fh.metadata() or {})["records"])
            tensors = load_file(str(path))
        except Exception as exc:  # corrupt or missing: name the file
            raise ArtifactError(f"checkpoint file {path} is unreadable: {exc}") from exc
        try:
            return records_from_tensors(tensors, meta)
        except LeechqError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            raise ArtifactError(f"checkpoint file {path} is inconsistent: {exc!r}") from exc

    def load_states(self) -> list[torch.Tensor]:
        path = self.dir / f"states_{self.done - 1:04d}.safetensors"
        try:
            tensors = load_file(str(path))
        except Exception as exc:
            raise ArtifactError(f"checkpoint file {path} is unreadable: {exc}") from exc
        try:
            return [tensors[f"states.{i}"] for i in range(len(tensors))]
        except KeyError as exc:
            raise ArtifactError(f"checkpoint file {path} lacks {exc}") from exc

    def commit(
        self,
        t: int,
        records: dict[str, Record],
        states: Sequence[torch.Tensor],
        stats: dict[str, Any],
    ) -> None:
        """Write block t's records and the states after block t, then advance ``run.json``."""
        self.write(*self.prepare(t, records, states, stats))

    def prepare(
        self,
        t: int,
        records: dict[str, Record],
        states: Sequence[torch.Tensor],
        stats: dict[str, Any],
    ) -> tuple[int, dict[str, torch.Tensor], dict[str, Any], list[torch.Tensor], dict[str, Any]]:
        """The host copies :meth:`write` needs (made by the caller's thread, on its stream)."""
        if t != self.done:
            raise InvalidInput(f"checkpoint expects block {self.done}, got {t}")
        tensors, meta = records_to_tensors(records)
        host_states = [s.detach().cpu().contiguous() for s in states]
        return t, tensors, meta, host_states, stats

    def write(
        self,
        t: int,
        tensors: dict[str, torch.Tensor],
        meta: dict[str, Any],
        host_states: list[torch.Tensor],
        stats: dict[str, Any],
    ) -> None:
        """Write prepared host tensors (any thread): block file, states file, then ``run.json``."""
        if t != self.done:
            raise InvalidInput(f"checkpoint expects block {self.done}, got {t}")
        _atomic_save(
            tensors, self.dir / f"block_{t:04d}.safetensors", {"records": json.dumps(meta)}
        )
        _atomic_save(
            {f"states.{i}": s for i, s in enumerate(host_states)},
            self.dir / f"states_{t:04d}.safetensors",
        )
        self.state["done"] = t + 1
        self.state["stats"][str(t)] = stats
        _atomic_write_text(json.dumps(self.state, indent=1, sort_keys=True), self.dir / "run.json")
        old = self.dir / f"states_{t - 1:04d}.safetensors"
        if t > 0 and old.exists():
            old.unlink()

    def remove(self) -> None:
        """Delete the checkpoint directory (after a successful run)."""
        shutil.rmtree(self.dir, ignore_errors=True)


class BackgroundCommits:
    """Checkpoint writes in a background thread, one block at a time.

    Writing a block (its records and the hidden states: 2 GiB for 64×2048 tokens of a 4096-wide
    model, plus an fsync) then overlaps the next block's compute. The host copies are made by the
    caller (:meth:`Checkpoint.prepare`); the thread only writes files. :meth:`wait` joins the write
    in flight and re-raises its error; the caller always waits before the next write and before
    returning, so at most one block is in flight and ``run.json`` stays the commit point.
    """

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self._thread: threading.Thread | None = None
        self._block: int | None = None
        self._error: BaseException | None = None

    def start(
        self, t: int, records: dict[str, Record], states: Sequence[torch.Tensor], stats: dict
    ) -> None:
        """Begin writing block t (the previous write must have been waited for)."""
        if self._thread is not None:
            raise InvalidInput("a checkpoint write is still in flight")
        job = self.ckpt.prepare(t, records, states, stats)

        def run() -> None:
            try:
                self.ckpt.write(*job)
            except BaseException as exc:  # re-raised by wait() in the driver's thread
                self._error = exc

        self._block = t
        self._thread = threading.Thread(target=run, name=f"leechq-commit-{t}")
        self._thread.start()

    def wait(self, raise_errors: bool = True) -> int | None:
        """Join the write in flight; returns its block (None if there was none)."""
        if self._thread is None:
            return None
        self._thread.join()
        block, error = self._block, self._error
        self._thread, self._block, self._error = None, None, None
        if error is not None and raise_errors:
            raise error
        return block


# --------------------------------------------------------------------------------------------------
# the driver


@dataclass
class RunResult:
    """What :func:`quantize_blocks` returns.

    Attributes:
        records: linear name → record, in block order.
        stats: linear name → {"rel_err": ‖ΔW‖²/‖W‖², "proxy": Tr(ΔW H ΔWᵀ)/Tr(W H Wᵀ), "seconds"}.
        seconds: wall time of the blocks run in this call.
        resumed_blocks: blocks taken from the checkpoint.
        phase_seconds: wall time per phase, summed over the blocks run in this call: "hessians"
            (pass 1), "factor" (rotate, damp, factor), "gptq" (the concurrent loops, setup and
            codes included), "records" (records, evaluated weights, stats), "forward" (pass 2),
            "commit" (checkpoint).
    """

    records: dict[str, Record] = field(default_factory=dict)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    resumed_blocks: int = 0
    phase_seconds: dict[str, float] = field(default_factory=dict)


def _dense(record: Record) -> torch.Tensor:
    return record.dequantize(torch.float32)


def _set_weight(module: torch.nn.Module, dense: torch.Tensor) -> None:
    weight = module.weight
    if tuple(weight.shape) != tuple(dense.shape):
        raise InvalidInput(f"weight shape {list(weight.shape)} != decoded {list(dense.shape)}")
    with torch.no_grad():
        weight.copy_(dense.to(device=weight.device, dtype=weight.dtype))


class PhaseTimer:
    """Wall time per phase of the driver, summed over blocks (seconds).

    On an accelerator the clock is read after a device synchronize, so a phase is charged with the
    work it queued (a handful of syncs per block, nothing inside the loops).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def start(self) -> None:
        """Restart the clock (nothing charged)."""
        self._last = self._now()

    def mark(self, phase: str) -> float:
        """Charge the time since the last mark to ``phase``; returns it."""
        now = self._now()
        dt = now - self._last
        self._last = now
        self.seconds[phase] = self.seconds.get(phase, 0.0) + dt
        return dt


@dataclass
class _ActFactors:
    h: torch.Tensor
    tables: RotationTables | None
    u_rot: torch.Tensor | None
    u_nat: torch.Tensor | None


def _factors(
    t: int,
    act: int,
    specs: list[LinearSpec],
    h: torch.Tensor,
    config: QuantConfig,
) -> _ActFactors:
    """Rotation tables and factors of one activation's Hessian (shared by its linears)."""
    names = ", ".join(s.name for s in specs)
    needs_lattice = any(not s.int4 for s in specs)
    needs_natural = any(s.int4 for s in specs) and config.int4_gptq
    tables = (
        generate_rotation(h.shape[0], rotation_seed(t, act, config.rotation_seed))
        if config.rotate
        else None
    )
    label = f"Hessian of block {t} act {act} ({names})"
    u_rot = (
        prepare_factor(h, tables, config.damping, label)
        if needs_lattice and config.error_feedback
        else None
    )
    u_nat = prepare_factor(h, None, config.damping, label) if needs_natural else None
    return _ActFactors(h=h, tables=tables, u_rot=u_rot, u_nat=u_nat)


def _quantize_block(
    block: Block,
    states: list[torch.Tensor],
    config: QuantConfig,
    coder: BlockCoder,
    device: torch.device,
    progress: Progress,
    timer: PhaseTimer | None = None,
) -> tuple[dict[str, Record], dict[str, Any]]:
    t = block.index
    timer = timer or PhaseTimer(device)
    hess_dtype = torch.float64 if config.hessian_dtype == "float64" else torch.float32
    by_act: dict[int, list[LinearSpec]] = {}
    for spec in block.linears:
        by_act.setdefault(spec.act, []).append(spec)
    records: dict[str, Record] = {}
    stats: dict[str, Any] = {}
    # Pass 1: original weights, Hessians of the distinct inputs (batched addmm on the device).
    accs = {
        a: HessianAccumulator(int(specs[0].module.weight.shape[1]), device, hess_dtype)
        for a, specs in by_act.items()
    }
    with torch.no_grad(), capture_inputs({a: specs[0].module for a, specs in by_act.items()}, accs):
        for batch in states:
            block.forward(batch.to(device))
    timer.mark("hessians")
    factors: dict[int, _ActFactors] = {}
    for act, specs in by_act.items():
        if accs[act].rows:
            h = accs[act].finalize()
        else:
            # No calibration token reached this input (an expert the router never chose): with no
            # data about the input, every direction weighs the same.
            log.info(
                "block %d act %d (%s): no calibration rows, identity Hessian", t, act, specs[0].name
            )
            h = torch.eye(accs[act].dim, dtype=torch.float64, device=accs[act].sum.device)
        del accs[act].sum
        factors[act] = _factors(t, act, specs, h, config)
    timer.mark("factor")
    # Every lattice matrix of the block runs its GPTQ loop concurrently: one coder call per step
    # serves the current column group of all of them (gptq_quantize_many).
    lattice = [s for s in block.linears if not s.int4]
    jobs = [
        GPTQJob(
            weight=s.module.weight.detach().to(torch.float32),
            u=factors[s.act].u_rot,
            rotation=factors[s.act].tables,
            tail_policy=config.tail_policy,
            name=s.name,
        )
        for s in lattice
    ]
    for s in lattice:
        progress.matrix(".".join(s.name.split(".")[-2:]))
    coded = gptq_quantize_many(jobs, coder, propagation=config.propagation)
    results = dict(zip([s.name for s in lattice], coded, strict=True))
    loop_seconds = timer.mark("gptq")
    loop_blocks = sum(int(j.weight.numel()) // BLOCK for j in jobs) or 1
    del jobs
    for spec in block.linears:
        start = time.perf_counter()
        w = spec.module.weight.detach().to(torch.float32)
        fac = factors[spec.act]
        rec: Record
        share = 0.0
        if spec.int4:
            progress.matrix(".".join(spec.name.split(".")[-2:]))
            rec = quantize_int4(w, fac.u_nat, config.int4_group, name=spec.name)
            dense = rec.dequantize(torch.float32).to(device)
        else:
            res = results.pop(spec.name)
            rec = res.to_quantized_weight() if res.lattice else res
            # The evaluated matrix, un-rotated on the device; equal to rec.dequantize() (P13).
            dense = res.dequantize(torch.float32).to(device)
            share = loop_seconds * (int(w.numel()) // BLOCK) / loop_blocks
            del res
        delta = dense.to(torch.float64) - w.to(torch.float64)
        w64 = w.to(torch.float64)
        hd = fac.h.to(device)
        stats[spec.name] = {
            "rel_err": float((delta * delta).sum() / (w64 * w64).sum().clamp_min(1e-300)),
            "proxy": float(
                ((delta @ hd) * delta).sum() / ((w64 @ hd) * w64).sum().clamp_min(1e-300)
            ),
            # wall time: own finishing (and int4 coding) plus this matrix's share (by blocks) of
            # the concurrent loop
            "seconds": time.perf_counter() - start + share,
        }
        _set_weight(spec.module, dense)
        records[spec.name] = rec
        progress.step()
    del factors
    timer.mark("records")
    return records, stats


def quantize_blocks(
    blocks: Sequence[Block],
    states: list[torch.Tensor],
    config: QuantConfig,
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    run_id: str | None = None,
    progress: bool = True,
    on_block: Callable[[int], None] | None = None,
) -> RunResult:
    """Quantize ``blocks`` sequentially (docs/quantizer.md §2).

    Args:
        blocks: the model's transformer blocks in order (see :class:`Block`).
        states: calibration hidden states entering block 0, one tensor [batch, seq, d] per forward
            batch; consumed (advanced in place of the list).
        config: the resolved configuration.
        checkpoint_dir: if given, commit each finished block there and resume from it.
        run_id: identity of the run for the checkpoint (defaults to the config digest; the block
            layout is always added).
        progress: show a tqdm bar.
        on_block: called with t after block t is committed (tests use it to simulate a crash).
            With a checkpoint, block t is written in the background while block t+1 computes, and
            the call comes once that write has finished (before block t+1's write starts).

    Returns:
        :class:`RunResult` with every linear's record (the modules hold the decoded weights).
    """
    if not blocks:
        raise InvalidInput("quantize_blocks needs at least one block")
    if not states:
        raise InvalidInput("quantize_blocks needs calibration hidden states")
    device = resolve_device(config.device)
    dtype = getattr(torch, config.dtype)
    coder = make_coder(config)
    layout = [
        [(s.name, s.act, s.int4, tuple(s.module.weight.shape)) for s in b.linears] for b in blocks
    ]
    ident = run_id or config.digest()
    import hashlib

    run_key = hashlib.sha256(json.dumps([ident, layout]).encode()).hexdigest()[:32]
    ckpt = Checkpoint(checkpoint_dir, run_key, len(blocks)) if checkpoint_dir is not None else None
    result = RunResult()
    start_block = 0
    if ckpt is not None and ckpt.done:
        start_block = ckpt.done
        for t in range(start_block):
            recs = ckpt.load_block(t)
            for spec in blocks[t].linears:
                if spec.name not in recs:
                    raise ArtifactError(f"checkpoint block {t} lacks record {spec.name}")
                _set_weight(spec.module, _dense(recs[spec.name]))
            result.records.update(recs)
            result.stats.update(ckpt.state["stats"].get(str(t), {}))
        states[:] = ckpt.load_states()
        result.resumed_blocks = start_block
        log.info("resuming from %s: %d of %d blocks done", ckpt.dir, start_block, len(blocks))
    log.info("leechq quantization: %s", config.describe())
    total = sum(len(b.linears) for b in blocks)
    initial = sum(len(b.linears) for b in blocks[:start_block])
    bar = Progress(len(blocks), total, enabled=progress, initial=initial)
    began = time.perf_counter()
    timer = PhaseTimer(device)
    writer = BackgroundCommits(ckpt) if ckpt is not None else None
    try:
        for t in range(start_block, len(blocks)):
            block = blocks[t]
            if block.index != t:
                raise InvalidInput(f"block {t} reports index {block.index}")
            bar.block(t)
            timer.start()
            with block.activate(device, dtype):
                states[:] = [s.to(device=device, dtype=dtype) for s in states]
                records, stats = _quantize_block(block, states, config, coder, device, bar, timer)
                with torch.no_grad():
                    states[:] = [
                        block.forward(s) for s in states
                    ]  # pass 2: through the quantized block
                timer.mark("forward")
            result.records.update(records)
            result.stats.update(stats)
            if writer is not None:
                # Block t−1's write overlapped this block; it must be committed (and reported)
                # before block t's write starts, so a crash never skips a block.
                committed = writer.wait()
                if committed is not None and on_block is not None:
                    on_block(committed)
                writer.start(t, records, states, stats)
            timer.mark("commit")
            mean_err = sum(v["rel_err"] for v in stats.values()) / max(1, len(stats))
            log.info(
                "block %d/%d done: mean relative weight error %.4g", t + 1, len(blocks), mean_err
            )
            if writer is None and on_block is not None:
                on_block(t)
        if writer is not None:
            timer.start()
            committed = writer.wait()
            timer.mark("commit")
            if committed is not None and on_block is not None:
                on_block(committed)
    finally:
        if writer is not None:
            writer.wait(raise_errors=False)  # never leave a write running behind the caller
        bar.close()
    result.seconds = time.perf_counter() - began
    result.phase_seconds = dict(timer.seconds)
    return result


def iter_batches(windows: torch.Tensor, batch: int) -> Iterator[torch.Tensor]:
    """Split ``windows`` [n, seq] into consecutive batches of at most ``batch`` rows."""
    for i in range(0, windows.shape[0], batch):
        yield windows[i : i + batch]
