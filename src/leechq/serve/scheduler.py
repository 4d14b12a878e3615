"""Continuous batching: requests arrive at any time, join the running decode steps after their
prefill and leave when done or cancelled.

:class:`Scheduler` owns a :class:`~leechq.serve.pool.SlotPool` and one worker thread that loops:
drop cancelled requests, prefill waiting requests into free rows (all that fit, in one batch), run
one decode step of every busy row, hand each request its token. A request finishes on a stop id
(end of sequence), a stop string, ``max_tokens``, or :meth:`Scheduler.cancel`. The queue of waiting
requests is bounded (:class:`QueueFull`).

API: ``handle = scheduler.submit(Request(...))``; then either ``async for event in handle`` (in the
asyncio loop that submitted it) or ``handle.result()`` (blocking); ``scheduler.cancel(handle)``.
Each :class:`Event` carries the new token ids and the new text (decoded incrementally; text that a
stop string might still claim is held back until it cannot).
"""

from __future__ import annotations

import asyncio
import collections
import queue
import random
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from leechq.errors import InvalidInput, LeechqError
from leechq.serve.detok import Detokenizer
from leechq.serve.generate import Engine
from leechq.serve.pool import SlotPool
from leechq.serve.sampling import SamplingConfig


class QueueFull(LeechqError, RuntimeError):
    """The scheduler's queue of waiting requests is full; retry later."""


class SchedulerClosed(LeechqError, RuntimeError):
    """The scheduler is stopped (closed, or its worker failed)."""


@dataclass(frozen=True)
class Request:
    """One generation request.

    Attributes:
        prompt: token ids (non-empty).
        max_tokens: tokens to generate at most (≥ 1); None: up to the pool's context.
        sampling: the request's token selection (its ``seed`` seeds its own stream; None draws
            one).
        stop: strings that end the generation (not included in the text).
        stop_ids: token ids that end it (included in ``token_ids``, not in the text); None: the
            scheduler's end-of-sequence ids.
    """

    prompt: Sequence[int]
    max_tokens: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: Sequence[str] = ()
    stop_ids: Sequence[int] | None = None


@dataclass
class Event:
    """What one step gave a request: new token ids, new text, and the finish reason on the last
    event ("stop": a stop id or string, "length": max_tokens, "cancelled", "error")."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    error: str | None = None


class Handle:
    """A submitted request: iterate it (async) or call :meth:`result` (blocking) for its events.

    Attributes:
        request: the request; prompt_tokens, completion_tokens: usage so far.
        finish_reason: set once finished.
    """

    def __init__(self, request: Request, max_tokens: int, stop_ids: set[int],
                 tokenizer: Any) -> None:
        self.request, self.max_tokens, self.stop_ids = request, max_tokens, stop_ids
        self.prompt_tokens, self.completion_tokens = len(request.prompt), 0
        self.finish_reason: str | None = None
        self.cancelled = False
        self._detok = Detokenizer(tokenizer) if tokenizer is not None else None
        self._text = ""  # text produced so far (stop strings cut out)
        self._held = ""  # text withheld because a stop string may start in it
        self._sync: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async: asyncio.Queue[Event] | None = None
        try:
            self._loop = asyncio.get_running_loop()
            self._async = asyncio.Queue()
        except RuntimeError:
            pass

    # -- consumer side -------------------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[Event]:
        if self._async is None:
            raise InvalidInput("this request was submitted outside an asyncio loop; use events()")
        while True:
            ev = await self._async.get()
            yield ev
            if ev.finish_reason is not None:
                return

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Blocking iteration over the events (a request submitted outside an asyncio loop)."""
        if self._async is not None:
            raise InvalidInput("this request was submitted in an asyncio loop; iterate it async")
        while True:
            ev = self._sync.get(timeout=timeout)
            yield ev
            if ev.finish_reason is not None:
                return

    def result(self, timeout: float | None = None) -> tuple[list[int], str, str]:
        """Block until finished: ``(token_ids, text, finish_reason)``."""
        ids: list[int] = []
        text = []
        reason = ""
        for ev in self.events(timeout):
            ids += ev.token_ids
            text.append(ev.text)
            if ev.finish_reason is not None:
                reason = ev.finish_reason
                if ev.error:
                    raise SchedulerClosed(ev.error)
        return ids, "".join(text), reason

    # -- worker side ---------------------------------------------------------------------------

    def _put(self, ev: Event) -> None:
        if self._loop is None or self._async is None:
            self._sync.put(ev)
            return
        try:
            self._loop.call_soon_threadsafe(self._async.put_nowait, ev)
        except RuntimeError:  # the consumer's loop is gone: nobody listens any more
            self.cancelled = True

    def _finish(self, reason: str, error: str | None = None) -> None:
        text, self._held = self._held, ""
        if reason in ("cancelled", "error"):
            text = ""
        self.finish_reason = reason
        self._put(Event([], text, reason, error))

    def _push(self, token: int) -> bool:
        """Take one generated token; returns whether the request is finished."""
        self.completion_tokens += 1
        if token in self.stop_ids:
            self._put(Event([token], ""))
            self._finish("stop")
            return True
        piece = self._detok.push(token) if self._detok is not None else ""
        text = self._held + piece
        stops = [s for s in self.request.stop if s]
        hit = min((i for i in (self._find(text, s) for s in stops) if i >= 0), default=-1)
        if hit >= 0:
            self._held = ""
            self._put(Event([token], text[:hit]))
            self._finish("stop")
            return True
        keep = max((_overlap(text, s) for s in stops), default=0)
        out, self._held = text[: len(text) - keep], text[len(text) - keep :]
        self._text += out
        self._put(Event([token], out))
        if self.completion_tokens >= self.max_tokens:
            self._finish("length")
            return True
        return False

    @staticmethod
    def _find(text: str, stop: str) -> int:
        return text.find(stop)


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``stop``."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0


class Scheduler:
    """Continuous batching over a :class:`~leechq.serve.pool.SlotPool`, on a worker thread.

    Args:
        engine: the model's :class:`~leechq.serve.generate.Engine`.
        tokenizer: decodes the text of events (None: token ids only, empty text).
        max_batch: rows of the pool (concurrent requests).
        max_context: longest request, prompt plus generated (default: the model's positions, at
            most 4096).
        max_queue: waiting requests beyond which :meth:`submit` raises :class:`QueueFull`.
        stop_ids: default end-of-sequence ids of requests.
        pad_id: id of the prefill's left padding.
        max_prefill_tokens: prompts joining in one prefill hold at most this many (padded) token
            positions, unless a single prompt is longer — it bounds how long one prefill holds
            up the decode steps of running requests.
    """

    def __init__(self, engine: Engine, tokenizer: Any = None, max_batch: int = 8,
                 max_context: int | None = None, max_queue: int = 64,
                 stop_ids: Sequence[int] = (), pad_id: int = 0,
                 max_prefill_tokens: int = 8192) -> None:
        limit = engine.model.args.max_position_embeddings
        context = max_context if max_context is not None else min(limit, 4096)
        if max_queue < 1:
            raise InvalidInput(f"max_queue must be >= 1, got {max_queue}")
        self.pool = SlotPool(engine, max_batch, context)
        self.engine, self.tokenizer = engine, tokenizer
        self.context, self.max_queue = context, max_queue
        self.stop_ids, self.pad_id = [int(t) for t in stop_ids], pad_id
        self.max_prefill_tokens = max_prefill_tokens
        self.vocab = engine.model.args.vocab_size
        self._waiting: collections.deque[Handle] = collections.deque()
        self._rows: dict[int, Handle] = {}
        self._cv = threading.Condition()
        self._closed = False
        self.error: str | None = None
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="leechq-scheduler", daemon=True)
        self._thread.start()

    # -- API -----------------------------------------------------------------------------------

    def submit(self, request: Request) -> Handle:
        """Queue ``request``; returns its handle.

        Raises:
            InvalidInput: an empty prompt, ids outside the vocabulary, ``max_tokens < 1``, or a
                prompt plus ``max_tokens`` over the context.
            QueueFull: :attr:`max_queue` requests already wait.
            SchedulerClosed: the scheduler is closed or failed.
        """
        prompt = [int(t) for t in request.prompt]
        if not prompt:
            raise InvalidInput("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab]
        if bad:
            raise InvalidInput(f"prompt token ids outside [0, {self.vocab}): {bad[:5]}")
        room = self.context - len(prompt)
        if room < 1:
            raise InvalidInput(f"the prompt has {len(prompt)} tokens; the context holds "
                               f"{self.context} (prompt plus at least one generated token)")
        max_tokens = room if request.max_tokens is None else int(request.max_tokens)
        if max_tokens < 1:
            raise InvalidInput(f"max_tokens must be >= 1, got {max_tokens}")
        if max_tokens > room:
            raise InvalidInput(f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) "
                               f"exceeds the context ({self.context} tokens)")
        stop_ids = set(self.stop_ids if request.stop_ids is None else request.stop_ids)
        handle = Handle(request, max_tokens, stop_ids, self.tokenizer)
        with self._cv:
            if self._closed:
                raise SchedulerClosed(self.error or "the scheduler is closed")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_queue "
                                f"{self.max_queue}); retry later")
            self._waiting.append(handle)
            self._cv.notify()
        return handle

    def cancel(self, handle: Handle) -> None:
        """Stop ``handle``'s request at the next step; its row is freed (no-op once finished)."""
        with self._cv:
            handle.cancelled = True
            self._cv.notify()

    def stats(self) -> dict[str, int]:
        """``running`` and ``waiting`` requests, free ``rows``, decode ``steps`` so far."""
        with self._cv:
            return {"running": len(self._rows), "waiting": len(self._waiting),
                    "rows": self.pool.rows - len(self._rows), "steps": self.steps}

    @property
    def alive(self) -> bool:
        """Whether requests are being served."""
        return not self._closed and self._thread.is_alive()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the worker; unfinished requests end with finish reason "cancelled"."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- worker --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._loop_once():
                pass
        except Exception as exc:  # the worker must not die silently: fail every request
            self.error = f"{type(exc).__name__}: {exc}"
            with self._cv:
                self._closed = True
        with self._cv:
            left = list(self._rows.values()) + list(self._waiting)
            self._rows.clear()
            self._waiting.clear()
        for h in left:
            if self.error:
                h._finish("error", self.error)
            else:
                h._finish("cancelled")

    def _loop_once(self) -> bool:
        with self._cv:
            while not self._closed and not self._rows and not self._waiting:
                self._cv.wait()
            if self._closed:
                return False
            for r, h in list(self._rows.items()):
                if h.cancelled:
                    del self._rows[r]
                    self.pool.release(r)
                    h._finish("cancelled")
            for h in [h for h in self._waiting if h.cancelled]:
                self._waiting.remove(h)
                h._finish("cancelled")
            free = self.pool.rows - len(self._rows)
            joining: list[Handle] = []
            width = 0
            while self._waiting and len(joining) < free:
                w = max(width, len(self._waiting[0].request.prompt))
                if joining and w * (len(joining) + 1) > self.max_prefill_tokens:
                    break
                joining.append(self._waiting.popleft())
                width = w
        if joining:
            self._admit(joining)
        if self._rows:
            toks = self.pool.step()
            self.steps += 1
            with self._cv:
                for r, h in list(self._rows.items()):
                    if h._push(toks[r]) or h.cancelled:
                        if h.finish_reason is None:
                            h._finish("cancelled")
                        del self._rows[r]
                        self.pool.release(r)
        return True

    def _admit(self, joining: list[Handle]) -> None:
        seeds = [h.request.sampling.seed if h.request.sampling.seed is not None
                 else random.getrandbits(32) for h in joining]
        rows, first = self.pool.admit([h.request.prompt for h in joining],
                                      [h.request.sampling for h in joining], seeds, self.pad_id)
        with self._cv:
            for r, h, tok in zip(rows, joining, first, strict=True):
                if h._push(tok) or h.cancelled:
                    if h.finish_reason is None:
                        h._finish("cancelled")
                    self.pool.release(r)
                else:
                    self._rows[r] = h
