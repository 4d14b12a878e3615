"""The quality report's plot (``benchmarks/quality.py --plot``, ``--plot-from``): perplexity ratio
and KL against whole-model bits per parameter, and the rows of earlier result files to draw.

``docs/quality.png`` is drawn from committed results with ``quality.py --plot-from``;
docs/quality.md holds the list.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PLOT_CAPS = {"ppl_ratio": 4.0, "kl": 3.0}
"""Upper y-limits of the plot's panels: a row above one (scalar 2-bit arms reach ×1e8) is drawn at
the limit as a triangle, its value in its label, so that the rows that matter keep their scale."""


def plot(rows: list[dict[str, Any]], path: Path) -> str:
    """Perplexity ratio and KL vs bits per parameter, a row of two panels per model, both sets in
    each (values above :data:`PLOT_CAPS` drawn at the cap); or why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.2 * len(models)), squeeze=False)
    for row_axes, model in zip(axes, models, strict=True):
        mine = [r for r in rows if r["model"] == model]
        for ax, key, label in ((row_axes[0], "ppl_ratio", "perplexity / reference"),
                               (row_axes[1], "kl", "KL(reference || arm), nats/token")):
            cap = PLOT_CAPS[key]
            for dset, marker, color in (("in-domain", "o", "C0"), ("unseen", "s", "C3")):
                for r in mine:
                    if r["set"] != dset:
                        continue
                    ours = any(t.startswith(("bare", "full")) for t in r["arm"].split())
                    over = r[key] > cap
                    y = cap if over else r[key]
                    ax.scatter(r["bpp"], y, marker="^" if over else marker, s=36 if ours else 26,
                               facecolors=color if ours else "none", edgecolors=color)
                    text = f"{r['arm']} ({r[key]:.3g})" if over else r["arm"]
                    ax.annotate(text, (r["bpp"], y), fontsize=6, xytext=(3, 1),
                                textcoords="offset points")
            low = min(min(r[key] for r in mine), cap)
            ax.set_yscale("log")
            ax.set_ylim(low / 1.15, cap * 1.15)
            ax.set_title(model, fontsize=9)
            ax.set_xlabel("whole-model bits per parameter")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.2)
    fig.suptitle("leechq filled, baselines (RTN, GPTQ, HQQ, llama.cpp) hollow; blue circle: "
                 "in-domain, red square: unseen domain; triangle: off the scale")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def _result_rows(path: Path) -> list[dict[str, Any]]:
    """The ``rows`` of a result file (this script's JSON last line, or a file that is that one
    JSON object, e.g. pretty-printed), or a clear exit."""
    try:
        text = path.read_text(encoding="utf-8")
        try:
            result = json.loads(text)
        except ValueError:
            result = json.loads([ln for ln in text.splitlines() if ln.strip()][-1])
        rows = result["rows"]
    except (OSError, IndexError, KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"{path}: not a quality.py result file ({exc})") from exc
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: 'rows' is not a list")
    return rows


def rows_of(spec: str) -> list[dict[str, Any]]:
    """The rows of the result files of ``spec`` (``a.json,b.json=LABEL``: a ``=LABEL`` names
    that file's arms ``arm [LABEL]``); a (model, arm, set) in several files keeps the later
    file's row."""
    rows_from: list[dict[str, Any]] = []
    for item in spec.split(","):
        name, _, label = item.partition("=")
        rows = _result_rows(Path(name))
        if label:
            rows = [{**r, "arm": f"{r['arm']} [{label}]"} for r in rows]
        rows_from += rows
    return list({(r["model"], r["arm"], r["set"]): r for r in rows_from}.values())
