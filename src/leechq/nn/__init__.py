"""Layer 4: torch modules (the quantized linear and module replacement).

``LeechqLinear`` (:mod:`leechq.nn.linear`), the replacement helpers (:mod:`leechq.nn.replace`),
``LeechqGroup`` (:mod:`leechq.nn.group`: projections that read one input, q|k|v and gate|up, for
``nn`` users and the serving model alike) and the packed 4/8-bit embedding and head tables
(:mod:`leechq.nn.embedding`) are imported on first access, so ``import leechq.nn`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "LeechqLinear": "leechq.nn.linear",
    "LeechqGroup": "leechq.nn.group",
    "replace_with_records": "leechq.nn.replace",
    "replace_with_placeholders": "leechq.nn.replace",
    "share_groups": "leechq.nn.replace",
    "PackedEmbedding": "leechq.nn.embedding",
    "PackedHead": "leechq.nn.embedding",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'leechq.nn' has no attribute {name!r}")
