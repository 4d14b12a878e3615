"""The slot pool of continuous batching: a fixed set of KV-cache rows that requests join and leave
between decode steps.

The serving model (:mod:`leechq.serve.model`) runs every row of a forward at the same cache slot,
each row seeing the slots from its own ``pad[b]`` on. The pool keeps that contract with a *shared
clock*: one slot index ``clock`` for all rows, advanced by every decode step, while each row's
request occupies the slots ``[pad[b], clock)``; its token positions are ``slot - pad[b]``, so they
start at 0 whatever the clock. A request joins by a prefill of its prompt (prompts waiting together
are prefilled in one batch, in a scratch cache of their own width) whose keys and values are copied
into its row at the slots just before the clock; its first decode step is the pool's next step.
When the clock nears the end of the cache, or a joining prompt is longer than the clock, the live
span of every row is moved by one copy (:meth:`SlotPool.rebase`), which changes no position.

A decode step runs the rows ``0 .. bucket-1`` (:func:`batch_bucket` of the highest busy row, rows
taken lowest first); on CUDA each (bucket, sampling structure) is one captured graph over views of
the pool's buffers. Rows sample independently (:class:`~leechq.serve.sampling.RowSampler`), so a
request's tokens do not depend on who shares its steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from leechq.errors import InvalidInput
from leechq.serve.cache import KVCache, round_slots
from leechq.serve.generate import Engine, prefill_bucket
from leechq.serve.graphs import CapturedStep, graph_pool
from leechq.serve.sampling import RowSampler, SamplingConfig, row_key


def batch_bucket(n: int, rows: int) -> int:
    """The rows a decode step runs for ``n`` busy rows: the next power of two, at most ``rows``."""
    return min(rows, 1 << max(0, (n - 1).bit_length()))


class SlotPool:
    """``rows`` KV-cache rows of a shared clock, each holding one request of up to ``context``
    tokens (prompt plus generated).

    Args:
        engine: the :class:`~leechq.serve.generate.Engine` (model, compiled pieces, graph policy).
        rows: concurrent requests (the decode batch at most).
        context: longest request, prompt plus generated tokens (at most the model's positions).

    The cache holds ``2 * context`` slots (rounded up), so a rebase leaves at least ``context``
    steps before the next one.
    """

    def __init__(self, engine: Engine, rows: int, context: int) -> None:
        args = engine.model.args
        if rows < 1:
            raise InvalidInput(f"the slot pool needs at least one row, got {rows}")
        if not 2 <= context <= args.max_position_embeddings:
            raise InvalidInput(
                f"context must be in [2, {args.max_position_embeddings}] (the model's positions), "
                f"got {context}"
            )
        dev = engine.model.device
        self.engine, self.rows, self.context = engine, rows, context
        self.slots = round_slots(2 * context + 2)
        self.cache = KVCache(args, rows, self.slots, engine.dtype, dev, slots_are_positions=False)
        self.tokens = torch.zeros(rows, 1, dtype=torch.int64, device=dev)
        self.pad = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slot = torch.zeros(1, dtype=torch.int64, device=dev)
        self.out = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.sampler = RowSampler(rows, args.vocab_size, dev)
        self.clock = 0
        self.busy: list[SamplingConfig | None] = [None] * rows  # the config of each busy row
        self.start = [0] * rows  # host copy of pad for busy rows
        self.graphs: dict[tuple[Any, ...], CapturedStep] = {}
        self._pool: Any = None

    # -- rows ----------------------------------------------------------------------------------

    def free_rows(self) -> list[int]:
        """Rows without a request, lowest first."""
        return [r for r in range(self.rows) if self.busy[r] is None]

    def release(self, row: int) -> None:
        """Free ``row`` (its request finished or was cancelled); it attends to the clock slot only
        from now on."""
        self.busy[row] = None
        self.pad[row] = self.clock

    def live_span(self) -> int:
        """Slots behind the clock that busy rows still need (0 when none is busy)."""
        return max((self.clock - self.start[r] for r in range(self.rows) if self.busy[r]),
                   default=0)

    def rebase(self, target: int) -> None:
        """Move the clock to ``target`` and every busy row's slots with it (one copy of the live
        span per layer); positions are unchanged. ``target`` must hold the live span and leave a
        decode step: ``live_span() <= target < slots - 2``."""
        span = self.live_span()
        if not span <= target <= self.slots - 3:
            raise InvalidInput(f"cannot rebase the clock to {target}: live span {span}, "
                               f"{self.slots} slots")
        d = target - self.clock
        if d and span:
            lo = self.clock - span
            for t in (*self.cache.k, *self.cache.v):
                moved = t[:, :, lo:self.clock].clone()
                t[:, :, lo + d : self.clock + d].copy_(moved)
        for r in range(self.rows):
            if self.busy[r] is not None:
                self.start[r] += d
        self.clock = target
        self.slot.fill_(target)
        self.pad.copy_(torch.tensor(
            [self.start[r] if self.busy[r] is not None else target for r in range(self.rows)],
            dtype=torch.int64,
        ))

    # -- prefill -------------------------------------------------------------------------------

    @torch.no_grad()
    def admit(self, prompts: Sequence[Sequence[int]], configs: Sequence[SamplingConfig],
              seeds: Sequence[int], pad_id: int = 0) -> tuple[list[int], list[int]]:
        """Prefill ``prompts`` (one batch) into free rows and pick their first tokens.

        Args:
            prompts: token-id lists, each of at most ``context - 1`` ids.
            configs, seeds: each request's sampling and its stream seed (``[0, 2**32)``).
            pad_id: id of the left padding of the prefill batch.

        Returns:
            ``(rows, first_tokens)``. The rows' next decode step is the pool's next step.

        Raises:
            InvalidInput: more prompts than free rows, an empty or too long prompt.
        """
        free = self.free_rows()
        n = len(prompts)
        if not 0 < n <= len(free):
            raise InvalidInput(f"{n} prompts for {len(free)} free rows")
        lengths = [len(p) for p in prompts]
        if min(lengths) < 1 or max(lengths) > self.context - 1:
            raise InvalidInput(f"prompts must hold 1 to {self.context - 1} tokens, got {lengths}")
        rows = free[:n]
        width = max(lengths)
        if self.engine.pad_prompts and prefill_bucket(width) <= self.context:
            width = prefill_bucket(width)  # fewer distinct prefill shapes to compile
        if self.clock < width or self.clock > self.slots - 3:
            self.rebase(max(width, self.live_span()))
        model, dev = self.engine.model, self.engine.model.device
        scratch = KVCache(model.args, n, width, self.engine.dtype, dev)
        toks = torch.tensor([[pad_id] * (width - len(p)) + [int(t) for t in p] for p in prompts],
                            dtype=torch.int64, device=dev)
        pads = torch.tensor([width - m for m in lengths], dtype=torch.int64, device=dev)
        logits = model(toks, torch.arange(width, device=dev), pads, scratch.k, scratch.v, True,
                       self.engine.prefill_fns)[:, -1]
        for r, cfg, seed, p in zip(rows, configs, seeds, prompts, strict=True):
            self.sampler.load(r, cfg, seed, [int(t) for t in p])
        rows_t = torch.tensor(rows, dtype=torch.int64, device=dev)
        first = self.sampler.select(logits, rows_t, row_key(list(configs)))
        base = self.clock - width
        for big, small in zip((*self.cache.k, *self.cache.v), (*scratch.k, *scratch.v),
                              strict=True):
            big.narrow(2, base, width).index_copy_(0, rows_t, small)
        self.pad.index_copy_(0, rows_t, pads + base)
        self.tokens.index_copy_(0, rows_t, first[:, None])
        for r, cfg, m in zip(rows, configs, lengths, strict=True):
            self.busy[r] = cfg
            self.start[r] = self.clock - m
        return rows, first.tolist()

    # -- decode --------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> list[int]:
        """One decode step of every busy row: returns the new token of each row of the step's
        bucket (index = row; entries of free rows are meaningless)."""
        busy = [r for r in range(self.rows) if self.busy[r] is not None]
        if not busy:
            raise InvalidInput("a decode step needs a busy row")
        if self.clock > self.slots - 3:
            self.rebase(self.live_span())
        bucket = batch_bucket(busy[-1] + 1, self.rows)
        key = (bucket, *row_key([self.busy[r] for r in busy]))  # type: ignore[misc]
        self._runner(key)()
        self.clock += 1
        return self.out[:bucket].tolist()

    def _make_step(self, key: tuple[Any, ...]) -> Callable[[], None]:
        b, skey = key[0], key[1:]
        model, fns = self.engine.model, self.engine.fns
        tokens, pad, out = self.tokens[:b], self.pad[:b], self.out[:b]
        ks = [t[:b] for t in self.cache.k]
        vs = [t[:b] for t in self.cache.v]

        def step() -> None:
            logits = model(tokens, self.slot, pad, ks, vs, True, fns)
            nxt = self.sampler.select(logits[:, -1], b, skey)
            out.copy_(nxt)
            tokens.copy_(nxt[:, None])
            self.slot.add_(1)

        return step

    def _runner(self, key: tuple[Any, ...]) -> Callable[[], None]:
        run = self.graphs.get(key)
        if run is not None:
            return run
        step = self._make_step(key)
        if not self.engine.use_graphs:
            return step
        if self._pool is None:
            self._pool = graph_pool()
        s = self.sampler
        saved = [(t, t.clone()) for t in (self.tokens, self.slot, self.out, s.counts, s.seen,
                                          s.counter)]

        def restore() -> None:
            for t, v in saved:
                t.copy_(v)

        # The warm-up runs write the cache at the clock and the slot after it, which every busy
        # row rewrites before reading (a step writes its slot first).
        self.graphs[key] = CapturedStep(step, restore, pool=self._pool)
        return self.graphs[key]

    def warmup(self, configs: Sequence[SamplingConfig] = (SamplingConfig(),)) -> None:
        """Capture (on CUDA) the decode step of every bucket for the sampling structures of
        ``configs`` ahead of the first request."""
        if not self.engine.use_graphs:
            return
        if self.clock > self.slots - 3:
            self.rebase(self.live_span())
        b = 1
        while True:
            bucket = min(b, self.rows)
            for cfg in configs:
                self._runner((bucket, *row_key([cfg])))
            if bucket == self.rows:
                break
            b *= 2
