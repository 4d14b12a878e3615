"""``leechq serve`` end to end on CPU: a tiny artifact behind uvicorn on 127.0.0.1, answered to the
official ``openai`` client (chat and completions, streamed and whole), concurrent requests equal to
sequential ones, disconnects, hostile requests and a bounded load."""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from leechq.serve.scheduler import Scheduler  # noqa: E402

NAME = "tiny"


def _http(url: str, method: str, path: str, body: bytes | None = None
          ) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP request (standard library): status, headers, body."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


class Served:
    def __init__(self, scheduler: Scheduler, url: str, tokenizer: Any) -> None:
        self.scheduler, self.url, self.tokenizer = scheduler, url, tokenizer
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                    timeout=60)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    from leechq_tiny import make_artifact

    from leechq.models.load import load
    from leechq.serve.generate import engine_for, stop_ids_for
    from leechq.serve.server import ServerThread, create_app

    out, _ = make_artifact(Path(tmp_path_factory.mktemp("serve")), "llama")
    model, tok = load(out, device="cpu")
    sched = Scheduler(engine_for(model), tok, max_batch=8, max_context=96, max_queue=32,
                      stop_ids=stop_ids_for(model, tok), pad_id=0)
    server = ServerThread(create_app(sched, tok, NAME))
    try:
        yield Served(sched, server.url, tok)
    finally:
        server.stop()
        sched.close()


PROMPTS = [
    "the water is here", "know the day", "than the world", "the man and the water",
    "is it here", "the day and the man", "know", "water water water", "the world is",
    "here is the man", "it is the day", "and the water", "the the the", "man know world",
    "is the day here", "world and water",
]


def _complete(s: Served, prompt: str, **kw: Any) -> Any:
    kw.setdefault("max_tokens", 12)
    return s.client.completions.create(model=NAME, prompt=prompt, temperature=0, **kw)


def test_models_and_health(served: Served) -> None:
    assert [m.id for m in served.client.models.list().data] == [NAME]
    status, _, raw = _http(served.url, "GET", "/health")
    assert status == 200 and json.loads(raw)["status"] == "ok"


def test_sixteen_concurrent_greedy_requests_equal_sequential(served: Served) -> None:
    seq = [_complete(served, p) for p in PROMPTS]
    with ThreadPoolExecutor(16) as ex:
        conc = list(ex.map(lambda p: _complete(served, p), PROMPTS))
    assert [c.choices[0].text for c in conc] == [c.choices[0].text for c in seq]
    assert any(c.choices[0].text for c in seq)
    for c, p in zip(conc, PROMPTS, strict=True):
        n = len(served.tokenizer.encode(p))
        assert c.usage.prompt_tokens == n and 1 <= c.usage.completion_tokens <= 12
        assert c.usage.total_tokens == n + c.usage.completion_tokens
        assert c.choices[0].finish_reason in ("stop", "length")


def test_streaming_reassembles_to_the_whole_answer(served: Served) -> None:
    msgs = [{"role": "user", "content": "the water is here"}]
    whole = served.client.chat.completions.create(model=NAME, messages=msgs, max_tokens=16,
                                                  temperature=0)
    chunks = list(served.client.chat.completions.create(
        model=NAME, messages=msgs, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and
               c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    again = served.client.chat.completions.create(
        model=NAME, messages=msgs, max_tokens=16, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert again.choices[0].message.content == whole.choices[0].message.content
    # completions too
    whole_c = _complete(served, "know the day")
    streamed = "".join(c.choices[0].text for c in _complete(served, "know the day", stream=True))
    assert streamed == whole_c.choices[0].text


def test_token_id_prompt_and_sampling_fields(served: Served) -> None:
    ids = served.tokenizer.encode("the water is here")
    a = served.client.completions.create(model=NAME, prompt=ids, max_tokens=8, temperature=0.8,
                                         top_p=0.9, seed=3, presence_penalty=0.5,
                                         frequency_penalty=0.2,
                                         extra_body={"top_k": 10, "min_p": 0.05})
    b = served.client.completions.create(model=NAME, prompt=ids, max_tokens=8, temperature=0.8,
                                         top_p=0.9, seed=3, presence_penalty=0.5,
                                         frequency_penalty=0.2,
                                         extra_body={"top_k": 10, "min_p": 0.05})
    assert a.choices[0].text == b.choices[0].text and a.usage.prompt_tokens == len(ids)


def _wait_idle(s: Served, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        st = s.scheduler.stats()
        if st["running"] == 0 and st["waiting"] == 0:
            return True
        time.sleep(0.01)
    return False


def test_a_client_that_disconnects_frees_its_row(served: Served,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pool = served.scheduler.pool
    step = pool.step

    def slow_step() -> list[int]:
        time.sleep(0.02)  # a slower model: the request cannot finish before the client leaves
        return step()

    monkeypatch.setattr(served.scheduler, "stop_ids", [])  # no end of sequence: 80 tokens
    # a prompt whose first generated token has text (the tiny model also emits ids without any)
    prompt = next(p for p in PROMPTS if _complete(served, p, max_tokens=1).choices[0].text)
    monkeypatch.setattr(pool, "step", slow_step)
    body = {"model": NAME, "prompt": prompt, "max_tokens": 80, "temperature": 0,
            "stream": True}
    before = served.scheduler.steps
    u = urllib.parse.urlsplit(served.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                 headers={"content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    line = r.readline()
    while not line.startswith(b"data: {"):
        line = r.readline()
    assert json.loads(line[6:])["choices"][0]["finish_reason"] is None
    r.close()  # one chunk, then hang up (the response holds the socket's last reference)
    conn.close()
    assert _wait_idle(served, 5.0)
    assert served.scheduler.steps - before < 60  # cancelled long before its 80 tokens
    assert served.scheduler.stats()["rows"] == pool.rows


@pytest.mark.parametrize(
    ("path", "payload", "status"),
    [
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b'{"model": "tiny", "prompt": "x", "temperature": "hot"}', 400),
        ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": -1}', 400),
        ("/v1/completions", b'{"model": "tiny", "prompt": 12}', 400),
        ("/v1/completions", b'{"model": "tiny", "prompt": "x", "max_tokens": "5"}', 400),
        ("/v1/completions", b'{"model": "tiny", "prompt": []}', 400),
        ("/v1/completions", b'{"model": "tiny", "prompt": [1, 99999]}', 400),
        ("/v1/completions", b'{"model": "other", "prompt": "x"}', 404),
        ("/v1/completions", b'{"model": "tiny", "prompt": "x", "n": 2}', 400),
        ("/v1/completions", b'[1, 2]', 400),
        ("/v1/chat/completions", b'{"model": "tiny"}', 400),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "cat"}]}', 400),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": "hi"}', 400),
        ("/v1/chat/completions",
         b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "top_p": 0}', 400),
        ("/v1/chat/completions",
         b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], '
         b'"chat_template_kwargs": "think"}', 400),
        ("/v1/chat/completions",
         b'{"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image"}]}]}',
         400),
    ],
)
def test_hostile_requests_get_4xx_and_the_server_keeps_serving(
        served: Served, path: str, payload: bytes, status: int) -> None:
    got, _, raw = _http(served.url, "POST", path, payload)
    assert got == status, raw
    assert "message" in json.loads(raw)["error"]
    assert _complete(served, "the day").choices[0].finish_reason in ("stop", "length")


def test_prompt_over_the_context_and_full_queue(served: Served,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    long = " ".join(["water"] * 100)
    with pytest.raises(openai.BadRequestError, match="context"):
        _complete(served, long)
    monkeypatch.setattr(served.scheduler, "max_queue", 0)
    with pytest.raises(openai.RateLimitError):
        _complete(served, "the day")
    monkeypatch.undo()
    assert _complete(served, "the day").usage.completion_tokens >= 1


def test_bounded_load(served: Served) -> None:
    """48 streamed and whole requests from 12 clients within a fixed time; all answered."""
    deadline = time.monotonic() + 60

    def one(i: int) -> int:
        if time.monotonic() > deadline:
            return 0
        p = PROMPTS[i % len(PROMPTS)]
        if i % 2:
            return sum(1 for _ in _complete(served, p, stream=True))
        return _complete(served, p).usage.completion_tokens

    t0 = time.monotonic()
    with ThreadPoolExecutor(12) as ex:
        done = list(ex.map(one, range(48)))
    assert all(n >= 1 for n in done) and time.monotonic() - t0 < 60
    assert _wait_idle(served)
    r = json.loads(_http(served.url, "GET", "/health")[2])
    assert r["status"] == "ok" and r["rows"] == served.scheduler.pool.rows


def test_cli_parses_serve() -> None:
    from leechq.cli.main import build_parser

    a = build_parser().parse_args(["serve", "dir", "--port", "9", "--max-batch", "4",
                                   "--max-context", "512"])
    assert (a.command, a.port, a.max_batch, a.max_context, a.host) == (
        "serve", 9, 4, 512, "127.0.0.1")
    assert a._module == "leechq.cli.serve"


def test_sse_wire_format(served: Served) -> None:
    body = {"model": NAME, "prompt": "the day", "max_tokens": 4, "temperature": 0,
            "stream": True}
    _, headers, raw = _http(served.url, "POST", "/v1/completions", json.dumps(body).encode())
    assert headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in raw.decode().splitlines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert all(ln.startswith("data: ") for ln in lines)
    last = json.loads(lines[-2][6:])
    assert last["choices"][0]["finish_reason"] in ("stop", "length")


def test_leechq_serve_command_answers(tmp_path: Path) -> None:
    """``leechq serve`` as a process: it binds the port, answers, and stops on SIGINT."""
    import os
    import signal
    import socket
    import subprocess
    import sys

    from leechq_tiny import make_artifact

    out, _ = make_artifact(tmp_path, "qwen3")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "leechq.cli.main", "serve", str(out), "--port", str(port),
         "--device", "cpu", "--max-batch", "2", "--max-context", "64"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if _http(url, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        assert [m.id for m in client.models.list().data] == [out.name]
        res = client.chat.completions.create(model=out.name, max_tokens=4, temperature=0,
                                             messages=[{"role": "user", "content": "the day"}])
        assert res.usage.completion_tokens >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
