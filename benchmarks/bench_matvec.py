"""One decode token through every projection of a model: lattice kernels vs cuBLAS fp16 (issue 4).

Protocol (layouts-kernels-recipe.md §4.1, §6.2; METHOD.md): one process; per model, every projection
of every layer is a distinct random matrix (the pass streams GBs, far beyond the 60 MB L2); each arm
is one CUDA graph of the whole pass, captured once per activation buffer set and replayed; arms are
interleaved in rounds and the ratio to fp16 is the median of per-round ratios (never a quotient of
minima). Every arm is checked against an f64 reference built from the same bytes (one matrix of
each distinct shape, every row) before anything is timed.

Arms: ``fp16`` (cuBLAS through torch), ``copy`` (device copy bandwidth, read + write), ``null``
(no-weights control kernel, same geometry as the lattice kernels, same activation preparation),
``tetra48``, ``planes14``, ``int4`` (g128). Lattice and null arms come unfused (one launch per
projection, one activation preparation per input group) and fused (q|k|v and gate|up as one launch).
``--sweep`` first times a few launch geometries of the Tetra kernel on Qwen3-8B and uses the best.

Output: a table, the SASS instruction mix of the kernels (per decoded block), then one JSON line
``{"bench": "matvec", ...}`` (also written to ``--out``). ``--dry-run`` runs tiny shapes under the
Triton interpreter on the CPU (logic check only; no timing meaning).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from shapes import MODELS, Model  # noqa: E402

DATE = "2026-11-29"
ENV_SUFFIX = {"-a16": ("LEECHQ_A16", "1"), "-a24": ("LEECHQ_A16", "0"),
              "-pb0": ("LEECHQ_T64_PBITS", "0"), "-pb16": ("LEECHQ_T64_PBITS", "16"),
              "-pb32": ("LEECHQ_T64_PBITS", "32"), "-pb8": ("LEECHQ_T64_PBITS", "8"),
              "-xs": ("LEECHQ_T64_XS", "1"), "-nw4": ("LEECHQ_T64_NW", "4"),
              "-pf": ("LEECHQ_M1_PREFETCH", "1"), "-nopf": ("LEECHQ_M1_PREFETCH", "0"),
              "-peel": ("LEECHQ_T64_PEEL", "1"), "-nopeel": ("LEECHQ_T64_PEEL", "0"),
              "-w0": ("LEECHQ_M1_WAIT", "0"), "-w1": ("LEECHQ_M1_WAIT", "1"),
              "-w2": ("LEECHQ_M1_WAIT", "2"), "-nosplit": ("LEECHQ_T64_SPLIT", "0"),
              "-nw8": ("LEECHQ_T64_NW", "8"), "-nw16": ("LEECHQ_T64_NW", "16"),
              **{f"-r{n}": ("LEECHQ_T64_RESIDENT", str(n)) for n in range(1, 9)}}
"""An arm name ending in one of these runs that arm with the variable set so: ``LEECHQ_A16``
(16- or 24-bit activations in the integer kernels, ``ops.act16``), ``LEECHQ_T64_PBITS`` (the
pattern-bits table for ``tetra64`` records, ``ops.t64_pbits``), ``LEECHQ_T64_XS`` (the shared
conversion), ``LEECHQ_T64_NW`` / ``LEECHQ_T64_RESIDENT`` (the batch-1 ``tetra64`` geometry,
``ops.t64_geometry``), ``LEECHQ_M1_PREFETCH`` (the batch-1 kernel's L2 prefetch,
``ops.m1_prefetch``), ``LEECHQ_T64_PEEL`` (its first trip decoded before the grid wait,
``ops.t64_peel``), ``LEECHQ_M1_WAIT`` (where it waits for the previous grid, ``ops.m1_wait``),
``LEECHQ_T64_SPLIT`` (the pattern XOR apart from the nibble masks, ``ops.t64_split``); every
other arm runs the library's defaults."""


def _env_of(arm: str) -> tuple[str, dict[str, str]]:
    """``arm`` without its :data:`ENV_SUFFIX` suffixes (any number, e.g. ``-pb16-xs``) and the
    variables they set."""
    env: dict[str, str] = {}
    while True:
        suffix = next((s for s in ENV_SUFFIX if arm.endswith(s)), "")
        if not suffix:
            return arm, env
        var, value = ENV_SUFFIX[suffix]
        env.setdefault(var, value)
        arm = arm[: -len(suffix)]


# ----------------------------------------------------------------------------------- arm weights


@dataclass
class Pass:
    """One token through all projections: ``run(b)`` uses activation buffer set ``b``."""

    arm: str
    batch: int
    run: Callable[[int], None]
    bytes: int
    launches: int


def _layer_inputs(model: Model, batch: int, n_sets: int, device: str, dtype):
    import torch

    q = model.q_heads * model.head_dim
    sizes = {"attn": model.hidden, "o": q, "mlp": model.hidden, "down": model.intermediate}
    return [{k: torch.randn(batch, n, device=device, dtype=dtype) for k, n in sizes.items()}
            for _ in range(n_sets)]


GROUP_INPUT = {"q": "attn", "k": "attn", "v": "attn", "o": "o", "gate": "mlp", "up": "mlp",
               "down": "down"}


def build_fp16(model: Model, batch: int, n_sets: int, device: str, seed: int) -> Pass:
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    layers = [{n: (torch.randn(o, i, generator=g, device=device, dtype=torch.float16) * 0.02)
               for n, o, i in model.linears()} for _ in range(model.layers)]
    xs = _layer_inputs(model, batch, n_sets, device, torch.float16)
    outs = {n: torch.empty(batch, o, device=device, dtype=torch.float16)
            for n, o, _ in model.linears()}

    def run(b: int) -> None:
        for lw in layers:
            for n, w in lw.items():
                torch.matmul(xs[b][GROUP_INPUT[n]], w.t(), out=outs[n])

    nbytes = 2 * model.n_params()
    p = Pass("fp16", batch, run, nbytes, model.n_linears())
    p.check = lambda: _check_dense(model, layers[0], xs[0], outs)  # type: ignore[attr-defined]
    return p


def _check_dense(model: Model, lw, x, outs) -> float:
    import torch

    from leechq.kernels import reference as ref

    worst = 0.0
    for n, w in lw.items():
        xi = x[GROUP_INPUT[n]]
        worst = max(worst, ref.row_bound_error(torch.matmul(xi, w.t()), xi, w))
    return worst


def _lattice_weights(model: Model, arm: str, fused: bool, device: str, seed: int):
    from leechq.formats.layouts.planes14 import random_planes14
    from leechq.formats.layouts.tetra48 import random_tetra48

    make = random_tetra48 if arm == "tetra48" else random_planes14
    shapes = {n: (o, i) for n, o, i in model.linears()}
    layers = []
    s = seed
    for _ in range(model.layers):
        lw = {}
        groups = model.groups() if fused else [[n] for n, _, _ in model.linears()]
        for grp in groups:
            d_out = sum(shapes[n][0] for n in grp)
            lw["+".join(grp)] = make(d_out, shapes[grp[0]][1], seed=s, device=device)
            s += 1
        layers.append(lw)
    return layers


def _config_of(config):
    """``config`` is one MatvecConfig for every shape or a callable ``(d_out, d_in) -> config``."""
    return config if callable(config) else (lambda d_out, d_in: config)


_LAYERS: dict = {}
"""The last weights :func:`build_lattice` made (arms that differ only in switches, e.g. the
``tetra64`` decode forms, reuse them instead of drawing and converting the same codes again)."""


def build_lattice(model: Model, arm: str, batch: int, n_sets: int, device: str, seed: int,
                  fused: bool, config, null: bool = False, noprep: bool = False,
                  rotate: bool = False, limbs: bool = False, noprep_limbs: bool = False,
                  korder: bool = False, t64: bool = False) -> Pass:
    """Lattice (or null-control) pass. ``noprep``: the activations arrive already prepared (as the
    rotation kernel writes them in a served model), so the pass is the matvec launches only.
    ``rotate``: the served pass — each input group is rotated straight into the prepared layout
    (one rotation launch per group, as ``leechq.serve.fused.TetraGroup`` does), then the matvecs.
    ``limbs`` (with ``rotate``; ``LEECHQ_M1_LIMBS=1`` in a served model): one-group rotations of
    fewer than ``ops.IMMA_MIN_ROWS`` rows also write the batch-1 kernel's limb records, which
    its launches load (arm ``served-limbs``; ``served``, the default, converts the prepared rows
    in every program).
    ``noprep_limbs`` (with ``noprep``): the ``m1`` launches load the prepared inputs' limb
    records (``reference.m1_limb_records``) where a one-group rotation would write them (arm
    ``tetra48-m1-fused-noprep-limbs``).
    ``korder``: the Tetra words in kernel order (``formats.layouts.tetra48_korder``; the ``m1``
    launches decode them with ``CODE = TETRA_K``; arms ``*-korder``).
    ``t64``: the Tetra records in the ``tetra64`` layout (``formats.layouts.tetra64``: table
    addresses and shells; ``CODE = TETRA_64``; arms ``*-t64``)."""
    import torch

    from leechq.kernels import reference as ref
    from leechq.kernels.tables import natural_order, tetra_kernel_tables
    from leechq.kernels.triton import ops

    base = "tetra48" if arm in ("tetra48", "null") else arm
    key = (model.name, base, fused, device, seed, korder, t64)
    layers = _LAYERS.get(key)
    if layers is None:
        layers = _lattice_weights(model, base, fused, device, seed)
        if korder:
            from leechq.formats.layouts.tetra48_korder import to_kernel_order

            layers = [{k: to_kernel_order(w) for k, w in lw.items()} for lw in layers]
        if t64:
            from leechq.formats.layouts.tetra64 import to_tetra64

            layers = [{k: to_tetra64(w) for k, w in lw.items()} for lw in layers]
        _LAYERS[key] = layers
    xs = _layer_inputs(model, batch, n_sets, device, torch.float32)
    order = tetra_kernel_tables(device).order if base == "tetra48" else natural_order(device)
    first = layers[0]
    cfg_of = _config_of(config)
    cfgs = {k: cfg_of(w.d_out, w.d_in) for k, w in first.items()}
    # Planes14 with m1 configurations: the batch-1 Planes14 kernel, which reads its own order
    p14_m1 = base == "planes14" and not null and all(c.kernel == "m1" for c in cfgs.values())
    if p14_m1:
        order = ops.planes14_m1_order(device)
    d_in_of = {k: w.d_in for k, w in first.items()}
    nb_of = {k: w.n_blocks for k, w in first.items()}
    preps = {}
    for k in first:
        src = GROUP_INPUT[k.split("+")[0]]
        preps[src] = torch.empty(ref.prepared_rows(batch), ref.prepared_width(nb_of[k]),
                                 device=device, dtype=torch.float32)
    outs = {k: torch.empty(batch, w.d_out, device=device, dtype=torch.float32)
            for k, w in first.items()}
    if null:
        mv = ops.null_matvec_prepared
    elif p14_m1:
        def mv(xp, w, m, cfg, out=None):
            return ops.planes14_matvec_m1_prepared(xp, w, cfg, out=out, m_rows=m)
    else:
        mv = ops.tetra48_matvec_prepared if base == "tetra48" else ops.planes14_matvec_prepared

    prepared = [{src: ops.prepare_activation(xs[b][src], nb_of[k], order)
                 for k in first for src in [GROUP_INPUT[k.split("+")[0]]]}
                for b in range(n_sets)] if noprep else None
    rots = {}
    if rotate:
        from leechq.formats.rotation import generate_rotation

        for k, w in first.items():
            src = GROUP_INPUT[k.split("+")[0]]
            rots[src] = ops.DeviceRotation.from_tables(generate_rotation(w.d_in, seed + w.d_in),
                                                       device)
    # the limb records the m1 launches load: written by the one-group rotations (``limbs``), or
    # computed from the prepared inputs of power-of-two width, per buffer set (``noprep_limbs``)
    lbs = {src: ops.m1_limbs(first_w.n_blocks, device, batch)
           for src, first_w in ((GROUP_INPUT[k.split("+")[0]], w) for k, w in first.items())
           if limbs and rotate and rots[src].odd == 1 and batch < ops.IMMA_MIN_ROWS}
    pre_lbs = ([{src: ref.m1_limb_records(prepared[b][src], w.n_blocks, ops.act16())
                 for k, w in first.items() for src in [GROUP_INPUT[k.split("+")[0]]]
                 if w.d_in & (w.d_in - 1) == 0} for b in range(n_sets)]
               if noprep and noprep_limbs else None)

    def limbs_of(b: int, src: str) -> dict:
        """``mv``'s ``limbs`` keyword for buffer set ``b`` and input ``src`` (none: convert)."""
        lb = lbs.get(src) if pre_lbs is None else pre_lbs[b].get(src)
        return {} if lb is None else {"limbs": lb}

    def run(b: int) -> None:
        for lw in layers:
            done = set()
            for k, w in lw.items():
                src = GROUP_INPUT[k.split("+")[0]]
                if prepared is not None:
                    mv(prepared[b][src], w, batch, cfgs[k], out=outs[k], **limbs_of(b, src))
                    continue
                if src not in done:
                    if rotate:
                        ops.rotate(xs[b][src], rots[src], prepared_order=order, out=preps[src],
                                   limbs=lbs.get(src))
                    else:
                        ops.prepare_activation(xs[b][src], w.n_blocks, order, out=preps[src])
                    done.add(src)
                mv(preps[src], w, batch, cfgs[k], out=outs[k], **limbs_of(b, src))

    nbytes = sum(w.kernel_bytes() for lw in layers for w in lw.values())
    if null:
        nbytes = sum(4 * (w.row_scales.numel() + w.tail.numel()) for lw in layers for w in lw.values())
    launches = model.layers * (len(first) + (0 if noprep else 4))
    name = (("null" if null else base) + ("-fused" if fused else "")
            + ("-noprep" if noprep else "") + ("-limbs" if pre_lbs is not None else "")
            + ("-korder" if korder else "") + ("-t64" if t64 else ""))
    p = Pass(name, batch, run, nbytes, launches)

    def check() -> float:
        worst = 0.0
        x = xs[0]
        for k, w in first.items():
            src = GROUP_INPUT[k.split("+")[0]]
            xp = ops.prepare_activation(x[src], w.n_blocks, order)
            y = mv(xp, w, batch, cfgs[k])
            if null:
                if not bool(torch.isfinite(y).all()):
                    raise AssertionError("null kernel left outputs unwritten")
                continue
            dense = (ref.tetra48_dequantize_rotated(w) if base == "tetra48"
                     else ref.planes14_dequantize_rotated(w))
            worst = max(worst, ref.row_bound_error(
                y, ops.kernel_activation(x[src], w.n_blocks), dense))
            del dense
        if rotate:  # the served pass's rotations, into the prepared layout, against f64
            from leechq.formats.rotation import generate_rotation

            for src, rot in rots.items():
                n = rot.n
                got = ops.rotate(x[src], rot, prepared_order=order)
                want = ref.prepare_activation(
                    ref.rotate(x[src].cpu(), generate_rotation(n, seed + n)).to(device),
                    n // 24, order)
                rot_err = float((got - want).abs().max() / want.abs().max())
                if not rot_err <= 1e-5:  # rotation tolerance (docs/kernels.md)
                    raise AssertionError(f"rotation error {rot_err:.2e} > 1e-5")
        if pre_lbs is not None:  # m1 on the limb records: the same outputs
            for k, w in first.items():
                src = GROUP_INPUT[k.split("+")[0]]
                if src in pre_lbs[0]:
                    xp = prepared[0][src]
                    if not torch.equal(mv(xp, w, batch, cfgs[k], limbs=pre_lbs[0][src]),
                                       mv(xp, w, batch, cfgs[k])):
                        raise AssertionError(f"{k}: m1 on limb records differs")
        for k, w in first.items():  # rotation-written limb records: the reference, same outputs
            src = GROUP_INPUT[k.split("+")[0]]
            if src not in lbs:
                continue
            lb = ops.m1_limbs(w.n_blocks, device, batch)
            xp = ops.rotate(x[src], rots[src], prepared_order=order, limbs=lb)
            if not torch.equal(lb, ref.m1_limb_records(xp, w.n_blocks, ops.act16())):
                raise AssertionError(f"{k}: rotation-written limb records differ")
            if not torch.equal(mv(xp, w, batch, cfgs[k], limbs=lb), mv(xp, w, batch, cfgs[k])):
                raise AssertionError(f"{k}: m1 on limb records differs")
        return worst

    p.check = check  # type: ignore[attr-defined]
    return p


def _sms() -> int:
    import torch

    return torch.cuda.get_device_properties(0).multi_processor_count


def sweep_groups(model: Model, n_sets: int, device: str, reps: int, t64: bool = False) -> dict:
    """Time each projection group of ``model`` (36 distinct matrices of one shape, prepared input,
    batch 1, one CUDA graph of its 36 launches) under every geometry of :func:`sweep_configs`;
    verify each on one matrix per shape first (against the f64 product with the activation the
    kernel multiplies, ``ops.kernel_activation``). ``t64``: the records in the ``tetra64``
    layout. Returns ``{group: [(ms, config dict), ...]}``."""
    import torch

    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.kernels import reference as ref
    from leechq.kernels.tables import tetra_kernel_tables
    from leechq.kernels.triton import ops

    order = tetra_kernel_tables(device).order
    shapes = {n: (o, i) for n, o, i in model.linears()}
    table: dict = {}
    for gi, grp in enumerate(model.groups()):
        key = "+".join(grp)
        d_out, d_in = sum(shapes[n][0] for n in grp), shapes[grp[0]][1]
        ws = [random_tetra48(d_out, d_in, seed=1000 * gi + i, device=device)
              for i in range(model.layers)]
        if t64:
            from leechq.formats.layouts.tetra64 import to_tetra64

            ws = [to_tetra64(w) for w in ws]
        xs = [ops.prepare_activation(torch.randn(1, d_in, device=device), ws[0].n_blocks, order)
              for _ in range(n_sets)]
        y = torch.empty(1, d_out, device=device)
        dense = ref.tetra48_dequantize_rotated(ws[0])
        x0 = torch.randn(1, d_in, device=device)
        xp0 = ops.prepare_activation(x0, ws[0].n_blocks, order)
        rows = []
        for cfg in sweep_configs(d_out, d_in, _sms()):
            try:
                got = ops.tetra48_matvec_prepared(xp0, ws[0], 1, cfg)
                err = ref.row_bound_error(got, ops.kernel_activation(x0, ws[0].n_blocks), dense)
                if not err <= 1e-5:
                    raise AssertionError(f"error {err:.2e}")

                def run(b: int, cfg=cfg) -> None:
                    for w in ws:
                        ops.tetra48_matvec_prepared(xs[b], w, 1, cfg, out=y)

                gr = Graphed(Pass("sweep", 1, run, 0, len(ws)), n_sets)
                ms = statistics.median(gr.time(reps) for _ in range(3))
                rows.append((round(ms, 4), cfg.__dict__, err))
                print(f"# sweep {key} {d_out}x{d_in} {cfg}: {ms:.4f} ms (err {err:.1e})",
                      flush=True)
                del gr
            except Exception as exc:
                print(f"!! sweep {key} {cfg}: {exc!r}"[:1500], flush=True)
        table[key] = {"shape": [d_out, d_in], "rows": sorted(rows, key=lambda r: r[0])}
        del ws, dense
        torch.cuda.empty_cache()
    return table


def build_pre_ops(model: Model, batch: int, n_sets: int, device: str, seed: int,
                  fused: bool, splits: int = 1) -> Pass:
    """What a served decode step runs between projections to make their inputs, float16
    activations. ``fused=False`` (arm ``norms``): per layer the two residual adds + RMSNorms and
    the SwiGLU as the served model's compiled pieces (``Pieces.compiled()``), no rotation — what
    any model runs. ``fused=True`` (arm ``norm-rotation``): per layer the two norms and the SwiGLU
    inside their rotation launches (``ops.norm_rotate``, ``ops.silu_mul_rotate``) plus the o_proj
    input's plain rotation, each into the prepared layout — what the served Tetra model runs (the
    rotation's cost is the difference of the two arms). ``splits``: programs per (row, group)
    writing the prepared layout (``ops.rotate_splits``; arm ``norm-rotation-s4``)."""
    import torch

    from leechq.formats.rotation import generate_rotation
    from leechq.kernels import reference as ref
    from leechq.kernels.tables import tetra_kernel_tables
    from leechq.kernels.triton import ops
    from leechq.serve.model import Pieces, add_rms_norm

    hid, inter, q = model.hidden, model.intermediate, model.q_heads * model.head_dim
    g = torch.Generator(device="cpu").manual_seed(seed)
    eps = 1e-6
    weights = [(1 + 0.1 * torch.randn(hid, generator=g)).half().to(device) for _ in range(2)]

    def inputs() -> dict:
        return {"x": torch.randn(batch, hid, device=device).half(),
                "attn": torch.randn(batch, hid, device=device),
                "mlp": torch.randn(batch, hid, device=device),
                "o": torch.randn(batch, q, device=device).half(),
                "gate_up": torch.randn(batch, 2 * inter, device=device)}

    sets = [inputs() for _ in range(n_sets)]
    tables = {n: generate_rotation(n, seed + n) for n in {hid, inter, q}}
    rots = {n: ops.DeviceRotation.from_tables(t, device) for n, t in tables.items()}
    order = tetra_kernel_tables(device).order
    outs = {n: torch.zeros(ref.prepared_rows(batch), ref.prepared_width(n // 24), device=device)
            for n in {hid, inter, q}}
    fns = Pieces.compiled()

    def run(b: int) -> None:
        s = sets[b]
        for _ in range(model.layers):
            if fused:
                x, _ = ops.norm_rotate(s["x"], weights[0], eps, rots[hid], delta=s["attn"],
                                       prepared_order=order, out=outs[hid], splits=splits)
                ops.rotate(s["o"], rots[q], prepared_order=order, out=outs[q], splits=splits)
                ops.norm_rotate(x, weights[1], eps, rots[hid], delta=s["mlp"],
                                prepared_order=order, out=outs[hid], splits=splits)
                ops.silu_mul_rotate(s["gate_up"], torch.float16, rots[inter],
                                    prepared_order=order, out=outs[inter], splits=splits)
            else:
                x, _ = fns.add_rms_norm(s["x"], s["attn"], weights[0], eps)
                fns.add_rms_norm(x, s["mlp"], weights[1], eps)
                fns.silu_mul(s["gate_up"], torch.float16)

    arm = ("norm-rotation" + (f"-s{splits}" if splits > 1 else "")) if fused else "norms"
    p = Pass(arm, batch, run, 0, model.layers * (4 if fused else 3))

    def check() -> float:
        """Largest error relative to the row's largest value: the fused launches against the
        reference twins (the norm's one rounding of the narrowed input is the only difference),
        the compiled pieces against the eager ones."""
        s = sets[0]
        if not fused:
            _, h = fns.add_rms_norm(s["x"], s["attn"], weights[0], eps)
            _, want = add_rms_norm(s["x"], s["attn"], weights[0], eps)
            return float((h.float() - want.float()).abs().max() / want.float().abs().max())
        _, got = ops.norm_rotate(s["x"], weights[0], eps, rots[hid], delta=s["attn"],
                                 prepared_order=order, splits=splits)
        got = ref.unprepare_activation(got, batch, hid, order)
        _, want = ref.norm_rotate(s["x"].cpu(), weights[0].cpu(), eps, tables[hid],
                                  delta=s["attn"].cpu())
        err = float((got.cpu() - want).abs().max() / want.abs().max())
        got = ops.silu_mul_rotate(s["gate_up"], torch.float16, rots[inter], prepared_order=order,
                                  splits=splits)
        got = ref.unprepare_activation(got, batch, inter, order)
        want = ref.silu_mul_rotate(s["gate_up"].cpu(), torch.float16, tables[inter])
        return max(err, float((got.cpu() - want).abs().max() / want.abs().max()))

    p.check = check  # type: ignore[attr-defined]
    return p


def build_rotation(model: Model, batch: int, n_sets: int, device: str, seed: int,
                   splits: int = 1, limbs: bool = False) -> Pass:
    """The activation rotations of a served pass: one per input group (4 per layer), each writing
    the prepared layout the Tetra kernels read (so it replaces the preparation launch);
    ``splits`` programs per (row, group) write it (arm ``rotation-s4``); with ``limbs`` the
    one-group ones also write the batch-1 kernel's limb records (arms ``rotation-limbs-s8``,
    ``-s16``)."""
    import torch

    from leechq.formats.rotation import generate_rotation
    from leechq.kernels import reference as ref
    from leechq.kernels.tables import tetra_kernel_tables
    from leechq.kernels.triton import ops

    q = model.q_heads * model.head_dim
    widths = {"attn": model.hidden, "o": q, "mlp": model.hidden, "down": model.intermediate}
    tables = {n: generate_rotation(n, seed + n) for n in set(widths.values())}
    rots = {n: ops.DeviceRotation.from_tables(t, device) for n, t in tables.items()}
    order = tetra_kernel_tables(device).order
    xs = _layer_inputs(model, batch, n_sets, device, torch.float32)
    outs = {src: torch.zeros(ref.prepared_rows(batch), ref.prepared_width(n // 24), device=device)
            for src, n in widths.items()}
    lbs = {src: ops.m1_limbs(n // 24, device, batch) for src, n in widths.items()
           if limbs and rots[n].odd == 1}

    def run(b: int) -> None:
        for _ in range(model.layers):
            for src, n in widths.items():
                ops.rotate(xs[b][src], rots[n], prepared_order=order, out=outs[src],
                           splits=splits, limbs=lbs.get(src))

    name = "rotation" + ("-limbs" if limbs else "") + (f"-s{splits}" if splits > 1 else "")
    p = Pass(name, batch, run, 0, model.layers * 4)

    def check() -> float:
        worst = 0.0
        for src, n in widths.items():
            lb = ops.m1_limbs(n // 24, device, batch) if src in lbs else None
            got = ops.rotate(xs[0][src], rots[n], prepared_order=order, splits=splits, limbs=lb)
            if lb is not None and not torch.equal(lb, ref.m1_limb_records(got, n // 24,
                                                                           ops.act16())):
                raise AssertionError(f"{src}: rotation-written limb records differ")
            want = ref.prepare_activation(ref.rotate(xs[0][src].cpu(), tables[n]).to(device),
                                          n // 24, order)
            worst = max(worst, float((got - want).abs().max() / want.abs().max()))
        return worst

    p.check = check  # type: ignore[attr-defined]
    return p


def build_int4(model: Model, batch: int, n_sets: int, device: str, seed: int) -> Pass:
    import torch

    from leechq.formats.quantized_weight import Int4Weight
    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops

    g = torch.Generator(device=device).manual_seed(seed)
    layers = []
    for _ in range(model.layers):
        lw = {}
        for n, o, i in model.linears():
            lw[n] = Int4Weight(
                o, i, torch.randint(0, 256, (o, i // 2), generator=g, device=device,
                                    dtype=torch.uint8),
                (torch.rand(o, i // 128, generator=g, device=device) * 0.01).half(),
                (torch.randn(o, i // 128, generator=g, device=device) * 0.01).half(), 128)
        layers.append(lw)
    xs = _layer_inputs(model, batch, n_sets, device, torch.float32)
    xts = {src: None for src in set(GROUP_INPUT.values())}

    def run(b: int) -> None:
        for lw in layers:
            done = {}
            for n, w in lw.items():
                src = GROUP_INPUT[n]
                if src not in done:
                    done[src] = ops.code_transpose(xs[b][src], 8)
                ops.int4_matvec(xs[b][src], w, xt=done[src])

    del xts
    nbytes = sum(w.qweight.numel() + 2 * (w.scales.numel() + w.biases.numel())
                 for lw in layers for w in lw.values())
    p = Pass("int4", batch, run, nbytes, model.layers * 11)

    def check() -> float:
        worst = 0.0
        for n, w in layers[0].items():
            x = xs[0][GROUP_INPUT[n]]
            y = ops.int4_matvec(x, w)
            worst = max(worst, ref.row_bound_error(y, x, w.dequantize()))
        return worst

    p.check = check  # type: ignore[attr-defined]
    return p


def build_batched(model: Model, kind: str, batch: int, n_sets: int, device: str,
                  seed: int, tile: tuple[int, int, int] | None = None) -> Pass:
    """Fused Tetra groups through the many-row paths: ``kind`` "mma" (the tensor-core kernel,
    ops.tetra48_matmul_mma; its default tile, or ``tile`` = (bn, bb, num_warps)) or "dense" (a
    float16 dequantized copy on cuBLAS, ops.tetra48_matmul_dense); activations in the rotated
    basis, natural order."""
    import torch

    from leechq.kernels import reference as ref
    from leechq.kernels.triton import ops

    layers = _lattice_weights(model, "tetra48", True, device, seed)
    xs = _layer_inputs(model, batch, n_sets, device, torch.float32)
    if kind == "mma":
        geometry = {} if tile is None else dict(zip(("bn", "bb", "num_warps"), tile, strict=True))

        def fn(x, w):
            return ops.tetra48_matmul_mma(x, w, **geometry)
    else:
        fn = ops.tetra48_matmul_dense

    def run(b: int) -> None:
        for lw in layers:
            for k, w in lw.items():
                fn(xs[b][GROUP_INPUT[k.split("+")[0]]], w)

    nbytes = sum(w.kernel_bytes() for lw in layers for w in lw.values())
    name = f"tetra48-{kind}" + (f"{tile[0]}x{tile[1]}w{tile[2]}" if tile else "") + "-fused"
    p = Pass(name, batch, run, nbytes, model.layers * len(layers[0]))

    def check() -> float:
        worst = 0.0
        for k, w in layers[0].items():
            x = xs[0][GROUP_INPUT[k.split("+")[0]]]
            worst = max(worst, ref.row_bound_error(fn(x, w), x, ref.tetra48_dequantize_rotated(w)))
        return worst

    p.check = check  # type: ignore[attr-defined]
    return p


def build_imma(model: Model, batch: int, n_sets: int, device: str, seed: int,
               noprep: bool = False, rows_per_step: int = 2, fused_sum: bool = False,
               layout: str = "tetra48", korder: bool = False, t64: bool = False) -> Pass:
    """Fused Tetra groups through the int8 tensor-core kernel (ops.tetra48_matvec_imma_prepared,
    1..8 rows): per layer and group input the preparation launch (none with ``noprep``: the
    prepared layout is given, as the rotation writes it in a served model), one activation-record
    launch shared by the group's matrices, then per matrix the MMA kernel and its slice sum (in
    the MMA kernel with ``fused_sum``). ``layout``: ``tetra48`` or ``planes14`` (the Planes14
    decode, activation in ``planes14_m1_order``). ``korder``: Tetra words in kernel order
    (``formats.layouts.tetra48_korder``); ``t64``: in the ``tetra64`` layout."""
    import torch

    from leechq.kernels import reference as ref
    from leechq.kernels.tables import tetra_kernel_tables
    from leechq.kernels.triton import ops

    layers = _lattice_weights(model, layout, True, device, seed)
    if korder:
        from leechq.formats.layouts.tetra48_korder import to_kernel_order

        layers = [{k: to_kernel_order(w) for k, w in lw.items()} for lw in layers]
    if t64:
        from leechq.formats.layouts.tetra64 import to_tetra64

        layers = [{k: to_tetra64(w) for k, w in lw.items()} for lw in layers]
    xs = _layer_inputs(model, batch, n_sets, device, torch.float32)
    tetra = layout == "tetra48"
    order = tetra_kernel_tables(device).order if tetra else ops.planes14_m1_order(device)
    matvec = ops.tetra48_matvec_imma_prepared if tetra else ops.planes14_matvec_imma_prepared
    dequantize = ref.tetra48_dequantize_rotated if tetra else ref.planes14_dequantize_rotated
    first = layers[0]
    src_of = {k: GROUP_INPUT[k.split("+")[0]] for k in first}
    nb_of = {src_of[k]: w.n_blocks for k, w in first.items()}
    preps = [{src: ops.prepare_activation(xs[b][src], nb, order) for src, nb in nb_of.items()}
             for b in range(n_sets)]
    outs = {k: torch.empty(batch, w.d_out, device=device, dtype=torch.float32)
            for k, w in first.items()}

    def run(b: int) -> None:
        for lw in layers:
            acts = {}
            for k, w in lw.items():
                src = src_of[k]
                if src not in acts:
                    if not noprep:
                        ops.prepare_activation(xs[b][src], w.n_blocks, order, out=preps[b][src])
                    acts[src] = ops.imma_activation(preps[b][src], batch, w.n_blocks)
                matvec(preps[b][src], w, batch, out=outs[k], acts=acts[src],
                       rows_per_step=rows_per_step, fused_sum=fused_sum)

    nbytes = sum(w.kernel_bytes() for lw in layers for w in lw.values())
    groups = len(nb_of)
    launches = model.layers * ((1 if fused_sum else 2) * len(first)
                               + groups * (1 if noprep else 2))
    name = (layout + "-imma" + (f"-rps{rows_per_step}" if rows_per_step != 2 else "")
            + ("-ksum" if fused_sum else "") + "-fused" + ("-noprep" if noprep else "")
            + ("-korder" if korder else "") + ("-t64" if t64 else ""))
    p = Pass(name, batch, run, nbytes, launches)

    def check() -> float:
        worst = 0.0
        for k, w in first.items():
            x = xs[0][src_of[k]]
            xp = ops.prepare_activation(x, w.n_blocks, order)
            y = matvec(xp, w, batch, rows_per_step=rows_per_step, fused_sum=fused_sum)
            worst = max(worst, ref.row_bound_error(y, ops.kernel_activation(x, w.n_blocks),
                                                   dequantize(w)))
        return worst

    p.check = check  # type: ignore[attr-defined]
    return p


# ----------------------------------------------------------------------------------- timing


class Graphed:
    """A pass captured as one CUDA graph per activation buffer set."""

    def __init__(self, p: Pass, n_sets: int) -> None:
        import torch

        self.p = p
        for b in range(n_sets):  # compile + warm
            p.run(b)
        torch.cuda.synchronize()
        self.graphs = []
        for b in range(n_sets):
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                p.run(b)
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                p.run(b)
            self.graphs.append(g)
        torch.cuda.synchronize()

    def time(self, reps: int) -> float:
        """Median ms of ``reps`` replays, alternating the buffer sets."""
        import torch

        times = []
        for r in range(reps):
            g = self.graphs[r % len(self.graphs)]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1))
        return statistics.median(times)


def copy_bandwidth(device: str) -> float:
    """Device-to-device copy, GB/s counting bytes read plus written (median of 20)."""
    import torch

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return 2 * n / (statistics.median(times) * 1e-3) / 1e9


# ----------------------------------------------------------------------------------- SASS


def sass_report(configs: dict) -> dict:
    """Instruction mix per decoded block (per 24 weights for int4) of the compiled kernels' hot
    loops (sm_90, Triton's bundled ptxas; no GPU needed)."""
    from leechq.kernels.triton import introspect as I
    from leechq.kernels.triton.activation import rotate_kernel
    from leechq.kernels.triton.intq import intq_matvec_kernel
    from leechq.kernels.triton.planes14 import planes14_matvec_kernel
    from leechq.kernels.triton.tetra48 import null_matvec_kernel, tetra48_matvec_kernel
    from leechq.kernels.triton.tetra48_m1 import m1_kernel, null_m1_kernel

    lat = {"xp_ptr": "*fp32", "w_ptr": "*i32", "scale_ptr": "*fp32", "cent_ptr": "*fp32",
           "tail_ptr": "*fp32", "rows_ptr": "*i32", "cw_ptr": "*i32", "y_ptr": "*fp32",
           "stride_ym": "i32", "d_out": "i32"}
    m1 = {"xp_ptr": "*fp32", "w_ptr": "*i32", "scale_ptr": "*fp32", "cent_ptr": "*fp32",
          "tail_ptr": "*fp32", "tab_ptr": "*i32", "part_ptr": "*fp32", "cnt_ptr": "*i32",
          "y_ptr": "*fp32", "d_out": "i32"}
    pl = {"xp_ptr": "*fp32", "r_ptr": "*i32", "scale_ptr": "*fp32", "cent_ptr": "*fp32",
          "tail_ptr": "*fp32", "tab_ptr": "*i32", "y_ptr": "*fp32", "stride_ym": "i32",
          "d_out": "i32"}
    nul = {"xp_ptr": "*fp32", "scale_ptr": "*fp32", "tail_ptr": "*fp32", "y_ptr": "*fp32",
           "stride_ym": "i32", "d_out": "i32"}
    iq = {"xt_ptr": "*fp32", "q_ptr": "*i32", "s_ptr": "*fp16", "b_ptr": "*fp16", "y_ptr": "*fp32",
          "stride_ym": "i32", "d_out": "i32"}
    rot = {"x_ptr": "*fp32", "stride_xm": "i32", "signs_ptr": "*fp32", "small_ptr": "*fp32",
           "out_ptr": "*fp32", "stride_om": "i32", "inv_sqrt_m": "fp32", "aux_ptr": "*fp32",
           "stride_am": "i32", "w_ptr": "*fp32", "res_ptr": "*fp32", "stride_rm": "i32",
           "eps": "fp32"}
    from leechq.kernels.triton.ops import act16

    a16 = act16()  # the m1 kernels' activation width as served (LEECHQ_A16)
    out = {"a16": a16}
    jobs = {}
    c1 = configs[1]
    if c1.kernel == "m1":
        jobs["tetra48-m1/M1"] = (m1_kernel, I.M1_SIGNATURE, dict(
            N_BLOCKS=170, TAIL_COLS=16, ROWS=c1.rows, NW=c1.num_warps, BP=c1.bp, USE_ASM=True,
            ILP=c1.ilp, MB=1, A16=a16), 2 * c1.ilp, c1.num_warps)  # ILP pairs per thread, trip
        jobs["tetra48-m1-korder/M1"] = (m1_kernel, I.M1_SIGNATURE, dict(
            N_BLOCKS=170, TAIL_COLS=16, ROWS=c1.rows, NW=c1.num_warps, BP=c1.bp, USE_ASM=True,
            ILP=c1.ilp, MB=1, A16=a16, CODE=2), 2 * c1.ilp, c1.num_warps)  # kernel order
        jobs["tetra48-m1-t64/M1"] = (m1_kernel, I.M1_SIGNATURE, dict(
            N_BLOCKS=170, TAIL_COLS=16, ROWS=c1.rows, NW=c1.num_warps, BP=c1.bp, USE_ASM=True,
            ILP=c1.ilp, MB=1, A16=True, CODE=3), 2 * c1.ilp, c1.num_warps)  # tetra64
        jobs["null-m1/M1"] = (null_m1_kernel, m1, dict(
            N_BLOCKS=170, TAIL_COLS=16, ROWS=c1.rows, NW=c1.num_warps, BP=c1.bp, USE_ASM=True),
            2, c1.num_warps)
    for batch in (1, 8):
        cfg = configs.get("tile1", configs[batch]) if batch == 1 else configs[batch]
        blocks_per_thread = cfg.rows * cfg.bp * 2 / (32 * cfg.num_warps)
        jobs.update({
            f"tetra48-tile/M{batch}": (tetra48_matvec_kernel, lat, dict(
                N_BLOCKS=170, TAIL_COLS=16, M=batch, ROWS=cfg.rows, BP=cfg.bp, USE_ASM=True,
                SMEM_ROWS=cfg.smem_rows), blocks_per_thread, cfg.num_warps),
            f"planes14/M{batch}": (planes14_matvec_kernel, pl, dict(
                N_BLOCKS=170, TAIL_COLS=16, M=batch, ROWS=cfg.rows, BP=cfg.bp, USE_ASM=True),
                blocks_per_thread, cfg.num_warps),
            f"null-tile/M{batch}": (null_matvec_kernel, nul, dict(
                N_BLOCKS=170, TAIL_COLS=16, M=batch, ROWS=cfg.rows, BP=cfg.bp),
                blocks_per_thread, cfg.num_warps),
            f"int4/M{batch}": (intq_matvec_kernel, iq, dict(
                D_IN=4096, GROUP=128, BITS=4, M=batch, ROWS=16, BW=32, USE_ASM=True),
                16 * 32 / 128 * 8 / 24, 4),  # per 24 weights
        })
    for name, (k, sig, ce, per, nw) in jobs.items():
        try:
            c = I.compile_for(k, sig, ce, num_warps=nw)
            mix = I.hot_loop_mix(I.sass(c))
            loop = mix["loop"]
            out[name] = {
                "per_block_total": round(mix["loop_total"] / per, 1),
                "per_block": {op: round(n / per, 1) for op, n in loop.items()},
                "pipes_per_block": {k2: round(v / per, 1)
                                    for k2, v in I.pipe_summary(loop).items()},
                "per_chunk_epilogue": mix["skipped"],
                "kernel_total": mix["kernel_total"],
                "resources": I.resource_usage(c),
                "shared_bytes": getattr(c.metadata, "shared", None),
            }
        except Exception as exc:  # the report is informative; never fail the bench on it
            out[name] = {"error": repr(exc)[:300]}
    for k_odd, mw in ((1, 4096), (3, 4096), (17, 1024)):
        try:
            import math

            c = I.compile_for(rotate_kernel, rot, dict(K=k_odd, MW=mw, LOG2M=int(math.log2(mw)),
                                                       TC=False),
                              num_warps=8 if mw >= 2048 else 4)
            text = I.sass(c)
            out[f"rotate/k{k_odd}m{mw}"] = {
                "kernel_total": len(I.instructions(text)),
                "loop": I.loop_mix(text)["loop"], "resources": I.resource_usage(c)}
        except Exception as exc:
            out[f"rotate/k{k_odd}m{mw}"] = {"error": repr(exc)[:300]}
    return out


# ----------------------------------------------------------------------------------- driver


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=HERE, check=True).stdout.strip()
    except Exception:
        return os.environ.get("LEECHQ_GIT", "unknown")


def warm_compile(models: list[str], batches: tuple[int, ...], configs: dict, sweep: bool,
                 workers: int, arms: str = "tetra48,planes14,null,int4,rotation",
                 sweep_t64: bool = False) -> float:
    """Compile every kernel specialization in parallel processes (fills Triton's disk cache;
    ``sweep_t64``: the sweep's geometries on tetra64 records)."""
    import concurrent.futures as cf
    import multiprocessing as mp

    jobs = []
    for name in models:
        m = MODELS[name]
        d_ins = sorted({i for _, _, i in m.linears()})
        for d_in in d_ins:
            for batch in batches:
                cfgs = [configs[batch]] + ([configs["tile1"]] if batch == 1 and "tile1" in configs
                                           else [])
                for cfg in cfgs:
                    for kind in ("tetra48", "planes14", "null", "int4", "rotation"):
                        if kind in arms or (kind == "rotation" and "served" in arms):
                            jobs.append((kind, d_in, batch, cfg))
        if "m1" in arms or "served" in arms:  # the many-row m1 geometries, per group shape
            shapes = {n: (o, i) for n, o, i in m.linears()}
            for batch in (b for b in batches if b > 1):
                for grp in m.groups():
                    d_out, g_in = sum(shapes[n][0] for n in grp), shapes[grp[0]][1]
                    jobs.append(("tetra48-m1", g_in, batch, (d_out, batch)))
        if name == "qwen3-8b" and sweep:
            sms = _sms()
            shapes = {n: (o, i) for n, o, i in m.linears()}
            for grp in m.groups():
                d_out, d_in = sum(shapes[n][0] for n in grp), shapes[grp[0]][1]
                for cfg in sweep_configs(d_out, d_in, sms):
                    jobs.append(("tetra48-t64" if sweep_t64 else "tetra48", d_in, 1, cfg))
    jobs = list(dict.fromkeys(jobs))
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as ex:
        for job, err in zip(jobs, ex.map(_warm_job_safe, jobs)):
            if err:
                print(f"# compile failed {job[:3]}: {err}", flush=True)
    return time.time() - t0


def _warm_job_safe(job) -> str:
    try:
        _warm_job(job)
        return ""
    except Exception as exc:  # reported by the parent; the arm will fail visibly later
        import traceback

        return repr(exc)[:500] + " | " + traceback.format_exc()[-1500:]


def _warm_job(job) -> None:
    import torch

    from leechq.formats.layouts.planes14 import random_planes14
    from leechq.formats.layouts.tetra48 import random_tetra48
    from leechq.formats.quantized_weight import Int4Weight
    from leechq.kernels.tables import natural_order, tetra_kernel_tables
    from leechq.kernels.triton import ops

    kind, d_in, batch, cfg = job
    dev = "cuda"
    x = torch.randn(batch, d_in, device=dev)
    if kind == "rotation":
        from leechq.formats.rotation import generate_rotation

        ops.rotate(x, generate_rotation(d_in, 1), prepared_order=tetra_kernel_tables(dev).order)
    elif kind == "int4":
        w = Int4Weight(16, d_in, torch.zeros(16, d_in // 2, dtype=torch.uint8, device=dev),
                       torch.ones(16, d_in // 128, dtype=torch.float16, device=dev),
                       torch.zeros(16, d_in // 128, dtype=torch.float16, device=dev), 128)
        ops.int4_matvec(x, w, xt=ops.code_transpose(x, 8))
    elif kind == "planes14":
        w = random_planes14(64, d_in, device=dev)
        ops.planes14_matvec_prepared(ops.prepare_activation(x, w.n_blocks, natural_order(dev)), w,
                                     batch, cfg)
    elif kind == "tetra48-m1":  # cfg = (d_out, batch): the library's geometry per row group
        w = random_tetra48(64, d_in, device=dev)
        for rows, c in ops.m1_plan(cfg[0], d_in // 24, torch.device(dev), d_in % 24, cfg[1]):
            xp = ops.prepare_activation(x[:rows], w.n_blocks, tetra_kernel_tables(dev).order)
            ops.tetra48_matvec_prepared(xp, w, rows, c)
    else:
        w = random_tetra48(64, d_in, device=dev)
        if kind == "tetra48-t64":
            from leechq.formats.layouts.tetra64 import to_tetra64

            w = to_tetra64(w)
        xp = ops.prepare_activation(x, w.n_blocks, tetra_kernel_tables(dev).order)
        if kind == "null":
            ops.null_matvec_prepared(xp, w, batch, cfg)
        else:
            ops.tetra48_matvec_prepared(xp, w, batch, cfg)
    torch.cuda.synchronize()


TILE1 = dict(rows=16, bp=32, num_warps=4, smem_rows=True, kernel="tile")
"""The tiled Tetra kernel's batch-1 geometry of 2026-11-29 (the baseline arm ``tetra48-fused``)."""

M1_SWEEP = [
    dict(rows="rule"),
    dict(rows="rule", maxnreg=96),
    dict(rows="wave4"),
    dict(rows="wave8"),
    dict(rows="wave5", maxnreg=96),
    dict(rows="wave10", maxnreg=96),
    dict(rows="wave5", maxnreg=96, ilp=1),
    dict(rows="wave6", maxnreg=80),
    dict(rows="wave12", maxnreg=80),
]
"""Batch-1 geometries timed per projection group by ``--sweep`` (all ``m1``, 32 block pairs per
K-slice, 4 warps, two rows per warp and trip unless ``ilp`` says otherwise). ``rows``: ``"rule"``
is :func:`ops.m1_config`'s choice; ``"wave<P>"`` the chunk that gives about P programs per SM
(:func:`ops.m1_wave_rows`; 4 programs of 4 warps fit an SM at the compiler's 127 registers, 5 at
``maxnreg`` 96, 6 at 80)."""


def sweep_configs(d_out: int, d_in: int, sms: int) -> list:
    """The :data:`M1_SWEEP` geometries resolved for one ``d_out × d_in`` shape on ``sms`` SMs."""
    import torch

    from leechq.kernels.triton.ops import MatvecConfig, m1_config, m1_wave_rows

    out = []
    for entry in M1_SWEEP:
        cfg = {**dict(bp=32, num_warps=4, kernel="m1", ctas_per_sm=0, ilp=2, maxnreg=0), **entry}
        if cfg["rows"] == "rule":
            cfg["rows"] = m1_config(d_out, d_in // 24, torch.device("cuda")).rows
        else:
            cfg["rows"] = m1_wave_rows(d_out, d_in // 24, int(cfg["rows"][4:]) * sms, cfg["ilp"])
        out.append(MatvecConfig(**cfg))
    return list(dict.fromkeys(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="qwen3-8b,qwen3-4b,qwen3-14b")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sets", type=int, default=2, help="activation buffer sets (graphs) per arm")
    ap.add_argument("--arms", default="fp16,null-fused,null-m1-fused-noprep,tetra48-fused,"
                    "tetra48-m1-fused,tetra48-m1-fused-noprep,served,planes14-fused,rotation")
    ap.add_argument("--sweep", action="store_true",
                    help="time the batch-1 Tetra geometries per projection group of qwen3-8b first "
                         "and use the best per shape")
    ap.add_argument("--sweep-t64", action="store_true",
                    help="with --sweep: time the geometries on tetra64 records")
    ap.add_argument("--warm-workers", type=int, default=12)
    ap.add_argument("--no-sass", action="store_true")
    ap.add_argument("--warm-only", action="store_true", help="compile every specialization, exit")
    ap.add_argument("--sass-only", default="", help="write the SASS report (JSON) to this path, exit")
    ap.add_argument("--out", default=str(HERE / "results" / f"matvec-{DATE}.json"))
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, Triton interpreter, CPU")
    args = ap.parse_args()
    if args.dry_run:
        return dry_run()

    import torch

    from leechq.kernels.triton.ops import MatvecConfig, default_config

    device = "cuda"
    batches = tuple(int(b) for b in args.batches.split(","))
    models = args.models.split(",")
    configs = {b: default_config(b) for b in (1, 8, *batches)}
    tile1 = MatvecConfig(**TILE1)
    sweep = args.sweep
    if args.sass_only:
        report = sass_report({**configs, "tile1": tile1})
        Path(args.sass_only).write_text(json.dumps(report) + "\n")
        return
    gpu = torch.cuda.get_device_name()
    print(f"# {gpu}, torch {torch.__version__}, triton {__import__('triton').__version__}",
          flush=True)
    t_warm = warm_compile(models, batches, {**configs, "tile1": tile1}, sweep, args.warm_workers,
                          args.arms, args.sweep_t64)
    print(f"# parallel compile: {t_warm:.1f} s", flush=True)
    if args.warm_only:
        return
    copy_gbps = copy_bandwidth(device)
    print(f"# copy bandwidth: {copy_gbps:.0f} GB/s (read + write)", flush=True)

    best_by_shape: dict = {}
    sweep_table: dict = {}
    if sweep:
        sweep_table = sweep_groups(MODELS["qwen3-8b"], args.sets, device, args.reps,
                                   args.sweep_t64)
        for key, entry in sweep_table.items():
            if entry["rows"]:
                best_by_shape[tuple(entry["shape"])] = MatvecConfig(**entry["rows"][0][1])
                print(f"# best {key}: {entry['rows'][0]}", flush=True)
        _write(args.out, {"bench": "matvec", "gpu": gpu, "git": git_rev(), "partial": True,
                          "sweep": sweep_table})

    from leechq.kernels.triton.ops import m1_config

    def cfg1(d_out: int, d_in: int):
        """The sweep's best geometry for this shape, else the library's per-shape rule."""
        return best_by_shape.get((d_out, d_in)) or m1_config(d_out, d_in // 24,
                                                             torch.device(device))

    def cfg1_cap(cap: int, resident: int):
        """The batch-1 rule with the register cap ``cap`` where the rule caps (16-bit
        activations fit 80 registers without spilling, offline) and chunks sized for one wave of
        ``resident`` programs per SM (six fit an SM's shared memory; ``ops.M1_RESIDENT`` has 5)."""
        from dataclasses import replace as _replace

        from leechq.kernels.triton.ops import M1_MAX_ROWS, m1_wave_rows

        def cfg(d_out: int, d_in: int):
            base = cfg1(d_out, d_in)
            wave = m1_wave_rows(d_out, d_in // 24, resident * _sms(), ilp=base.ilp)
            slices = ((d_in // 24 + 1) // 2 + 31) // 32
            rows = 64 if (d_out + 63) // 64 * slices >= 3 * _sms() else 32
            return _replace(base, rows=max(rows, min(wave, M1_MAX_ROWS)),
                            maxnreg=cap if base.maxnreg else 0)
        return cfg

    def cfg2_resident(resident: int):
        """The two-row rule (``ops.m1_config(m_rows=2)``) with chunks sized for one wave of
        ``resident`` programs per SM (16-bit activations: 96 registers, five fit; the rule
        assumes three, ``ops.M1_RESIDENT[2]``)."""
        from dataclasses import replace as _replace

        from leechq.kernels.triton.ops import M1_MAX_ROWS, m1_config, m1_wave_rows

        def cfg(d_out: int, d_in: int):
            base = m1_config(d_out, d_in // 24, torch.device(device), m_rows=2)
            wave = m1_wave_rows(d_out, d_in // 24, resident * _sms(), ilp=base.ilp)
            slices = ((d_in // 24 + 1) // 2 + 31) // 32
            rows = 64 if (d_out + 63) // 64 * slices >= 3 * _sms() else 32
            return _replace(base, rows=max(rows, min(wave, M1_MAX_ROWS)))
        return cfg

    results = []
    checks = {}
    for name in models:
        model = MODELS[name]
        for batch in batches:
            tile = tile1 if batch == 1 else configs[batch]
            # several rows: no configuration, i.e. the library's default (ops.m1_plan: a
            # geometry per row group)
            m1 = cfg1 if batch == 1 else (lambda d_out, d_in: None)
            builders = {
                "fp16": lambda: build_fp16(model, batch, args.sets, device, 1),
                "null-fused": lambda: build_lattice(model, "null", batch, args.sets, device, 2,
                                                    True, tile, null=True),
                "null-m1-fused-noprep": lambda: build_lattice(
                    model, "null", batch, args.sets, device, 2, True, m1, null=True, noprep=True),
                # the control in the tetra64 arms' geometry (ops.m1_config(t64=True))
                "null-m1-fused-noprep-t64geo": lambda m=model, b=batch: build_lattice(
                    m, "null", b, args.sets, device, 2, True,
                    lambda d_out, d_in: m1_config(d_out, d_in // 24, torch.device(device),
                                                  t64=True), null=True, noprep=True),
                "tetra48-fused": lambda: build_lattice(model, "tetra48", batch, args.sets, device,
                                                       4, True, tile),
                "tetra48-m1-fused": lambda: build_lattice(model, "tetra48", batch, args.sets,
                                                          device, 4, True, m1),
                "tetra48-m1-fused-noprep": lambda: build_lattice(
                    model, "tetra48", batch, args.sets, device, 4, True, m1, noprep=True),
                "served": lambda: build_lattice(model, "tetra48", batch, args.sets, device, 4,
                                                True, m1, rotate=True),
                "tetra48-m1-fused-noprep-korder": lambda m=model, b=batch, c=m1: build_lattice(
                    m, "tetra48", b, args.sets, device, 4, True, c, noprep=True, korder=True),
                "served-korder": lambda m=model, b=batch, c=m1: build_lattice(
                    m, "tetra48", b, args.sets, device, 4, True, c, rotate=True, korder=True),
                # tetra64: the library's own plan (ops.m1_config(t64=True) at one row)
                "tetra48-m1-fused-noprep-t64": lambda m=model, b=batch: build_lattice(
                    m, "tetra48", b, args.sets, device, 4, True, None, noprep=True, t64=True),
                "served-t64": lambda m=model, b=batch: build_lattice(
                    m, "tetra48", b, args.sets, device, 4, True, None, rotate=True, t64=True),
                "served-limbs": lambda m=model, b=batch, c=m1: build_lattice(
                    m, "tetra48", b, args.sets, device, 4, True, c, rotate=True, limbs=True),
                "tetra48": lambda: build_lattice(model, "tetra48", batch, args.sets, device, 3,
                                                 False, m1),
                "planes14-fused": lambda: build_lattice(model, "planes14", batch, args.sets,
                                                        device, 6, True, tile),
                "planes14-m1-fused": lambda m=model, b=batch: build_lattice(
                    m, "planes14", b, args.sets, device, 6, True, cfg1 if b == 1 else (
                        lambda d_out, d_in: m1_config(d_out, d_in // 24, torch.device(device),
                                                      m_rows=b))),
                # Planes14 in the tetra64 arms' geometry (ops.t64_geometry: -nw8 / -nw16 / -rN)
                "planes14-m1-fused-wide": lambda m=model, b=batch: build_lattice(
                    m, "planes14", b, args.sets, device, 6, True,
                    lambda d_out, d_in: m1_config(d_out, d_in // 24, torch.device(device),
                                                  t64=True)),
                "int4": lambda: build_int4(model, batch, args.sets, device, 8),
                "tetra48-mma-fused": lambda: build_batched(model, "mma", batch, args.sets,
                                                           device, 10),
                "tetra48-dense-fused": lambda: build_batched(model, "dense", batch, args.sets,
                                                             device, 11),
                "tetra48-mma64x2w4-fused": lambda: build_batched(model, "mma", batch, args.sets,
                                                                 device, 10, (64, 2, 4)),
                "tetra48-mma128x2w8-fused": lambda: build_batched(model, "mma", batch, args.sets,
                                                                  device, 10, (128, 2, 8)),
                "rotation": lambda: build_rotation(model, batch, args.sets, device, 9),
                "norms": lambda m=model, b=batch: build_pre_ops(m, b, args.sets, device, 12,
                                                                 False),
                "norm-rotation": lambda m=model, b=batch: build_pre_ops(m, b, args.sets, device,
                                                                         12, True),
            }
            builders["tetra48-imma-fused"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13)
            builders["tetra48-imma-fused-noprep"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13, noprep=True)
            builders["tetra48-imma-rps1-fused-noprep"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13, noprep=True, rows_per_step=1)
            builders["tetra48-imma-rps4-fused-noprep"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13, noprep=True, rows_per_step=4)
            builders["tetra48-imma-fused-noprep-korder"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13, noprep=True, korder=True)
            builders["tetra48-imma-fused-noprep-t64"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13, noprep=True, t64=True)
            builders["tetra48-imma-ksum-fused-noprep"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 13, noprep=True, fused_sum=True)
            builders["planes14-imma-fused-noprep"] = lambda m=model, b=batch: build_imma(
                m, b, args.sets, device, 14, noprep=True, layout="planes14")
            for cap, res in ((80, 5), (80, 6), (72, 6)):  # lower caps (16-bit activations)
                builders[f"tetra48-m1-fused-noprep-cap{cap}r{res}"] = (
                    lambda m=model, b=batch, cap=cap, res=res: build_lattice(
                        m, "tetra48", b, args.sets, device, 4, True, cfg1_cap(cap, res),
                        noprep=True))
                builders[f"served-cap{cap}r{res}"] = (
                    lambda m=model, b=batch, cap=cap, res=res: build_lattice(
                        m, "tetra48", b, args.sets, device, 4, True, cfg1_cap(cap, res),
                        rotate=True))
            for res in (4, 5):  # two rows per launch, chunks for more resident programs
                builders[f"tetra48-m1-fused-noprep-r2x{res}"] = (
                    lambda m=model, b=batch, res=res: build_lattice(
                        m, "tetra48", b, args.sets, device, 4, True, cfg2_resident(res),
                        noprep=True))
            builders["tetra48-m1-fused-noprep-limbs"] = lambda m=model, b=batch, c=m1: (
                build_lattice(m, "tetra48", b, args.sets, device, 4, True, c, noprep=True,
                              noprep_limbs=True))
            for n in (8, 16, 32):  # the one-group rotations also writing the limb records
                builders[f"rotation-limbs-s{n}"] = lambda m=model, b=batch, n=n: build_rotation(
                    m, b, args.sets, device, 9, splits=n, limbs=True)
            for n in (2, 4, 8, 16, 32):  # programs per (row, group) writing the prepared layout
                builders[f"rotation-s{n}"] = lambda m=model, b=batch, n=n: build_rotation(
                    m, b, args.sets, device, 9, splits=n)
                builders[f"norm-rotation-s{n}"] = lambda m=model, b=batch, n=n: build_pre_ops(
                    m, b, args.sets, device, 12, True, splits=n)
            if batch > 1:  # the no-weights control has one activation row
                builders.pop("null-m1-fused-noprep")
                builders.pop("null-m1-fused-noprep-t64geo")
            wanted = args.arms.split(",")
            for arm in wanted:  # "<arm>-a16", "-pb16-xs", ...: that arm, its variables set
                base = _env_of(arm)[0]
                if base != arm and base in builders:
                    builders[arm] = builders[base]
            builders = {a: b for a, b in builders.items() if a in wanted}
            graphs = {}
            for arm, build in builders.items():
                env = _env_of(arm)[1]
                saved = {var: os.environ.pop(var, None) for var in env}
                os.environ.update(env)
                try:
                    p = build()
                    checks[f"{name}/{arm}/M{batch}"] = err = p.check()
                    # fp16 outputs (cuBLAS; the norms, compiled or fused, narrow to fp16 and
                    # may round a coordinate one or two units apart from the eager reference)
                    tol = 1e-3 if arm == "fp16" else 2e-3 if arm.startswith(
                        ("tetra48-mma", "tetra48-dense", "norm")) else 1e-5
                    if not arm.startswith("null") and not err <= tol:
                        raise AssertionError(f"error {err:.2e} > {tol:g}; not timing")
                    graphs[arm] = Graphed(p, args.sets)
                except Exception as exc:  # keep going: one broken arm must not hide the others
                    print(f"!! {name} M={batch} {arm}: {exc!r}"[:2000], flush=True)
                    results.append({"model": name, "arm": arm, "batch": batch,
                                    "error": repr(exc)[:500]})
                    torch.cuda.empty_cache()
                finally:  # captured graphs keep their kernels; the environment goes back
                    for var, old in saved.items():
                        if old is None:
                            os.environ.pop(var, None)
                        else:
                            os.environ[var] = old
            if "fp16" not in graphs:
                continue
            per_round: dict[str, list[float]] = {a: [] for a in graphs}
            for _ in range(args.rounds):
                for arm, gr in graphs.items():
                    per_round[arm].append(gr.time(args.reps))
            for arm, gr in graphs.items():
                ms = statistics.median(per_round[arm])
                ratios = [f / a for f, a in zip(per_round["fp16"], per_round[arm])]
                gbps = gr.p.bytes / (min(per_round[arm]) * 1e-3) / 1e9 if gr.p.bytes else 0.0
                uses_m1 = "m1" in arm or arm.startswith("served") or arm == "tetra48"
                results.append({
                    "model": name, "arm": arm, "batch": batch, "ms": round(ms, 4),
                    "ms_range": [round(min(per_round[arm]), 4), round(max(per_round[arm]), 4)],
                    "gbps": round(gbps, 1), "gb": round(gr.p.bytes / 1e9, 3),
                    "frac_copy_bw": round(gbps / copy_gbps, 3),
                    "ratio_vs_fp16": round(statistics.median(ratios), 3),
                    "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                    "launches": gr.p.launches,
                    "max_err": checks[f"{name}/{arm}/M{batch}"] if not arm.startswith("null")
                    else "not compared",
                    "config": (("per shape (sweep)" if best_by_shape and batch == 1
                                else "per shape (ops.m1_config)"
                                if batch == 1 or arm.startswith("planes14")
                                else "per shape and row group (ops.m1_plan)")
                               if uses_m1 else
                               (tile.__dict__ if arm.split("-")[0] in ("tetra48", "planes14",
                                                                       "null") else None)),
                })
                r = results[-1]
                print(f"{name:10s} M={batch} {arm:24s} {r['ms']:8.3f} ms  {r['gbps']:7.1f} GB/s  "
                      f"{r['frac_copy_bw']:5.3f} of copy  {r['ratio_vs_fp16']:6.3f}x fp16 "
                      f"[{r['ratio_range'][0]}-{r['ratio_range'][1]}]", flush=True)
            del graphs
            _LAYERS.clear()
            torch.cuda.empty_cache()
            _write(args.out, {"bench": "matvec", "gpu": gpu, "git": git_rev(), "partial": True,
                              "copy_gbps": round(copy_gbps, 1), "sweep": sweep_table,
                              "results": results})

    sass = {} if args.no_sass else sass_report({**configs, "tile1": tile1})
    for k, v in sass.items():
        print(f"# sass {k}: {json.dumps(v)[:400]}")
    doc = {
        "bench": "matvec", "gpu": gpu, "git": git_rev(), "date": DATE,
        "torch": torch.__version__, "triton": __import__("triton").__version__,
        "copy_gbps": round(copy_gbps, 1),
        "configs": {"1": configs[1].__dict__, "8": configs[8].__dict__, "tile1": tile1.__dict__,
                    "best_by_shape": {f"{k[0]}x{k[1]}": v.__dict__
                                      for k, v in best_by_shape.items()}},
        "sweep": sweep_table, "results": results, "sass": sass,
        "protocol": f"one process; CUDA graph per arm and buffer set ({args.sets}); {args.rounds} "
                    f"rounds x median of {args.reps} replays; ratio = median of per-round ratios",
    }
    _write(args.out, doc)
    print(json.dumps(doc))


def _write(path: str, doc: dict) -> None:
    """Write one JSON line atomically (temp file in the same directory, then rename)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    os.replace(tmp, out)


def dry_run() -> None:
    """Exercise the builders and checks on tiny shapes under the Triton interpreter (CPU)."""
    os.environ["TRITON_INTERPRET"] = "1"
    from leechq.kernels.triton.ops import MatvecConfig

    tiny = Model("tiny", 1, 48, 72, 2, 1, head_dim=24)
    cfg = MatvecConfig(8, 4, 4, False)
    for arm in ("tetra48", "planes14"):
        for fused in (False, True):
            p = build_lattice(tiny, arm, 2, 1, "cpu", 0, fused, cfg)
            p.run(0)
            print(arm, fused, "err", p.check())
    p = build_lattice(tiny, "null", 1, 1, "cpu", 0, True, cfg, null=True)
    p.run(0)
    p.check()
    m1 = MatvecConfig(rows=8, bp=8, num_warps=1, kernel="m1", ctas_per_sm=1)
    for kw in ({}, {"noprep": True}, {"rotate": True}, {"noprep": True, "korder": True},
               {"rotate": True, "korder": True}, {"noprep": True, "t64": True},
               {"rotate": True, "t64": True}):
        p = build_lattice(tiny, "tetra48", 1, 1, "cpu", 0, True, m1, **kw)
        p.run(0)
        print("tetra48-m1", kw, "err", p.check())
    p = build_lattice(tiny, "planes14", 1, 1, "cpu", 0, True, m1)
    p.run(0)
    print("planes14-m1 err", p.check())
    p = build_lattice(tiny, "planes14", 2, 1, "cpu", 0, True, replace(m1, mb=2))
    p.run(0)
    print("planes14-m1 M=2 err", p.check())
    p = build_lattice(tiny, "null", 1, 1, "cpu", 0, True, m1, null=True, noprep=True)
    p.run(0)
    p.check()
    p = build_int4(Model("tiny4", 1, 128, 256, 2, 1, head_dim=64), 1, 1, "cpu", 0)
    p.run(0)
    print("int4 err", p.check())
    for kind in ("mma", "dense"):
        p = build_batched(tiny, kind, 12, 1, "cpu", 0)
        p.run(0)
        print(f"tetra48-{kind} err", p.check())
    for kw in ({}, {"noprep": True, "rows_per_step": 1}, {"noprep": True, "fused_sum": True},
               {"noprep": True, "layout": "planes14"}, {"noprep": True, "korder": True},
               {"noprep": True, "t64": True}):
        p = build_imma(tiny, 3, 1, "cpu", 0, **kw)
        p.run(0)
        print("tetra48-imma", kw, "err", p.check())
    for splits in (1, 4):
        p = build_pre_ops(tiny, 2, 1, "cpu", 0, fused=True, splits=splits)
        p.run(0)
        print(f"norm-rotation splits={splits} err", p.check())
    p = build_rotation(tiny, 2, 1, "cpu", 0, splits=4)
    p.run(0)
    print("rotation splits=4 err", p.check())
    print(json.dumps({"bench": "matvec", "dry_run": True}))


if __name__ == "__main__":
    main()
