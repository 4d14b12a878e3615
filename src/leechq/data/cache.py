"""Where leechq keeps downloaded and derived files (zoo models, converted checkpoints, corpora).

One rule for every cache user: ``$LEECHQ_CACHE`` if set, else ``~/.cache/leechq``. Sub-directories:
``zoo/`` (:mod:`leechq.models.zoo`), ``converted/`` (:mod:`leechq.models.hf_load`), ``pydoc/``
(:mod:`leechq.data.corpus`). Lives in the lowest layer that needs it so every layer above can share
it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """leechq's cache root: ``$LEECHQ_CACHE`` if set, else ``~/.cache/leechq`` (not created)."""
    env = os.environ.get("LEECHQ_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "leechq"
