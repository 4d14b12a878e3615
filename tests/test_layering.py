"""The import-direction rules of docs/architecture.md §1, checked statically over src/leechq.

Layers (a module may import leechq modules of its own layer or below):
lattice (0) → codebooks (1) → quant, formats, data (2) → kernels (3) → nn (4) → models (5) →
serve, eval (6) → integrations (7) → cli (8). ``utils``, ``errors``, ``registry``, ``config`` and
``_version`` are importable from anywhere. Extra rules: ``formats`` never imports ``quant``;
``lattice`` imports no torch; only ``kernels/triton`` imports triton at module level; only
``integrations`` imports transformers at module level (elsewhere only inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "leechq"
LAYERS = {
    "lattice": 0, "codebooks": 1, "quant": 2, "formats": 2, "data": 2, "kernels": 3, "nn": 4,
    "models": 5, "serve": 6, "eval": 6, "integrations": 7, "cli": 8,
}
BASE = {"utils", "errors", "registry", "config", "_version", "__init__"}


def _package_of(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(tree: ast.Module) -> list[tuple[str, bool]]:
    """(module name, at module level) for every import in the file."""
    out: list[tuple[str, bool]] = []
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, id(node) in top_level) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, id(node) in top_level))
    return out


def _files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p != SRC / "__init__.py")


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_follow_layers(path: Path) -> None:
    pkg = _package_of(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    problems = []
    for name, top in _imports(tree):
        root = name.split(".")[0]
        if root == "leechq":
            parts = name.split(".")
            if len(parts) < 2:
                continue
            target = parts[1]
            if pkg in BASE or target in BASE:
                continue
            if pkg in LAYERS and target in LAYERS and LAYERS[target] > LAYERS[pkg]:
                problems.append(f"{pkg} (layer {LAYERS[pkg]}) imports {name} (layer {LAYERS[target]})")
            if pkg == "formats" and target == "quant":
                problems.append(f"formats imports {name}")
            if target == "lattice" and len(parts) > 2 and parts[2] == "_oracle":
                problems.append(f"src module imports the test-only oracle {name}")
        elif root == "torch" and pkg == "lattice":
            problems.append("lattice imports torch")
        elif root == "triton" and top and "kernels/triton" not in path.as_posix():
            problems.append(f"module-level triton import outside kernels/triton: {name}")
        elif root in ("transformers", "vllm") and top and pkg != "integrations":
            problems.append(f"module-level {root} import outside integrations")
    assert not problems, "; ".join(problems)


def test_every_package_is_known() -> None:
    for path in _files():
        pkg = _package_of(path)
        assert pkg in LAYERS or pkg in BASE, f"{path}: package {pkg!r} has no layer"
