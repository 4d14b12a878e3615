"""The decode loop: prefill, then one token per step from a static cache, optionally graph-captured.

The serving loop (docs/architecture.md §3, the gpt-fast shape). :class:`Engine` owns a
:class:`~leechq.serve.model.Transformer`, its per-batch sessions (KV cache and the small state
buffers of the step) and the captured graphs. One call of :meth:`Engine.generate_ids`:

1. left-pads the prompts into one batch and checks they fit the cache (prompt + new tokens ≤ slots);
2. makes sure the session and (on CUDA) the graph for this sampling structure exist *before*
   seeding, so capture never consumes random numbers of a seeded run;
3. prefills every prompt position in one forward and picks the first token. On CUDA the prompts
   are left-padded to a bucket width (:func:`prefill_bucket`: the next power of two from 16 up to
   256, then multiples of 256) when the cache has room, so that one captured prefill graph per
   bucket serves every prompt length in it (up to :data:`PREFILL_GRAPH_MAX_WIDTH`; wider prompts
   and engines without graphs run the same padded forward eagerly). Padding positions are
   invisible to the real ones (``leechq.serve.model.attention_mask``), so only their cache slots
   are spent. The eager prefill is bound by the host: 32 tokens of Qwen3-8B on the H200 took
   99 ms eagerly against 14 ms of device time (``benchmarks/step_breakdown.py``);
4. replays the decode step: forward one position, pick tokens, mark finished rows, write the token
   into the history and the next input, advance the slot — all on the device, no host
   synchronisation; the host only checks for "every row finished" every ``check_every`` steps (or
   every step when streaming).

:func:`generate` is the tokenizer-level API used by the CLI (``leechq run``): strings in, strings
out, optional streaming of text deltas.
"""

from __future__ import annotations

import sys
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from leechq.errors import InvalidInput, UnsupportedArchitecture
from leechq.serve.build import from_hf_model, warn_if_reference, weight_bytes
from leechq.serve.cache import KVCache, session_slots
from leechq.serve.detok import Detokenizer
from leechq.serve.graphs import CapturedStep, graph_pool
from leechq.serve.model import EAGER, Pieces, Transformer
from leechq.serve.sampling import SamplerState, SamplingConfig, select_tokens

MAX_STOP_IDS = 8
"""Stop ids a generation can carry (the device buffer is fixed so graphs survive a change)."""

PREFILL_GRAPH_MAX_WIDTH = 2048
"""The widest padded prompt whose prefill is captured in a CUDA graph; wider prompts run eagerly
(their device time dwarfs the host's launches)."""


def prefill_bucket(width: int) -> int:
    """The padded width of a ``width``-token prompt batch: the next power of two, at least 16, up
    to 256; then the next multiple of 256."""
    if width <= 256:
        return max(16, 1 << max(0, (width - 1).bit_length()))
    return -(-width // 256) * 256


TokenCallback = Callable[[int, int], None]
"""``callback(row, token_id)``, called for each new token of each unfinished row."""

TextCallback = Callable[[int, str], None]
"""``callback(row, text)``, called with the new text of a row as soon as it decodes cleanly."""


@dataclass
class GenerationOutput:
    """What a generation produced.

    Attributes:
        tokens: new token ids per row, through the first stop id (included).
        prompt_lengths: prompt length per row.
        prefill_s: seconds spent in the prefill (forward of all prompt positions + first token).
        decode_s: seconds spent in the decode steps.
        steps: decode steps run (every row got ``steps + 1`` tokens, the first from the prefill).
        batch: rows.
        texts: decoded text per row (filled by :func:`generate`).
    """

    tokens: list[list[int]]
    prompt_lengths: list[int]
    prefill_s: float
    decode_s: float
    steps: int
    batch: int
    texts: list[str] = field(default_factory=list)

    @property
    def decode_tok_s(self) -> float:
        """Decode throughput over the batch: tokens per second produced by the decode steps."""
        return self.batch * self.steps / self.decode_s if self.decode_s > 0 else float("nan")


@dataclass
class _PrefillGraph:
    """A captured prefill of one padded width: the graph and every tensor it reads or writes
    outside its pool (a graph does not keep its inputs alive; these references do)."""

    graph: CapturedStep
    tokens: torch.Tensor  # int64 [B, W], copied in before each replay
    slots: torch.Tensor  # int64 [W], 0..W-1
    held: dict[str, torch.Tensor]  # "logits": the graph's output


class _Session:
    """The static buffers of one batch size: KV cache, step inputs/outputs, sampler values,
    graphs."""

    def __init__(self, model: Transformer, batch: int, seq_len: int, dtype: torch.dtype) -> None:
        dev = model.device
        self.cache = KVCache(model.args, batch, seq_len, dtype, dev)
        self.batch, self.seq_len = batch, seq_len
        self.tokens = torch.zeros(batch, 1, dtype=torch.int64, device=dev)
        self.slot = torch.zeros(1, dtype=torch.int64, device=dev)
        self.pad = torch.zeros(batch, dtype=torch.int64, device=dev)
        self.history = torch.zeros(batch, seq_len, dtype=torch.int64, device=dev)
        self.done = torch.zeros(batch, dtype=torch.bool, device=dev)
        self.fill = torch.zeros(1, dtype=torch.int64, device=dev)  # token written for finished rows
        self.stop = torch.full((MAX_STOP_IDS,), -1, dtype=torch.int64, device=dev)
        self.seen = torch.zeros(batch, model.args.vocab_size, dtype=torch.bool, device=dev)
        self.sampler = SamplerState(dev)
        self.graphs: dict[tuple[Any, ...], CapturedStep] = {}
        self.prefills: dict[int, _PrefillGraph] = {}  # captured prefills by padded width
        # One memory pool per session, shared by its graphs and dropped with them. A pool handle
        # kept by the engine across sessions breaks: when the last graph of a pool is freed (a
        # session replaced or released) the allocator deletes the pool, and a later capture into
        # the stale handle fails an internal assertion.
        self.pool: Any = None

    def graph_pool(self) -> Any:
        """The session's graph memory pool (made on first use), shared by its decode and prefill
        graphs, which never run concurrently."""
        if self.pool is None:
            self.pool = graph_pool()
        return self.pool

    def snapshot(self) -> Callable[[], None]:
        """A function that restores the small state buffers to their current values."""
        saved = [
            (t, t.clone()) for t in (self.tokens, self.slot, self.done, self.seen, self.history)
        ]

        def restore() -> None:
            for t, v in saved:
                t.copy_(v)

        return restore


class Engine:
    """A serving model plus its caches and captured decode steps.

    Args:
        model: the :class:`Transformer`.
        graphs: capture the decode step in a CUDA graph (default: on CUDA devices).
        prefill_graphs: capture the prefill too, one graph per bucket width (default: ``graphs``;
            see :func:`prefill_bucket`).
        compile: ``torch.compile`` the pure-tensor pieces of the decode step and, with symbolic
            sizes, of the prefill (default: on CUDA devices).
        check_every: decode steps between host checks for "every row finished".
    """

    def __init__(
        self,
        model: Transformer,
        graphs: bool | None = None,
        compile: bool | None = None,
        check_every: int = 16,
        prefill_graphs: bool | None = None,
    ) -> None:
        self.model = model
        on_cuda = model.device.type == "cuda"
        self.use_graphs = on_cuda if graphs is None else graphs
        self.prefill_graphs = self.use_graphs if prefill_graphs is None else prefill_graphs
        if self.prefill_graphs and not self.use_graphs:
            raise InvalidInput("prefill_graphs needs graphs=True")
        self.pad_prompts = on_cuda  # bucket widths, graphs or not: the same prefill either way
        if self.use_graphs and not on_cuda:
            raise InvalidInput("CUDA graphs were requested but the model is not on a CUDA device")
        use_compile = on_cuda if compile is None else compile
        self.fns: Pieces = Pieces.compiled() if use_compile else EAGER
        # The prefill's pieces: compiled with symbolic sizes (one compile for every prompt width).
        self.prefill_fns: Pieces = Pieces.compiled(dynamic=True) if use_compile else EAGER
        self.check_every = max(1, check_every)
        self.dtype = self._activation_dtype()
        warn_if_reference(model, model.device)
        self._sessions: dict[int, _Session] = {}

    def _activation_dtype(self) -> torch.dtype:
        probe = self.model.embed(torch.zeros(1, 1, dtype=torch.int64, device=self.model.device))
        return probe.dtype

    # -- sessions and steps ------------------------------------------------------------------------

    def session(self, batch: int, seq_len: int) -> _Session:
        """The session for ``batch`` rows with at least ``seq_len`` slots (reallocated when too
        small)."""
        sess = self._sessions.get(batch)
        if sess is None or sess.seq_len < seq_len:
            self._sessions.pop(batch, None)
            sess = _Session(self.model, batch, seq_len, self.dtype)
            self._sessions[batch] = sess
        return sess

    def release(self) -> None:
        """Drop every session (caches and graphs)."""
        self._sessions.clear()

    def cache_bytes(self) -> int:
        """Bytes held by the KV caches of all sessions."""
        return sum(s.cache.nbytes for s in self._sessions.values())

    def memory(self) -> dict[str, int]:
        """Bytes by kind: ``weights`` (all model weights on their device, embedding and head
        included), ``embed_head`` (that part of it) and ``kv_cache`` (every session's cache)."""
        m = self.model
        return {
            "weights": weight_bytes(m),
            "embed_head": weight_bytes(torch.nn.ModuleList([m.embed, m.head])),  # tied: once
            "kv_cache": self.cache_bytes(),
        }

    def _make_step(self, sess: _Session, key: tuple[bool, ...]) -> Callable[[], None]:
        model, fns = self.model, self.fns
        use_penalty = key[-1]

        def step() -> None:
            logits = model(sess.tokens, sess.slot, sess.pad, sess.cache.k, sess.cache.v, True, fns)
            nxt = select_tokens(
                logits[:, -1], sess.sampler, key, sess.seen if use_penalty else None
            )
            nxt = torch.where(sess.done, sess.fill, nxt)
            torch.logical_or(sess.done, (nxt[:, None] == sess.stop[None, :]).any(-1), out=sess.done)
            sess.history.index_copy_(1, sess.slot + 1, nxt[:, None])
            sess.tokens.copy_(nxt[:, None])
            if use_penalty:
                sess.seen.scatter_(1, nxt[:, None], True)
            sess.slot.add_(1)

        return step

    def _runner(self, sess: _Session, key: tuple[bool, ...]) -> Callable[[], None]:
        step = self._make_step(sess, key)
        if not self.use_graphs:
            return step
        if key not in sess.graphs:
            sess.slot.zero_()  # warm-up writes slots 0 and 1, which the prefill rewrites
            sess.graphs[key] = CapturedStep(step, sess.snapshot(), pool=sess.graph_pool())
        return sess.graphs[key]

    # -- generation --------------------------------------------------------------------------------

    @torch.no_grad()
    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_ids: Sequence[int] = (),
        pad_id: int = 0,
        stream: TokenCallback | None = None,
        seq_len: int | None = None,
    ) -> GenerationOutput:
        """Generate from token-id prompts.

        Args:
            prompts: B prompts, each a non-empty sequence of token ids.
            max_new_tokens: tokens to generate per row (≥ 1), fewer if every row hits a stop id.
            sampling: how to pick tokens (default: greedy).
            stop_ids: token ids that finish a row (at most :data:`MAX_STOP_IDS`).
            pad_id: id used for left padding and for the positions after a row finished.
            stream: called with ``(row, token_id)`` for each new token of each unfinished row.
            seq_len: KV-cache slots (default: prompt + new tokens, the prompt padded to its
                bucket on CUDA, next power of two ≥ 128).

        Returns:
            :class:`GenerationOutput`.

        Raises:
            InvalidInput: empty or out-of-vocabulary prompts, ``max_new_tokens < 1``, too many stop
                ids, or a prompt plus ``max_new_tokens`` that exceeds the cache / the model's
                positions.
        """
        sampling = sampling or SamplingConfig()
        if sampling.presence_penalty or sampling.frequency_penalty:
            raise InvalidInput(
                "presence and frequency penalties are per-request settings of the slot pool "
                "(leechq.serve.scheduler), not of Engine.generate_ids"
            )
        key = sampling.key()
        batch, lengths, width = self._check_prompts(prompts, max_new_tokens, stop_ids)
        need = width + max_new_tokens
        # A cache the engine sizes also holds the prompt's bucket (the captured prefill's width).
        padded = (prefill_bucket(width) if self.pad_prompts else width) + max_new_tokens
        slots = seq_len if seq_len is not None else session_slots(padded)
        if need > slots:
            raise InvalidInput(
                f"the longest prompt ({width} tokens) plus max_new_tokens ({max_new_tokens}) needs "
                f"{need} cache slots but the KV cache has {slots}; shorten the prompt, lower "
                "max_new_tokens or raise seq_len"
            )
        limit = self.model.args.max_position_embeddings
        if need > limit:
            raise InvalidInput(
                f"the longest prompt ({width} tokens) plus max_new_tokens ({max_new_tokens}) = "
                f"{need} positions exceeds the model's max_position_embeddings ({limit})"
            )
        slots = min(slots, limit)
        span = self._prefill_span(width, max_new_tokens, slots)
        sess = self.session(batch, slots)
        run_step = self._runner(sess, key)  # captured before seeding: capture draws random numbers
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        sess.sampler.load(sampling)
        sess.fill.fill_(pad_id)
        sess.stop.fill_(-1)
        if stop_ids:
            sess.stop[: len(stop_ids)] = torch.tensor(list(stop_ids), dtype=torch.int64)

        t0 = time.perf_counter()
        first = self._prefill(sess, prompts, lengths, span, pad_id, key)
        host_done = [False] * batch
        if stream is not None:
            self._emit(stream, first.tolist(), host_done, stop_ids)
        self._sync()
        t1 = time.perf_counter()
        steps = 0
        for i in range(1, max_new_tokens):
            run_step()
            steps += 1
            if stream is not None:
                toks = sess.history[:, span + i].tolist()  # one sync per step while streaming
                self._emit(stream, toks, host_done, stop_ids)
                if all(host_done):
                    break
            elif stop_ids and i % self.check_every == 0 and bool(sess.done.all()):
                break
        self._sync()
        t2 = time.perf_counter()
        out = sess.history[:, span : span + steps + 1].tolist()
        stop = set(stop_ids)
        tokens = []
        for row in out:
            end = next((j + 1 for j, t in enumerate(row) if t in stop), len(row))
            tokens.append(row[:end])
        return GenerationOutput(tokens, lengths, t1 - t0, t2 - t1, steps, batch)

    def _check_prompts(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int]
    ) -> tuple[int, list[int], int]:
        if isinstance(prompts, (str, bytes)) or not len(prompts):
            raise InvalidInput("prompts must be a non-empty list of token-id sequences")
        if max_new_tokens < 1:
            raise InvalidInput(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if len(stop_ids) > MAX_STOP_IDS:
            raise InvalidInput(f"at most {MAX_STOP_IDS} stop ids, got {len(stop_ids)}")
        vocab = self.model.args.vocab_size
        lengths = []
        for i, p in enumerate(prompts):
            if isinstance(p, str) or len(p) == 0:
                raise InvalidInput(f"prompt {i} must be a non-empty sequence of token ids")
            bad = [t for t in p if not 0 <= int(t) < vocab]
            if bad:
                raise InvalidInput(f"prompt {i} has token ids outside [0, {vocab}): {bad[:5]}")
            lengths.append(len(p))
        return len(prompts), lengths, max(lengths)

    def _prefill(
        self,
        sess: _Session,
        prompts: Sequence[Sequence[int]],
        lengths: list[int],
        width: int,
        pad_id: int,
        key: tuple[bool, ...],
    ) -> torch.Tensor:
        dev = self.model.device
        rows = [
            [pad_id] * (width - n) + [int(t) for t in p]
            for p, n in zip(prompts, lengths, strict=True)
        ]
        tokens = torch.tensor(rows, dtype=torch.int64, device=dev)
        sess.pad.copy_(torch.tensor([width - n for n in lengths], dtype=torch.int64))
        sess.done.zero_()
        sess.seen.zero_()
        if key[-1]:
            for b, p in enumerate(prompts):
                sess.seen[b, torch.tensor([int(t) for t in p], device=dev)] = True
        logits = self._prefill_logits(sess, tokens)
        first = select_tokens(logits[:, -1], sess.sampler, key, sess.seen if key[-1] else None)
        torch.logical_or(sess.done, (first[:, None] == sess.stop[None, :]).any(-1), out=sess.done)
        if key[-1]:
            sess.seen.scatter_(1, first[:, None], True)
        sess.history[:, :width] = tokens
        sess.history[:, width] = first
        sess.tokens.copy_(first[:, None])
        sess.slot.fill_(width)
        return first

    def _prefill_span(self, width: int, max_new_tokens: int, slots: int) -> int:
        """The width the prompts are left-padded to: :func:`prefill_bucket` on CUDA where the
        cache (``slots``) still holds it plus ``max_new_tokens``, else ``width``."""
        if not self.pad_prompts:
            return width
        span = prefill_bucket(width)
        return span if span + max_new_tokens <= slots else width

    def _prefill_logits(self, sess: _Session, tokens: torch.Tensor) -> torch.Tensor:
        """The prefill forward of ``tokens`` [B, W] (slots ``0..W-1``; ``sess.pad`` already
        set): float32 logits [B, 1, vocab] of the last position — a replay of this width's
        captured graph (captured on first use) or an eager forward."""
        width = int(tokens.shape[1])
        model, cache = self.model, sess.cache
        if not self.prefill_graphs or width > PREFILL_GRAPH_MAX_WIDTH:
            slots = torch.arange(width, device=tokens.device)
            return model(tokens, slots, sess.pad, cache.k, cache.v, True, self.prefill_fns)
        entry = sess.prefills.get(width)
        if entry is None:
            buf = tokens.clone()
            slots = torch.arange(width, device=tokens.device)
            held: dict[str, torch.Tensor] = {}

            def forward() -> None:
                held["logits"] = model(buf, slots, sess.pad, cache.k, cache.v, True,
                                       self.prefill_fns)

            # The warm-up writes cache slots 0..W-1, which the replay below rewrites.
            graph = CapturedStep(forward, lambda: None, pool=sess.graph_pool())
            entry = sess.prefills[width] = _PrefillGraph(graph, buf, slots, held)
        entry.tokens.copy_(tokens)
        entry.graph()
        return entry.held["logits"]

    @staticmethod
    def _emit(
        cb: TokenCallback, toks: list[int], done: list[bool], stop_ids: Sequence[int]
    ) -> None:
        for row, tok in enumerate(toks):
            if not done[row]:
                cb(row, tok)
                done[row] = tok in stop_ids

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)


# --------------------------------------------------------------------------------------------------
# Tokenizer-level API

_ENGINES: weakref.WeakKeyDictionary[Any, Engine] = weakref.WeakKeyDictionary()


def engine_for(model: Any, **engine_kwargs: Any) -> Engine:
    """The (cached) :class:`Engine` of ``model``: an Engine, a serving Transformer, or a
    transformers causal LM (converted once with :func:`leechq.serve.build.from_hf_model`)."""
    if isinstance(model, Engine):
        return model
    eng = _ENGINES.get(model)
    if eng is None:
        serving = model
        if not isinstance(model, Transformer):
            serving = from_hf_model(model)
        eng = Engine(serving, **engine_kwargs)
        _ENGINES[model] = eng
    return eng


def default_sampling(model: Any) -> SamplingConfig:
    """The model's recommended sampling (its ``generation_config``), or greedy when it has none."""
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return SamplingConfig()
    try:
        return SamplingConfig.from_generation_config(gen)
    except InvalidInput as exc:
        warnings.warn(
            f"ignoring the model's generation_config ({exc}); decoding greedily", stacklevel=2
        )
        return SamplingConfig()


def stop_ids_for(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids from the model's generation config and the tokenizer (deduplicated)."""
    ids: list[int] = []
    for src in (
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        if src is None:
            continue
        for t in src if isinstance(src, (list, tuple)) else [src]:
            if int(t) not in ids:
                ids.append(int(t))
    return ids[:MAX_STOP_IDS]


_NOTED: weakref.WeakSet[Any] = weakref.WeakSet()


def _note_fallback(model: Any, exc: Exception) -> None:
    """One line on stderr, once per model: the engine does not run it, transformers does."""
    if model not in _NOTED:
        _NOTED.add(model)
        print(f"[leechq] serving through transformers (slower): {exc}", file=sys.stderr)


def generate(
    model: Any,
    tokenizer: Any,
    prompts: str | Sequence[str] | Sequence[Sequence[int]],
    max_new_tokens: int = 256,
    sampling: SamplingConfig | None = None,
    stream: TextCallback | None = None,
    seq_len: int | None = None,
    add_special_tokens: bool = True,
) -> GenerationOutput:
    """Generate text for one or several prompts.

    Args:
        model: an :class:`Engine`, a serving :class:`Transformer` or a transformers causal LM (as
            returned by ``leechq.load``); the engine is built once per model and cached.
        tokenizer: a transformers tokenizer (``encode``/``decode``, ``eos_token_id``,
            ``pad_token_id``).
        prompts: a string, a list of strings, or a list of token-id lists.
        max_new_tokens: tokens to generate per prompt.
        sampling: token selection (default: the model's generation_config, else greedy).
        stream: called as ``stream(row, text)`` with each row's new text as it is produced.
        seq_len: KV-cache slots (default: what the prompts need).
        add_special_tokens: passed to the tokenizer when encoding strings.

    Returns:
        :class:`GenerationOutput` with ``texts`` filled (special tokens skipped).
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    ids = [
        tokenizer.encode(p, add_special_tokens=add_special_tokens)
        if isinstance(p, str)
        else list(p)
        for p in prompts
    ]
    source = model if not isinstance(model, (Engine, Transformer)) else None
    try:
        engine: Engine | None = engine_for(model)
    except UnsupportedArchitecture as exc:
        if source is None:
            raise
        engine = None  # transformers' own modules run it (leechq.serve.hf_generate)
        _note_fallback(model, exc)
    sampling = sampling or (default_sampling(source) if source is not None else SamplingConfig())
    stop = stop_ids_for(source, tokenizer)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (stop[0] if stop else 0)
    callback: TokenCallback | None = None
    if stream is not None:
        detoks = [Detokenizer(tokenizer) for _ in ids]

        def callback(row: int, tok: int) -> None:
            piece = detoks[row].push(tok)
            if piece:
                stream(row, piece)

    if engine is None:
        from leechq.serve.hf_generate import generate_ids_hf

        tokens, prefill_s, decode_s, steps = generate_ids_hf(
            model, ids, max_new_tokens, sampling, stop, callback
        )
        out = GenerationOutput(tokens, [len(p) for p in ids], prefill_s, decode_s, steps, len(ids))
    else:
        out = engine.generate_ids(ids, max_new_tokens, sampling, stop, pad, callback, seq_len)
    out.texts = [tokenizer.decode(t, skip_special_tokens=True) for t in out.tokens]
    return out
