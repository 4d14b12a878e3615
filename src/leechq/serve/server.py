"""The OpenAI-compatible HTTP API over a :class:`~leechq.serve.scheduler.Scheduler` (FastAPI).

Routes: ``POST /v1/chat/completions`` (the prompt rendered by the tokenizer's chat template,
:func:`leechq.serve.chat.format_chat`), ``POST /v1/completions`` (a string or a list of token ids),
``GET /v1/models``, ``GET /health``. Both completion routes answer whole (JSON) or streamed
(server-sent events, ``data: {...}`` chunks then ``data: [DONE]``), with ``usage`` counts (in the
stream when ``stream_options.include_usage`` is set). Sampling fields: ``temperature``, ``top_p``,
``top_k``, ``min_p``, ``seed``, ``presence_penalty``, ``frequency_penalty``,
``repetition_penalty``, ``max_tokens`` (``max_completion_tokens``), ``stop``; chats also take
``chat_template_kwargs`` (e.g. Qwen3's ``{"enable_thinking": false}``).

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for malformed
JSON, fields of the wrong type or out of range, unsupported options (``n`` > 1, ``logprobs``,
``echo``, ``tools``) and prompts over the context; 404 for another model's name; 429 when the
queue is full; 503 when the scheduler has stopped. A client that disconnects cancels its request,
which frees its row at the next step.

FastAPI and uvicorn are the ``[serve]`` extra; this module imports them, ``import leechq`` does not.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from leechq.errors import InvalidInput
from leechq.serve.chat import format_chat
from leechq.serve.sampling import SamplingConfig
from leechq.serve.scheduler import Handle, QueueFull, Scheduler, SchedulerClosed
from leechq.serve.scheduler import Request as GenRequest


class _Body(BaseModel):
    """Fields shared by both completion routes (strict types: no string-to-number coercion)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    n: int = Field(default=1, ge=1)
    user: str | None = None

    def sampling(self) -> SamplingConfig:
        return SamplingConfig(
            temperature=self.temperature, top_k=max(self.top_k, 0), top_p=self.top_p,
            min_p=self.min_p, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            seed=None if self.seed is None else self.seed & 0xFFFFFFFF,
        )

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class _Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for p in self.content:
            if p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise InvalidInput("only text content parts are supported")
            parts.append(p["text"])
        return "".join(parts)


class ChatBody(_Body):
    """``POST /v1/chat/completions``."""

    messages: list[_Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool = False
    tools: list[Any] | None = None


class CompletionBody(_Body):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = None


class ApiError(Exception):
    """An error answered as ``{"error": ...}`` with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status, message, kind, param, code)

    def response(self) -> JSONResponse:
        return JSONResponse(status_code=self.status, content={"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": self.code}})


def create_app(scheduler: Scheduler, tokenizer: Any, model_name: str) -> FastAPI:
    """The FastAPI application serving ``scheduler`` under the name ``model_name``.

    ``tokenizer`` (a transformers tokenizer) encodes string prompts and renders chats; the
    scheduler decodes the replies with it.
    """
    app = FastAPI(title="leechq", docs_url=None, redoc_url=None)
    created = int(time.time())

    @app.exception_handler(ApiError)
    async def _api_error(_req: Request, exc: ApiError) -> JSONResponse:
        return exc.response()

    @app.get("/health")
    async def health() -> JSONResponse:
        if not scheduler.alive:
            return JSONResponse(status_code=503, content={
                "status": "error", "error": scheduler.error or "stopped"})
        return JSONResponse(content={"status": "ok", **scheduler.stats()})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "leechq",
             "max_model_len": scheduler.context}]}

    async def parse(req: Request, kind: type[_Body]) -> Any:
        raw = await req.body()
        try:
            json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"malformed JSON body: {exc}") from None
        try:
            body = kind.model_validate_json(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            raise ApiError(400, f"{where}: {err.get('msg')}", param=where or None) from None
        if body.model is not None and body.model != model_name:
            raise ApiError(404, f"model {body.model!r} is not served here (serving "
                                f"{model_name!r})", code="model_not_found", param="model")
        if body.n != 1:
            raise ApiError(400, "n > 1 is not supported", param="n")
        return body

    def submit(body: _Body, prompt: list[int], max_tokens: int | None) -> Handle:
        try:
            return scheduler.submit(GenRequest(prompt, max_tokens, body.sampling(), body.stops()))
        except QueueFull as exc:
            raise ApiError(429, str(exc), kind="rate_limit_error") from None
        except SchedulerClosed as exc:
            raise ApiError(503, str(exc), kind="server_error") from None
        except InvalidInput as exc:
            raise ApiError(400, str(exc), code="context_length_exceeded"
                           if "context" in str(exc) else None) from None

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(req: Request) -> Any:
        body: ChatBody = await parse(req, ChatBody)
        if body.logprobs or body.tools:
            raise ApiError(400, "logprobs and tools are not supported")
        try:
            messages = [{"role": m.role, "content": m.text()} for m in body.messages]
            prompt = format_chat(tokenizer, messages, **(body.chat_template_kwargs or {}))
        except (InvalidInput, TypeError) as exc:
            raise ApiError(400, str(exc), param="messages") from None
        handle = submit(body, prompt, body.max_completion_tokens or body.max_tokens)
        rid = f"chatcmpl-{uuid.uuid4().hex}"

        def chunk(delta: dict[str, Any], reason: str | None) -> dict[str, Any]:
            return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
                    "model": model_name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

        if body.stream:
            first = {"role": "assistant", "content": ""}
            return _stream(req, scheduler, handle, body,
                           lambda t, r: chunk({"content": t} if t else {}, r), chunk(first, None))
        text, reason = await _collect(scheduler, handle)
        return {"id": rid, "object": "chat.completion", "created": int(time.time()),
                "model": model_name, "usage": _usage(handle),
                "choices": [{"index": 0, "finish_reason": reason, "logprobs": None,
                             "message": {"role": "assistant", "content": text}}]}

    @app.post("/v1/completions", response_model=None)
    async def completions(req: Request) -> Any:
        body: CompletionBody = await parse(req, CompletionBody)
        if body.echo or body.logprobs:
            raise ApiError(400, "echo and logprobs are not supported")
        if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
            if len(body.prompt) != 1:
                raise ApiError(400, "one prompt per request", param="prompt")
            body.prompt = body.prompt[0]
        if isinstance(body.prompt, str):
            prompt = list(tokenizer.encode(body.prompt))
        else:
            prompt = [int(t) for t in body.prompt]  # type: ignore[arg-type]
        handle = submit(body, prompt, body.max_tokens)
        rid = f"cmpl-{uuid.uuid4().hex}"

        def chunk(text: str, reason: str | None) -> dict[str, Any]:
            return {"id": rid, "object": "text_completion", "created": int(time.time()),
                    "model": model_name, "choices": [
                        {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}]}

        if body.stream:
            return _stream(req, scheduler, handle, body, chunk, None)
        text, reason = await _collect(scheduler, handle)
        out = chunk(text, reason)
        out["usage"] = _usage(handle)
        return out

    return app


def _usage(h: Handle) -> dict[str, int]:
    return {"prompt_tokens": h.prompt_tokens, "completion_tokens": h.completion_tokens,
            "total_tokens": h.prompt_tokens + h.completion_tokens}


def _reason(reason: str | None) -> str | None:
    """The scheduler's finish reason in OpenAI's words ("cancelled" never reaches a client)."""
    return {"error": "error", "cancelled": "abort"}.get(reason or "", reason)


async def _collect(scheduler: Scheduler, handle: Handle) -> tuple[str, str | None]:
    parts: list[str] = []
    reason: str | None = None
    try:
        async for ev in handle:
            parts.append(ev.text)
            if ev.finish_reason is not None:
                if ev.error:
                    raise ApiError(503, ev.error, kind="server_error")
                reason = ev.finish_reason
    finally:
        if handle.finish_reason is None:  # the handler was cancelled (client gone)
            scheduler.cancel(handle)
    return "".join(parts), _reason(reason)


def _stream(req: Request, scheduler: Scheduler, handle: Handle, body: _Body,
            chunk: Callable[[str, str | None], dict[str, Any]],
            opening: dict[str, Any] | None) -> StreamingResponse:
    include_usage = bool((body.stream_options or {}).get("include_usage"))

    async def events() -> AsyncIterator[str]:
        try:
            if opening is not None:
                yield f"data: {json.dumps(opening)}\n\n"
            async for ev in handle:
                # Servers whose ASGI spec lets Starlette stop listening for the disconnect still
                # answer this poll; the finally below then frees the row.
                if await req.is_disconnected():
                    return
                if ev.error:
                    err = {"error": {"message": ev.error, "type": "server_error"}}
                    yield f"data: {json.dumps(err)}\n\n"
                    break
                if ev.text or ev.finish_reason is not None:
                    out = chunk(ev.text, _reason(ev.finish_reason))
                    if include_usage:
                        out["usage"] = None
                    yield f"data: {json.dumps(out)}\n\n"
            if include_usage:
                last = chunk("", None)
                last["choices"], last["usage"] = [], _usage(handle)
                yield f"data: {json.dumps(last)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if handle.finish_reason is None:  # the client went away mid-stream
                scheduler.cancel(handle)

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


class ServerThread:
    """A uvicorn server of ``app`` on a background thread, bound to ``host`` (port 0: a free one).

    Attributes:
        url: ``http://host:port``.
    """

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the uvicorn server did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        """Shut the server down and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
