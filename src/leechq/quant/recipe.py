"""The ``bare`` and ``full`` quantization recipes as composable, recorded steps.

Implements docs/quantizer.md §7 (the full-model recipe of the sealed Tetra files) on top of
the lattice encoder, with every resolved setting and every measured decision recorded in the
artifact (pitfall P4: the log line and the metadata come from the objects that ran, never from a
hard-coded string):

1. **encode** — the layer-wise lattice encoding (``quantize_fn``; int4 for ``forced_int4``);
2. **int4 by sensitivity** (docs/quantizer.md §7) — for every lattice matrix, the KL reduction on
   *calibration* windows when that matrix alone goes to int4 g128 (round-to-nearest of the original
   tensor) in the encoded model with the final tables (:mod:`leechq.quant.sensitivity`); likewise
   for every 4-bit table, the reduction when it alone is 8-bit (``table_upgrades``); a greedy choice
   by gain per bit under the whole-model ``target_bpp`` budget; then a re-encode with the chosen
   int4 set (``requantize``, faithful: later lattice matrices are calibrated through the int4 ones)
   or a post-hoc swap of the records;
3. **tables** (docs/format.md §3) — group-affine 4- or 8-bit token embedding (group 64, f16 scale
   and offset) or, with ``lattice_embedding``, an untied embedding coded on the lattice
   (:mod:`leechq.quant.embedding`; coded right after the encode, so that every later step sees
   it, and recorded beside the projections), and a separate width for an untied head; a tied head
   is one table, stored once. An encoder config with ``lattice_head`` codes an untied head in
   step 1 instead (:mod:`leechq.models.head`): it is then one more matrix to steps 2, 4 and 5,
   and has no table;
4. **row scales** (docs/quantizer.md §7) — λ per lattice row trained by KL to the teacher, folded
   into the f64 row scales (:mod:`leechq.quant.row_scales`);
5. **tune** — every continuous stored number (row scales, gain centroids, int4 and table
   scales/offsets, norm weights, biases) trained end to end by KL to the teacher, the held-out
   monitor keeping the best state (:mod:`leechq.quant.tune`); part of ``full`` by default
   (:data:`leechq.quant.tune.DEFAULT_TUNE_STEPS`), skipped with a warning on a CUDA device whose
   free memory is below :func:`leechq.quant.tune.tune_memory_bytes` (:func:`tuning_fits`).

Every step shows a progress bar with a time estimate (tqdm) when ``progress`` is on.

The planned accounting (whole-model bits per parameter, rule 2 of docs/format.md §4) comes from
:mod:`leechq.formats.accounting`; the written artifact's three rates come from
:func:`leechq.formats.accounting.artifact_report`.

What a recipe is (:class:`~leechq.quant.recipe_spec.Recipe`, the named recipes' defaults in
:func:`~leechq.quant.recipe_spec.resolve_recipe`) lives in :mod:`leechq.quant.recipe_spec`; this
module runs one. It is model-agnostic (layer ``quant``): the caller supplies ``quantize_fn`` (e.g.
:func:`leechq.models.quantize.quantize_model_in_place`) and the embedding / head tensor names.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from leechq.config import QuantConfig
from leechq.errors import InvalidInput
from leechq.formats.accounting import (
    ModelBits,
    raw_served_bits,
    record_served_bits,
    whole_model_bits,
)
from leechq.formats.artifact import GroupAffine
from leechq.formats.quantized_weight import Int4Weight, QuantizedWeight
from leechq.quant.composed import NotComposable
from leechq.quant.recipe_spec import Recipe
from leechq.quant.row_scales import set_module_weights, train_row_scales
from leechq.quant.sensitivity import Candidate, measure_swaps, select_under_budget
from leechq.quant.tables import (
    apply_lattice,
    apply_tables,
    check_lattice_table,
    encoding_of,
    ga_source,
    split_lattice_tables,
    table_records,
)
from leechq.quant.tune import TuneConfig, set_raw, tune_memory_bytes, tune_model

log = logging.getLogger("leechq.quant")


# --------------------------------------------------------------------------------------------------
# results


@dataclass
class RecipeResult:
    """What :func:`run_recipe` produced.

    Attributes:
        model: the student model (its linears and tables hold exactly the stored values).
        records: module name → record.
        raw: every other stored tensor (dense or :class:`GroupAffine`).
        tied: alias → stored tensor name.
        config: the resolved :class:`QuantConfig` of the final encode (``int4_modules`` and
            ``embedding_encoding`` as stored).
        recipe: the resolved recipe.
        metadata: the recipe record for the artifact's provenance (steps, times, evidence).
        provenance: the encoder's provenance (model fingerprint, calibration digest, ...).
        sensitivity: step 2's measurements by candidate (:func:`measure_swaps`'s results; empty
            without the step), which :func:`run_recipe` can reuse for another budget.
    """

    model: nn.Module
    records: dict[str, QuantizedWeight | Int4Weight]
    raw: dict[str, torch.Tensor | GroupAffine]
    tied: dict[str, str]
    config: QuantConfig
    recipe: Recipe
    metadata: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)
    sensitivity: dict[str, Any] = field(default_factory=dict)

    def bits(self, dense_projections: Sequence[str] = ()) -> ModelBits:
        """Planned whole-model bits (rule 2); ``dense_projections``: see :func:`projected_bits`."""
        return projected_bits(self.records, self.raw, dense_projections)

    def write(
        self,
        out_dir: Any,
        *,
        base_config: Mapping[str, Any],
        tokenizer: Any = None,
        provenance: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> Any:
        """Write the artifact (:func:`leechq.formats.artifact.write_artifact`) with the recipe
        record under ``provenance["recipe"]``."""
        from leechq.formats.artifact import write_artifact

        prov = dict(self.provenance)
        prov.update(provenance or {})
        prov["recipe"] = self.metadata
        return write_artifact(
            out_dir,
            base_config=base_config,
            quant_config=self.config,
            records=self.records,
            raw=self.raw,
            tied=self.tied,
            tokenizer=tokenizer,
            provenance=prov,
            overwrite=overwrite,
        )


# --------------------------------------------------------------------------------------------------
# accounting with projected dense projections


def projected_bits(
    records: Mapping[str, QuantizedWeight | Int4Weight],
    raw: Mapping[str, torch.Tensor | GroupAffine],
    dense_projections: Sequence[str] = (),
) -> ModelBits:
    """Whole-model bits, with the raw tensors named in ``dense_projections`` counted as if they were
    quantized at the records' mean served rate.

    ``dense_projections`` is for partial-depth runs (only some blocks encoded, to save time): it
    estimates the full-depth rate of the same per-weight mix. Empty for a real run, where this is
    exactly :func:`leechq.formats.accounting.whole_model_bits`.
    """
    actual = whole_model_bits(records, raw)
    if not dense_projections:
        return actual
    rate = actual.record_bits / max(1, actual.record_weights)
    moved_bits = 0.0
    moved_weights = 0
    for name in dense_projections:
        t = raw.get(name)
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise InvalidInput(f"dense projection {name!r} is not a 2-D raw tensor")
        moved_bits += 16.0 * t.numel()
        moved_weights += t.numel()
    served = actual.served_bits - moved_bits + rate * moved_weights
    return ModelBits(
        served, actual.parameters, actual.record_bits + rate * moved_weights,
        actual.record_weights + moved_weights,
    )


# --------------------------------------------------------------------------------------------------
# steps


def _device_dtype(recipe: Recipe) -> tuple[torch.device, torch.dtype]:
    if recipe.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        if recipe.device == "cuda" and not torch.cuda.is_available():
            raise InvalidInput("recipe.device is 'cuda' but no CUDA device is available")
        device = torch.device(recipe.device)
    if recipe.train_dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, recipe.train_dtype)
    return device, dtype


def tuning_fits(recipe: Recipe, reference: nn.Module, window: int) -> str | None:
    """Why ``recipe``'s tuning step cannot run on its device for ``reference``, or None.

    Only a CUDA device is checked: its free memory against
    :func:`~leechq.quant.tune.tune_memory_bytes` for steps of ``recipe.tune.batch`` windows of
    ``window`` tokens.
    """
    if recipe.tune is None:
        return None
    device, _ = _device_dtype(recipe)
    if device.type != "cuda":
        return None
    need = tune_memory_bytes(reference, on_cuda=True, tokens=recipe.tune.batch * window)
    free, _total = torch.cuda.mem_get_info(device)
    if need <= free:
        return None
    gib = 1024.0**3
    return (f"end-to-end tuning needs about {need / gib:.1f} GiB on {device} and "
            f"{free / gib:.1f} GiB are free: skipped, the artifact is the full recipe without "
            f"it (--tune-steps 0 leaves it out without this warning)")


def _without_tuning(recipe: Recipe, meta: dict[str, Any], reason: str) -> Recipe:
    """``recipe`` without its tuning step, ``reason`` warned and recorded in ``meta``."""
    log.warning("leechq: %s", reason)
    recipe = recipe.replace(tune=None)
    meta["tune"] = {"skipped": reason}
    meta["recipe"], meta["describe"] = recipe.to_dict(), recipe.describe()
    return recipe


def _placed(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """``model`` itself when it already lives on ``device`` in ``dtype``, else a moved copy."""
    p = next(model.parameters())
    if p.device == device and p.dtype == dtype:
        return model
    return copy.deepcopy(model).to(device=device, dtype=dtype)


def _original_weights(reference: nn.Module, names: Sequence[str]) -> dict[str, torch.Tensor]:
    return {n: reference.get_submodule(n).weight.detach().to(torch.float32).cpu() for n in names}


def _tune_step(
    student: nn.Module,
    reference: nn.Module,
    records: dict[str, QuantizedWeight | Int4Weight],
    raw: dict[str, torch.Tensor | GroupAffine],
    tied: Mapping[str, str],
    train_windows: torch.Tensor,
    tune: TuneConfig,
    device: torch.device,
    dtype: torch.dtype,
    *,
    monitor_windows: torch.Tensor | None,
    checkpoint_dir: Any,
    progress: bool,
) -> dict[str, Any]:
    """Step 5: tune ``student``'s continuous parameters; ``records``/``raw`` and ``student`` are
    updated in place with the folded result. Returns the step's summary."""
    train_model = _placed(student, device, torch.float32)
    stored_raw = {n: t for n, t in raw.items() if n not in tied}
    result = tune_model(
        train_model, _placed(reference, device, dtype), records, stored_raw, train_windows,
        tune, monitor_windows=monitor_windows, checkpoint_dir=checkpoint_dir, progress=progress,
    )
    records.update(result.records)
    raw.update(result.raw)
    if train_model is not student:  # decoded where the training ran (the same bits, faster)
        set_module_weights(student, result.records, decode_device=device)
        set_raw(student, result.raw)
    summary = result.summary()
    summary["train_windows"] = list(train_windows.shape)
    summary["device"] = str(device)
    return summary


def tune_result(
    result: RecipeResult,
    reference: nn.Module,
    tune: TuneConfig,
    train_windows: torch.Tensor,
    *,
    monitor_windows: torch.Tensor | None = None,
    checkpoint_dir: Any = None,
    progress: bool = False,
) -> RecipeResult:
    """``result`` (a recipe run without tuning) with the end-to-end tuning step added: the same as
    running its recipe with ``tune`` set, without repeating the encode and sensitivity steps.
    ``result`` is left unchanged (its model is copied).

    Args:
        result: a :class:`RecipeResult` whose recipe has no tuning step.
        reference: the dense teacher (unchanged).
        tune: the tuning settings.
        train_windows: int64 [N, T] training windows (calibration split).
        monitor_windows: int64 [M, T] held-out monitor windows, or None.
        checkpoint_dir: directory for the resumable tuning checkpoint, or None.
        progress: a tqdm bar.

    Raises:
        InvalidInput: ``result`` was already tuned.
    """
    if result.recipe.tune is not None:
        raise InvalidInput("tune_result: this result's recipe already has a tuning step")
    recipe = result.recipe.replace(tune=tune)
    device, dtype = _device_dtype(recipe)
    student = copy.deepcopy(result.model)
    records, lattice = split_lattice_tables(student, result.records)
    raw = dict(result.raw)
    for name in lattice:  # the student holds the decode: a dense table to the tuning, left as is
        raw[name] = student.get_parameter(name).detach().float()
    meta = copy.deepcopy(result.metadata)
    t0 = time.perf_counter()
    meta["tune"] = _tune_step(student, reference, records, raw, result.tied, train_windows, tune,
                              device, dtype, monitor_windows=monitor_windows,
                              checkpoint_dir=checkpoint_dir, progress=progress)
    for name, rec in lattice.items():
        raw.pop(name, None)
        records[name.rsplit(".", 1)[0]] = rec
    seconds = time.perf_counter() - t0
    meta["steps"].append({"step": "tune", "seconds": seconds})
    meta["recipe"], meta["describe"] = recipe.to_dict(), recipe.describe()
    meta["seconds"] = float(meta.get("seconds", 0.0)) + seconds
    # tuning changes stored values, not what is stored: the bits per parameter stay as they were
    return RecipeResult(student, records, raw, dict(result.tied), result.config, recipe, meta,
                        dict(result.provenance), dict(result.sensitivity))


def _sensitivity_identity(config: QuantConfig, enc: Any, tables: Mapping[str, GroupAffine],
                          recipe: Recipe, swaps: Mapping[str, torch.Tensor]) -> str:
    """A name for step 2's measurements: the encode (its configuration, model and calibration),
    the tables in place, the int4 / table widths of the swaps and the candidates."""
    prov = getattr(enc, "provenance", {}) or {}
    ident = [config.digest(), prov.get("model_fingerprint"), prov.get("calibration_digest"),
             {t: [ga.bits, ga.group] for t, ga in sorted(tables.items())},
             recipe.int4_group, recipe.table_group, sorted(swaps)]
    if recipe.lattice_embedding:  # (absent otherwise: earlier checkpoints keep their names)
        ident.append("lattice-embedding")
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_recipe(
    reference: nn.Module,
    calib_windows: torch.Tensor,
    base_config: QuantConfig,
    recipe: Recipe,
    *,
    quantize_fn: Callable[[nn.Module, torch.Tensor, QuantConfig], Any],
    embed_name: str,
    head_name: str | None,
    train_windows: torch.Tensor | None = None,
    sensitivity_windows: torch.Tensor | None = None,
    monitor_windows: torch.Tensor | None = None,
    dense_projections: Sequence[str] = (),
    checkpoint_dir: Any = None,
    tune_checkpoint_dir: Any = None,
    student: nn.Module | None = None,
    encoded: Any = None,
    sensitivity: Mapping[str, Any] | None = None,
    sensitivity_checkpoint_dir: Any = None,
    progress: bool = False,
) -> RecipeResult:
    """Run ``recipe`` on ``reference`` (left unchanged) and return the quantized model and records.

    Args:
        reference: the dense reference model (teacher of steps 2 and 4).
        calib_windows: int64 [n, T] encoding calibration windows.
        base_config: the encoder configuration (its ``int4_modules`` are replaced by the recipe's
            ``forced_int4`` + chosen set, its ``embedding_encoding`` by the tables' width; it must
            keep the embedding, "keep", because tables are a recipe step).
        recipe: the resolved recipe.
        quantize_fn: ``quantize_fn(model, calib_windows, config)`` quantizes ``model`` in place and
            returns an object with ``records``, ``raw``, ``tied``, ``seconds`` and ``provenance``
            (:func:`leechq.models.quantize.quantize_model_in_place` with ``progress`` bound).
        embed_name: the token embedding's tensor name (e.g. ``model.embed_tokens.weight``).
        head_name: the head's tensor name (``lm_head.weight``) or None.
        train_windows: int64 [N, T] row-scale training windows (calibration split).
        sensitivity_windows: int64 [M, T'] windows of step 2 (calibration split).
        monitor_windows: fixed calibration windows on which step 4 reports KL before/after.
        dense_projections: raw projection tensors of a partial-depth run (accounting only, see
            :func:`projected_bits`).
        checkpoint_dir: directory for the row-scale checkpoint (resumable).
        tune_checkpoint_dir: directory for the tuning checkpoint (resumable).
        student, encoded: a model already encoded with ``base_config`` (+ forced int4) and the
            ``quantize_fn`` result that made it, to skip the first encode (benchmarks reuse one).
        sensitivity: step 2's measurements of an earlier result over the same encode and tables
            (:attr:`RecipeResult.sensitivity`, e.g. at another ``target_bpp``), used instead of
            measuring again; it must cover exactly this run's candidates.
        sensitivity_checkpoint_dir: directory for step 2's measurements so far (resumable; one
            file per encode, tables and candidates, :class:`MeasurementCheckpoint`).
        progress: tqdm bars (with time estimates) for the sensitivity, row-scale and tuning steps.

    Returns:
        :class:`RecipeResult`.
    """
    if base_config.embedding_encoding != "keep":
        raise InvalidInput("run_recipe: the encoder must keep the tables (tables are step 3)")
    if recipe.int4_selection and sensitivity_windows is None:
        raise InvalidInput("run_recipe: int4 selection needs sensitivity_windows")
    if recipe.lattice_embedding:
        check_lattice_table(reference, embed_name, head_name, base_config)
    if base_config.lattice_head and recipe.head_bits is not None:
        raise InvalidInput("run_recipe: the encoder codes the head on the lattice (lattice_head):"
                           " the recipe's head_bits must then be None")
    if (recipe.row_scales is not None or recipe.tune is not None) and train_windows is None:
        raise InvalidInput("run_recipe: row-scale training and tuning need train_windows")
    started = time.perf_counter()
    steps: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"recipe": recipe.to_dict(), "describe": recipe.describe(),
                            "steps": steps}
    skipped = (None if train_windows is None
               else tuning_fits(recipe, reference, int(train_windows.shape[1])))
    if skipped is not None:
        recipe = _without_tuning(recipe, meta, skipped)
    log.info("leechq %s", recipe.describe())
    config = base_config.replace(
        int4_modules=tuple(recipe.forced_int4), int4_group=recipe.int4_group
    )

    def encode(cfg: QuantConfig) -> tuple[nn.Module, Any]:
        model = copy.deepcopy(reference)
        return model, quantize_fn(model, calib_windows, cfg)

    # 1. encode
    t0 = time.perf_counter()
    if student is None or encoded is None:
        student, enc = encode(config)
    else:
        enc = encoded
    records: dict[str, QuantizedWeight | Int4Weight] = dict(enc.records)
    raw: dict[str, torch.Tensor | GroupAffine] = dict(enc.raw)
    tied = dict(enc.tied)
    encode_seconds = float(getattr(enc, "seconds", time.perf_counter() - t0))
    steps.append({"step": "encode", "seconds": time.perf_counter() - t0,
                  "encoder_seconds": encode_seconds, "config_digest": config.digest()})
    bare_bits = projected_bits(records, raw, dense_projections)
    meta["bare_bits_per_param"] = bare_bits.bits_per_param

    tables = table_records(raw, tied, recipe, embed_name, head_name)
    lattice: dict[str, QuantizedWeight] = {}  # the lattice-coded embedding, by tensor name
    decoded: dict[str, torch.Tensor] = {}  # its decode, made once
    if recipe.lattice_embedding:
        t0 = time.perf_counter()
        from leechq.quant.embedding import encode_embedding

        lattice[embed_name] = encode_embedding(reference.get_parameter(embed_name), config,
                                               name=embed_name, progress=progress)
        decoded[embed_name] = lattice[embed_name].dequantize(torch.float32)
        apply_lattice(student, raw, decoded)
        steps.append({"step": "lattice_embedding", "seconds": time.perf_counter() - t0})
    device, dtype = _device_dtype(recipe)

    # 2. int4 by sensitivity (measured with the final tables in place)
    if recipe.int4_selection:
        t0 = time.perf_counter()
        apply_tables(student, tables)
        matrices = [n for n, r in records.items() if isinstance(r, QuantizedWeight)]
        originals = _original_weights(reference, matrices)
        int4 = {n: Int4Weight.quantize(originals[n], group=recipe.int4_group) for n in matrices}
        swaps = {n: rec.dequantize(torch.float32) for n, rec in int4.items()}
        upgrades: dict[str, tuple[str, GroupAffine]] = {}  # module -> (tensor, 8-bit table)
        if recipe.table_upgrades:
            for tname, ga in tables.items():
                if ga.bits == 4:
                    up = GroupAffine.quantize(ga_source(raw[tname]), 8, recipe.table_group)
                    module = tname.rsplit(".", 1)[0]
                    upgrades[module] = (tname, up)
                    swaps[module] = up.dequantize(torch.float32)
        if sensitivity is None:
            sens_model = _placed(student, device, dtype)
            teacher = _placed(reference, device, dtype)
            kept = None
            if sensitivity_checkpoint_dir is not None:
                ident = _sensitivity_identity(config, enc, tables, recipe, swaps)
                kept = Path(sensitivity_checkpoint_dir) / f"{ident}.json"
            measured = measure_swaps(sens_model, teacher, sensitivity_windows, swaps,
                                     progress=progress, checkpoint=kept)
            del sens_model, teacher
        elif set(sensitivity) != set(swaps):
            raise InvalidInput("run_recipe: the given sensitivity measurements do not cover "
                               "exactly this run's int4 / table candidates")
        else:
            measured = dict(sensitivity)
        planned_raw = {**raw, **tables, **lattice}
        plan_bits = projected_bits(records, planned_raw, dense_projections)
        record_weights = sum(r.d_out * r.d_in for r in records.values())
        scale = plan_bits.record_weights / max(1, record_weights)
        budget = recipe.target_bpp * plan_bits.parameters - plan_bits.served_bits
        if budget < 0:  # the floor itself is above the target: say why, once the rate is final
            table_params = (sum(ga.rows * ga.cols for ga in tables.values())
                            + sum(r.d_out * r.d_in for r in lattice.values()))
            meta["floor"] = {"bits_per_param": plan_bits.bits_per_param,
                             "table_share": table_params / max(1, plan_bits.parameters),
                             "table_bits": sorted({ga.bits for ga in tables.values()})}
        candidates = [
            Candidate(
                name=n,
                gain=measured[n].gain,
                extra_bits=scale * (record_served_bits(int4[n]) - record_served_bits(records[n])),
                weights=records[n].d_out * records[n].d_in,
            )
            for n in matrices
        ] + [
            Candidate(  # a table is whole-model already: no depth scaling
                name=m,
                gain=measured[m].gain,
                extra_bits=raw_served_bits(up)[0] - raw_served_bits(tables[t])[0],
                weights=up.rows * up.cols,
            )
            for m, (t, up) in upgrades.items()
        ]
        selection = select_under_budget(candidates, budget)
        log.info("int4 selection at %g b/param: %s", recipe.target_bpp, selection.summary())
        for m in selection.chosen:
            if m in upgrades:
                t, up = upgrades[m]
                tables[t] = up
        chosen = [n for n in selection.chosen if n not in upgrades]
        if chosen and recipe.requantize:
            config = config.replace(int4_modules=tuple(recipe.forced_int4) + tuple(chosen))
            student, enc = encode(config)
            records = dict(enc.records)
            raw = dict(enc.raw)
            tied = dict(enc.tied)
        elif chosen:
            swapped = {n: int4[n] for n in chosen}
            records.update(swapped)
            set_module_weights(student, swapped)
        meta["sensitivity"] = {
            "mode": "restore: lattice -> int4 alone, in the encoded model with final tables",
            "windows": list(sensitivity_windows.shape),
            "kl_base": next(iter(measured.values())).kl_base if measured else None,
            "matrices": {
                c.name: {"gain": c.gain, "kl_swapped": measured[c.name].kl_swapped,
                         "extra_bits": c.extra_bits, "weights": c.weights}
                for c in candidates
            },
        }
        meta["selection"] = {
            **selection.to_dict(),
            "target_bpp": recipe.target_bpp,
            "applied": "re-encoded" if recipe.requantize else "post-hoc swap",
            "cost_scale": scale,
            "int4": chosen,
            "tables_upgraded": [upgrades[m][0] for m in selection.chosen if m in upgrades],
        }
        steps.append({"step": "int4_by_sensitivity", "seconds": time.perf_counter() - t0,
                      "chosen": len(chosen)})

    # 3. tables
    if tables or lattice:
        t0 = time.perf_counter()
        raw.update(tables)
        apply_tables(student, tables)
        apply_lattice(student, raw, decoded)  # again: a re-encode in step 2 reset the student
        embed_bits = tables[embed_name].bits if embed_name in tables else None
        config = config.replace(
            embedding_encoding="lattice" if lattice else encoding_of(embed_bits))
        steps.append({"step": "tables", "seconds": time.perf_counter() - t0,
                      "tables": {n: {"bits": g.bits, "group": g.group, "dims": list(g.dims)}
                                 for n, g in tables.items()},
                      "lattice": {n: {"codebook": r.codebook, "dims": [r.d_out, r.d_in],
                                      "served_bits_per_weight":
                                      record_served_bits(r) / (r.d_out * r.d_in)}
                                  for n, r in lattice.items()},
                      "tied": dict(tied)})

    # 4. row scales (nothing to train when the budget moved every matrix to int4)
    if recipe.row_scales is not None and not any(
        isinstance(r, QuantizedWeight) for r in records.values()
    ):
        meta["row_scales"] = {"skipped": "no lattice records (every matrix is int4)"}
    elif recipe.row_scales is not None:
        t0 = time.perf_counter()
        train_model = _placed(student, device, dtype)
        teacher = _placed(reference, device, dtype)
        result = train_row_scales(
            train_model, teacher, records, train_windows, recipe.row_scales,
            checkpoint_dir=checkpoint_dir, monitor_windows=monitor_windows, progress=progress,
        )
        del teacher
        records.update(result.records)
        if train_model is not student:
            set_module_weights(student, result.records, decode_device=device)
        meta["row_scales"] = result.summary()
        meta["row_scales"]["train_windows"] = list(train_windows.shape)
        meta["row_scales"]["device"] = str(device)
        meta["row_scales"]["dtype"] = str(dtype).replace("torch.", "")
        steps.append({"step": "row_scales", "seconds": time.perf_counter() - t0})

    # 5. end-to-end tuning (the student in f32 on the device; bf16 autocast there on CUDA)
    if recipe.tune is not None:
        t0 = time.perf_counter()
        try:
            meta["tune"] = _tune_step(student, reference, records, raw, tied, train_windows,
                                      recipe.tune, device, dtype, monitor_windows=monitor_windows,
                                      checkpoint_dir=tune_checkpoint_dir, progress=progress)
            steps.append({"step": "tune", "seconds": time.perf_counter() - t0})
        except NotComposable as exc:  # the model is untouched: the result is steps 1-4
            recipe = _without_tuning(recipe, meta, f"{exc}; the tuning step is skipped")

    for name in lattice:  # a table until now; stored as a record
        raw.pop(name, None)
    final = projected_bits(records, {**raw, **lattice}, dense_projections)
    records.update({n.rsplit(".", 1)[0]: r for n, r in lattice.items()})
    meta["whole_model_bits_per_param"] = final.bits_per_param
    if "floor" in meta:
        floor = meta["floor"]
        meta["over_target"] = (
            f"{final.bits_per_param:.3f} b/param, above the {recipe.target_bpp:g} target: with "
            f"every projection on the lattice and the tables at "
            f"{'/'.join(map(str, floor['table_bits'])) or 'no'} bits this model needs "
            f"{floor['bits_per_param']:.3f} (the embedding and head tables are "
            f"{100 * floor['table_share']:.0f} % of its parameters), so no int4 matrix or 8-bit "
            f"table fits" + ("; an untied head can start at 4 bits (--head-bits 4)"
                             if 8 in floor["table_bits"] else "")
            + ("; an untied embedding can be coded on the lattice (--lattice-embedding, about "
               "2.2 instead of 4.5 bits a weight)"
               if embed_name in tables and head_name not in tied else "")
            + ("; an untied head too (--lattice-head)"
               if head_name in tables and head_name not in tied else ""))
        log.warning("leechq: %s", meta["over_target"])
    meta["projected"] = bool(dense_projections)
    meta["seconds"] = time.perf_counter() - started
    meta["config_digest"] = config.digest()
    provenance = dict(getattr(enc, "provenance", {}) or {})
    return RecipeResult(student, records, raw, tied, config, recipe, meta, provenance,
                        measured if recipe.int4_selection else {})

