"""Layer 2: text data for calibration and evaluation (offline corpora, online corpora, the user's).

The offline Python-docs corpus, its fixed calibration/evaluation split, token windows and token
fingerprints live in :mod:`leechq.data.corpus`; the standard-library code corpus and the default
calibration mix of five domains in :mod:`leechq.data.code_corpus`; Debian's reference manuals and
the Jargon File in :mod:`leechq.data.docs_corpus`; the unseen-domain ``fortunes`` in
:mod:`leechq.data.prose_corpus`; the user's own calibration text (``--calib-data``) in
:mod:`leechq.data.user_text`; the shared cache location in :mod:`leechq.data.cache`.
Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

from leechq.data.cache import cache_root
from leechq.data.corpus import (
    TokenWindows,
    calibration_text,
    consecutive_windows,
    corpus_info,
    describe_split,
    evaluation_text,
    load_text,
    token_fingerprint,
    token_windows,
)

__all__ = [
    "TokenWindows",
    "cache_root",
    "calibration_text",
    "consecutive_windows",
    "corpus_info",
    "describe_split",
    "evaluation_text",
    "load_text",
    "token_fingerprint",
    "token_windows",
]
