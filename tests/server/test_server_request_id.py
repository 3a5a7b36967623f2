"""Every answer of `audio8 serve` carries an x-request-id (the client's own when sane, else a fresh one), and the
server's log lines for that request carry it too (a real uvicorn on 127.0.0.1 logging from info up, tiny
checkpoint)."""

from __future__ import annotations

import io
import logging
import re

import httpx
import openai
import pytest

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings

FRESH = re.compile(r"req_[0-9a-f]{32}")
SPEECH = {"input": "Hi.", "max_frames": 2, "response_format": "pcm"}
ANSWERS = [  # (method, path, JSON body or raw bytes, status): a route of each kind, refusals included
    ("POST", "/v1/audio/speech", SPEECH, 200),
    ("POST", "/v1/audio/speech", {**SPEECH, "stream": False}, 200),
    ("POST", "/v1/audio/speech", {"input": ""}, 400),
    ("POST", "/v1/audio/speech", b'{"input": "Hi", "pad": "' + b"x" * (2 << 20) + b'"}', 413),
    ("GET", "/health", None, 200),
    ("GET", "/v1/voices", None, 200),
    ("GET", "/nowhere", None, 404),
    ("GET", "/v1/audio/speech", None, 405),
]


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    """(base URL, the one model instance) of a server logging from info up."""
    instance = TTS.load(tiny_checkpoint, device="cpu", voices_dir=tmp_path_factory.mktemp("voices"))
    with serve_in_thread(create_app([instance], ServerSettings(workers=1)), log_level="info") as url:
        yield url, instance


def ask(url: str, method: str, path: str, body, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else None
    json = None if content is not None else body
    kind = {"content-type": "application/json"} if content is not None else {}
    return httpx.request(
        method, url + path, json=json, content=content, headers={**kind, **(headers or {})}, timeout=60
    )


@pytest.mark.parametrize("method, path, body, status", ANSWERS)
def test_every_answer_echoes_the_clients_id_or_has_a_fresh_one(served, method, path, body, status):
    url, _ = served
    mine = ask(url, method, path, body, {"x-request-id": "trace 7f3a-42"})
    assert mine.status_code == status and mine.headers.get_list("x-request-id") == ["trace 7f3a-42"]
    fresh = [ask(url, method, path, body).headers.get_list("x-request-id") for _ in range(2)]
    assert all(len(ids) == 1 and FRESH.fullmatch(ids[0]) for ids in fresh) and fresh[0] != fresh[1]


@pytest.mark.parametrize("sent", ["x" * 129, "a\tb", "café".encode("latin-1")])
def test_an_id_too_long_or_not_printable_ascii_is_replaced(served, sent):
    url, _ = served
    r = ask(url, "GET", "/health", None, {"x-request-id": sent})
    assert r.status_code == 200 and FRESH.fullmatch(r.headers["x-request-id"])
    assert ask(url, "GET", "/health", None, {"x-request-id": "y" * 128}).headers["x-request-id"] == "y" * 128


def test_the_last_resort_500_carries_the_id(served, monkeypatch):
    from audio8_coreai.server.metrics import Metrics

    def boom(self, *args):
        raise RuntimeError("exploded")

    monkeypatch.setattr(Metrics, "text", boom)
    r = ask(served[0], "GET", "/metrics", None, {"x-request-id": "trace-500"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "server_error"
    assert r.headers["x-request-id"] == "trace-500"


def test_the_openai_sdk_reads_the_id(served):
    client = openai.OpenAI(base_url=f"{served[0]}/v1", api_key="unused")
    kwargs = dict(model="tts-1", voice="alloy", input="Hi.", response_format="pcm", extra_body={"max_frames": 2})
    assert FRESH.fullmatch(client.audio.speech.with_raw_response.create(**kwargs).request_id)
    with client.audio.speech.with_streaming_response.create(**kwargs, extra_headers={"x-request-id": "mine"}) as r:
        assert r.request_id == "mine"


def test_the_log_lines_of_a_request_carry_its_id(served, monkeypatch):
    """The access line, a line logged on the model's worker thread and the failure logged for the request each
    name its id; a request's id is in none of another request's lines."""
    url, instance = served
    lines = io.StringIO()
    handlers = [logging.getLogger(name).handlers[0] for name in ("uvicorn.access", "audio8_coreai")]
    before = [h.setStream(lines) for h in handlers]

    def broken(*args, **kwargs):
        logging.getLogger("audio8_coreai.server").warning("making it on the worker")
        raise RuntimeError("the model broke")

    try:
        assert ask(url, "POST", "/v1/audio/speech", SPEECH, {"x-request-id": "trace-ok"}).status_code == 200
        monkeypatch.setattr(instance, "stream", broken)
        assert ask(url, "POST", "/v1/audio/speech", SPEECH, {"x-request-id": "trace-bad"}).status_code == 500
    finally:
        for handler, stream in zip(handlers, before):
            handler.setStream(stream)
    text = lines.getvalue()
    assert re.search(r'\[trace-ok\] 127\.0\.0\.1:\d+ - "POST /v1/audio/speech HTTP/1\.1" 200', text), text
    assert re.search(r'\[trace-bad\] 127\.0\.0\.1:\d+ - "POST /v1/audio/speech HTTP/1\.1" 500', text), text
    assert "[trace-bad] making it on the worker" in text and "[trace-bad] synthesis failed: RuntimeError" in text
    ok = [line for line in text.splitlines() if "trace-ok" in line and "frame cap" not in line]  # the cap's: its own
    assert len(ok) == 1  # its access line only


def test_a_clients_id_cannot_forge_a_log_line(served):
    """An id with a bracket, spaces and quotes is answered as sent, and logged with those escaped: the line cannot
    read as another request's."""
    url, _ = served
    forged = 'abc] 10.0.0.1:1 - "GET /admin HTTP/1.1" 200'
    lines = io.StringIO()
    handler = logging.getLogger("uvicorn.access").handlers[0]
    before = handler.setStream(lines)
    try:
        answer = ask(url, "GET", "/health", None, {"x-request-id": forged})
    finally:
        handler.setStream(before)
    assert answer.headers["x-request-id"] == forged
    (line,) = lines.getvalue().splitlines()
    assert line.count("[") == line.count("]") == 1 and '"GET /admin' not in line
    assert "[abc\\x5d\\x2010.0.0.1:1\\x20-\\x20\\x22GET\\x20/admin" in line


@pytest.mark.parametrize(
    "sent, logged",
    [
        (b"ray-7f3a", "ray-7f3a"),
        (b"x" * 200, "x" * 128 + "..."),  # Ray's proxy answers any length: the log keeps the head, marked cut
        (b"a\x01b\xe9", "a\\x01b\\xe9"),  # control and non-ASCII characters escaped, not replaced
        (b"a\\x01", "a\\x5cx01"),  # a backslash sent is escaped too: not read as an escaped control character
    ],
)
def test_behind_a_proxy_the_logs_carry_the_id_the_proxy_answered(sent, logged):
    """``create_app(proxy_ids=True)`` (Ray Serve): the proxy answers the client's id as it is, so the logs show
    that id (escaped, cut), not a fresh one the client never sees; no second x-request-id header."""
    import asyncio

    from audio8_coreai.server.requestid import REQUEST_ID, RequestIds

    seen, sent_headers = [], []

    async def app(scope, receive, send):
        seen.append(REQUEST_ID.get())
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message):
        sent_headers.append(message.get("headers"))

    scope = {"type": "http", "headers": [(b"x-request-id", sent)]}
    asyncio.run(RequestIds(app, answer=False)(scope, None, send))
    assert seen == [logged] and sent_headers == [[]]
    asyncio.run(RequestIds(app, answer=False)({"type": "http", "headers": []}, None, send))
    assert FRESH.fullmatch(seen[-1])
