"""Layer 6: inference — the decode loop with a static KV cache and CUDA graphs (issue 6), and
serving over HTTP with continuous batching (issue 33).

Modules (docs/architecture.md §3, §1; docs/kernels.md):

* :mod:`~leechq.serve.model` — a small Llama/Qwen2/Qwen3 decoder over projection modules;
* :mod:`~leechq.serve.build` — the decoder from a transformers model, state dict or random weights;
* projection groups (q|k|v, gate|up: one rotation, one launch per group) are
  :class:`leechq.nn.group.LeechqGroup`;
* :mod:`~leechq.serve.cache` — the static KV cache;
* :mod:`~leechq.serve.sampling` — greedy and sampled token selection (graph-safe);
* :mod:`~leechq.serve.graphs` — CUDA-graph capture of the decode step;
* :mod:`~leechq.serve.generate` — :class:`~leechq.serve.generate.Engine` and
  :func:`~leechq.serve.generate.generate` (what ``leechq run`` calls);
* :mod:`~leechq.serve.chat` — chat templates and the interactive loop of ``leechq chat``;
* :mod:`~leechq.serve.detok` — incremental detokenization of streamed tokens;
* :mod:`~leechq.serve.pool` — the slot pool of continuous batching (KV rows on a shared clock);
* :mod:`~leechq.serve.scheduler` — continuous batching: requests join and leave the decode steps;
* :mod:`~leechq.serve.server` — the OpenAI-compatible HTTP API of ``leechq serve`` (FastAPI, the
  ``[serve]`` extra);
* :mod:`~leechq.serve.random_codes` — real-shaped quantized models with random codes (benchmarks).

Nothing is imported here: ``import leechq.serve`` stays free of torch work.
"""
