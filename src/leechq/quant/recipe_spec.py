"""What a quantization recipe is: the resolved settings of its steps (:class:`Recipe`), the
named ``bare`` and ``full`` recipes with their defaults (:func:`resolve_recipe`), and the recipe
record's JSON form (``to_dict`` / ``from_dict``, schema :data:`RECIPE_SCHEMA`).

Running a recipe is :func:`leechq.quant.recipe.run_recipe`; this module only describes one, so the
CLI, the benchmarks and the table step can name and check a recipe without the runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leechq.errors import InvalidInput
from leechq.quant.row_scales import RowScaleConfig
from leechq.quant.tune import TuneConfig, tune_settings

RECIPE_NAMES = ("bare", "full")
RECIPE_SCHEMA = 1
DEFAULT_TARGET_BPP = 2.7


@dataclass(frozen=True)
class Recipe:
    """A resolved recipe: which steps run, with which settings.

    Attributes:
        name: "bare", "full" or a free name for a custom composition.
        int4_selection: run step 2 (int4 for the most sensitive lattice matrices).
        target_bpp: whole-model bits-per-parameter budget of step 2 (rule 2 of docs/format.md §4).
        requantize: step 2 re-encodes with the chosen int4 set (True) or swaps records post hoc.
        forced_int4: module-name patterns kept int4 from the first encode (e.g. "self_attn.v_proj").
        int4_group: int4 group size.
        embedding_bits: step 3 width of the token embedding table (4 or 8; None keeps it).
        lattice_embedding: step 3 codes an *untied* token embedding on the lattice instead
            (``embedding_bits`` must then be None; a tied table is refused).
        head_bits: width of an *untied* head (4 or 8; None keeps it); a tied head follows the
            embedding.
        table_upgrades: with ``int4_selection``, a 4-bit table is also a candidate for 8 bits,
            bought from the same budget when its measured gain per bit is better.
        table_group: group size of the embedding/head tables.
        row_scales: step 4 settings (None skips the step).
        tune: step 5 settings (None skips the step).
        sensitivity_windows: calibration windows used to measure step 2's gains.
        sensitivity_window_len: tokens per sensitivity window.
        device: "auto" (CUDA when present), "cpu" or "cuda": where steps 2 and 4 run.
        train_dtype: "auto" (bfloat16 on CUDA, float32 on CPU), "float32" or "bfloat16".
    """

    name: str = "bare"
    int4_selection: bool = False
    target_bpp: float | None = None
    requantize: bool = True
    forced_int4: tuple[str, ...] = ()
    int4_group: int = 128
    embedding_bits: int | None = None
    lattice_embedding: bool = False
    head_bits: int | None = None
    table_upgrades: bool = False
    table_group: int = 64
    row_scales: RowScaleConfig | None = None
    tune: TuneConfig | None = None
    sensitivity_windows: int = 4
    sensitivity_window_len: int = 256
    device: str = "auto"
    train_dtype: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "forced_int4", tuple(self.forced_int4))
        checks = [
            (isinstance(self.name, str) and bool(self.name), "name must be a string"),
            (
                not self.int4_selection
                or (self.target_bpp is not None and self.target_bpp > 0),
                "int4_selection needs a positive target_bpp",
            ),
            (self.embedding_bits in (None, 4, 8), "embedding_bits must be None, 4 or 8"),
            (isinstance(self.lattice_embedding, bool), "lattice_embedding must be a bool"),
            (not (self.lattice_embedding and self.embedding_bits is not None),
             "lattice_embedding codes the embedding: embedding_bits must then be None"),
            (self.head_bits in (None, 4, 8), "head_bits must be None, 4 or 8"),
            (self.table_group >= 2, "table_group must be >= 2"),
            (self.int4_group >= 2 and self.int4_group % 2 == 0, "int4_group must be even >= 2"),
            (self.sensitivity_windows >= 1, "sensitivity_windows must be >= 1"),
            (self.sensitivity_window_len >= 2, "sensitivity_window_len must be >= 2"),
            (self.device in ("auto", "cpu", "cuda"), "device must be auto, cpu or cuda"),
            (
                self.train_dtype in ("auto", "float32", "bfloat16"),
                "train_dtype must be auto, float32 or bfloat16",
            ),
            (all(isinstance(p, str) and p for p in self.forced_int4), "forced_int4: names"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(f"Recipe: {message}")

    @property
    def steps(self) -> list[str]:
        """The steps that run, in order."""
        out = ["encode"]
        if self.int4_selection:
            out.append("int4_by_sensitivity")
        if (self.embedding_bits is not None or self.head_bits is not None
                or self.lattice_embedding):
            out.append("tables")
        if self.row_scales is not None:
            out.append("row_scales")
        if self.tune is not None:
            out.append("tune")
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (the row-scale settings nested)."""
        out = dataclasses.asdict(self)
        out["forced_int4"] = list(self.forced_int4)
        out["row_scales"] = None if self.row_scales is None else self.row_scales.to_dict()
        out["tune"] = None if self.tune is None else self.tune.to_dict()
        out["steps"] = self.steps
        out["schema"] = RECIPE_SCHEMA
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """Inverse of :meth:`to_dict`."""
        data = dict(data)
        data.pop("steps", None)
        if data.pop("schema", RECIPE_SCHEMA) != RECIPE_SCHEMA:
            raise InvalidInput("Recipe: unknown schema")
        rs = data.get("row_scales")
        if rs is not None:
            data["row_scales"] = RowScaleConfig.from_dict(rs)
        if data.get("tune") is not None:
            data["tune"] = TuneConfig.from_dict(data["tune"])
        return cls(**data)

    def replace(self, **changes: Any) -> Recipe:
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line naming what this recipe does (P4: built from the fields, never hard-coded)."""
        parts = [f"recipe {self.name}: lattice encode"]
        if self.forced_int4:
            parts.append(f"int4 g{self.int4_group} forced for {list(self.forced_int4)}")
        if self.int4_selection:
            how = "re-encoded" if self.requantize else "swapped post hoc"
            ups = ", 4-bit tables upgradable to 8" if self.table_upgrades else ""
            parts.append(
                f"int4 g{self.int4_group} for the most KL-sensitive matrices{ups} under "
                f"{self.target_bpp:g} b/param ({how}; {self.sensitivity_windows}x"
                f"{self.sensitivity_window_len} calibration tokens)"
            )
        if self.embedding_bits is not None:
            parts.append(f"{self.embedding_bits}-bit g{self.table_group} embedding")
        if self.lattice_embedding:
            parts.append("lattice-coded embedding")
        if self.head_bits is not None:
            parts.append(f"{self.head_bits}-bit g{self.table_group} untied head")
        if self.row_scales is not None:
            rs = self.row_scales
            steps = f"{rs.steps} steps" if rs.steps else f"{rs.time_budget_s:g} s budget"
            parts.append(
                f"row scales by KL (AdamW lr {rs.lr:g}, warm-up {rs.warmup_steps}, cosine to "
                f"{rs.final_lr_fraction:g}, batch {rs.batch}, {steps})"
            )
        if self.tune is not None:
            tc = self.tune
            steps = f"{tc.steps} steps" if tc.steps else f"{tc.time_budget_s:g} s budget"
            teacher = f"teacher top-{tc.teacher_topk}" if tc.teacher_topk else "full teacher"
            parts.append(
                f"end-to-end tuning of {', '.join(tc.groups)} by KL ({teacher}, AdamW lr "
                f"{tc.lr:g}, batch {tc.batch}, {steps}, held-out monitor every "
                f"{tc.monitor_every} steps)"
            )
        return "; ".join(parts)


def resolve_recipe(
    name: str, target_bpp: float | None = None, **overrides: Any
) -> Recipe:
    """The named recipe with its defaults, then ``overrides``.

    * ``bare``: every projection on the lattice, tables kept as in the checkpoint.
    * ``full``: int4 for the most sensitive matrices under ``target_bpp`` (default 2.7), a 4-bit
      embedding (tied head included) that the same budget may upgrade to 8 bits, an 8-bit untied
      head, row scales trained by KL, then :data:`~leechq.quant.tune.DEFAULT_TUNE_STEPS` steps of
      end-to-end tuning (:func:`~leechq.quant.tune.tune_settings`; ``tune=None`` leaves it out).

    Raises:
        InvalidInput: an unknown name, or ``target_bpp`` given to ``bare``.
    """
    if name == "bare":
        if target_bpp is not None:
            raise InvalidInput("--target-bpp applies to the full recipe only")
        return Recipe(name="bare", **overrides)
    if name == "full":
        base = Recipe(
            name="full",
            int4_selection=True,
            target_bpp=DEFAULT_TARGET_BPP if target_bpp is None else float(target_bpp),
            embedding_bits=4,
            head_bits=8,
            table_upgrades=True,
            row_scales=RowScaleConfig(),
            tune=tune_settings(),
        )
        return base.replace(**overrides) if overrides else base
    raise InvalidInput(f"unknown recipe {name!r}; choices: {', '.join(RECIPE_NAMES)}")
