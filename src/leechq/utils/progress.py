"""Progress bars of every long stage: the quantization stages (encode, teacher logits, probes,
training, sensitivity) and the evaluation tasks.

One helper, so every stage shows the same thing: a tqdm bar on stderr with a rate and a time
estimate, or a disabled bar (every method a no-op) when progress is off — callers never branch.
An enabled bar still honours tqdm's own environment switch (``TQDM_DISABLE=1``), as the encoder's
bar does.
"""

from __future__ import annotations

from typing import Any


def stage_bar(desc: str, total: int | None, unit: str, enabled: bool, initial: int = 0) -> Any:
    """A tqdm bar named ``desc`` over ``total`` ``unit``s (stderr), disabled unless ``enabled``.

    Use it as a context manager or close it; ``update``/``set_postfix`` work either way. An
    enabled bar leaves ``disable`` to tqdm's default, so ``TQDM_DISABLE=1`` in the environment
    still silences it (tqdm reads its ``TQDM_*`` variables only for arguments not passed).
    """
    from tqdm.auto import tqdm

    off = {} if enabled else {"disable": True}
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, **off)
