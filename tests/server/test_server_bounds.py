"""The HTTP layer's bounds in bytes: a request head past its limit is a JSON 431 before the rest is read, and past
the connection limit a request gets the API's JSON 503 (a real uvicorn on 127.0.0.1, tiny checkpoint)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from audio8_coreai.server.connections import reset
from audio8_coreai.settings import ServerSettings
from tests.server.http_support import serving

LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def url(tiny_checkpoint, tmp_path_factory):
    settings = ServerSettings(workers=1, max_head_bytes=LIMIT, max_connections=3)
    with serving(tiny_checkpoint, tmp_path_factory.mktemp("voices"), settings) as base:
        yield base


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    got = b""
    try:
        while data := sock.recv(65536):
            got += data
    except ConnectionResetError:
        pass
    return got


def _json_answer(raw: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, json.loads(body)


def test_a_head_past_the_limit_is_431_json_and_the_rest_is_never_parsed(url):
    """A 16 MB header sent in one go: the server answers 431 once 64 KB are in, shuts its side (so the answer comes
    before any reset), drops at most ``max_unread_body_bytes`` more and closes (the client's send fails: the server
    stopped taking bytes long before 16 MB)."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (16 << 20)
    outcome: list[str] = []
    with socket.create_connection(_address(url), timeout=30) as sock:
        sent = threading.Thread(target=lambda: outcome.append(_try(sock.sendall, head)))
        t0 = time.monotonic()
        sent.start()
        raw = _answer(sock)
        sent.join(30)
    status, headers, body = _json_answer(raw)
    assert status == 431 and headers["content-type"] == "application/json" and time.monotonic() - t0 < 15
    assert body["error"]["code"] == "head_too_large" and f"over {LIMIT} bytes" in body["error"]["message"]
    assert outcome == ["refused"]
    assert httpx.get(f"{url}/health").status_code == 200  # the server serves on


@pytest.mark.parametrize("extra", [1, 5_000, 40_000])
def test_a_whole_head_just_past_the_limit_in_one_write_is_431_with_a_request_id(url, extra):
    """A head a little over 64 KB, sent whole in one write (so it can arrive in one read, head end included): 431
    all the same, with an x-request-id as every answer has; one just under the limit is served."""
    header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: "
    pad = LIMIT - len(header) - 4 + extra  # the head with its end (CRLF CRLF) is LIMIT + extra bytes
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(header + b"a" * pad + b"\r\n\r\n")
        status, headers, body = _json_answer(_answer(sock))
    assert status == 431 and body["error"]["code"] == "head_too_large"
    assert headers["x-request-id"].startswith("req_")
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(header + b"a" * (pad - extra - 100) + b"\r\nConnection: close\r\n\r\n")
        assert _answer(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("size, status", [(LIMIT - 1000, 200), (LIMIT + 1000, 431)])
def test_a_head_sent_in_pieces_is_held_to_the_same_limit(url, size, status):
    """A head sent 4 KB at a time (each piece its own read): served under the limit and a JSON 431 over it, as when
    it comes in one read (h11's own 16 KB cap on a head still coming would answer a plain-text 400)."""
    header = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Big: "
    head = header + b"a" * (size - len(header) - 4) + b"\r\n\r\n"
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):  # over the limit, the server may close before the last piece
            for at in range(0, len(head), 4096):
                sock.sendall(head[at : at + 4096])
                time.sleep(0.01)
        raw = _answer(sock)
    assert raw.startswith(f"HTTP/1.1 {status} ".encode()), raw[:300]
    if status == 431:
        assert _json_answer(raw)[2]["error"]["code"] == "head_too_large"


def test_a_body_refused_unread_gets_one_answer_and_no_second(url):
    """A speech body over its 1 MB limit with its content-length: the API's 413 and nothing after it in the next
    5 s (the unread body is not taken for a next request's head: no 431 following it)."""
    body = b"{" + b" " * 2_000_000 + b"}"
    head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    with socket.create_connection(_address(url), timeout=30) as sock:
        with contextlib.suppress(OSError):  # the server may close before taking the whole body
            sock.sendall(head.encode() + b"\r\n\r\n" + body)
        sock.settimeout(5)
        raw = b""
        with contextlib.suppress(OSError):  # a reset, or 5 s of nothing more
            while data := sock.recv(65536):
                raw += data
    assert raw.startswith(b"HTTP/1.1 413") and raw.count(b"HTTP/1.1 ") == 1, raw[:300]


def test_a_413_on_a_kept_connection_leaves_the_next_request_served(url):
    """A body just over the limit on a kept-alive connection, ten times: each a 413 saying ``connection: close``,
    and the request after it (which the client sends on a new connection) served. Before, the server closed the
    connection under the client's feet: 23 of 40 next requests met a reset."""
    big = b'{"input": "Hi", "pad": "' + b"x" * 1_100_000 + b'"}'
    with httpx.Client(timeout=30) as client:
        for _ in range(10):
            answer = client.post(f"{url}/v1/audio/speech", content=big, headers={"content-type": "application/json"})
            assert answer.status_code == 413 and answer.headers["connection"] == "close"
            assert client.get(f"{url}/health").status_code == 200


def test_a_body_refused_early_is_read_whole_and_the_answer_ends_in_a_close_not_a_reset(url):
    """The client sends all of its 1.5 MB body (the server reads and drops what its 413 left unread), then reads
    the one answer and the server's close: no reset."""
    body = b"{" + b" " * 1_500_000 + b"}"
    head = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        raw = b""
        while data := sock.recv(65536):  # a reset raises here
            raw += data
    status, headers, error = _json_answer(raw)
    assert (status, headers["connection"], error["error"]["code"]) == (413, "close", "body_too_large")


def test_health_and_a_speech_request_keep_their_connection(url):
    with httpx.Client(timeout=60) as client:
        assert "connection" not in client.get(f"{url}/health").headers
        answer = client.post(f"{url}/v1/audio/speech", json={"input": "Hi.", "max_frames": 2, "response_format": "pcm"})
        assert answer.status_code == 200 and "connection" not in answer.headers


def _try(call, *args) -> str:
    """``call(*args)``: "sent", or "refused" when the server closed the connection first."""
    try:
        call(*args)
    except OSError:
        return "refused"
    return "sent"


def test_heads_under_the_limit_and_big_bodies_are_served(url):
    """A 30 KB header is served; so is a 900 KB JSON body that arrives in the same reads as its head."""
    assert httpx.get(f"{url}/health", headers={"X-Pad": "a" * 30_000}).status_code == 200
    body = b'{"input": "Hi.", "max_frames": 2, "seed": 1' + b" " * 900_000 + b', "response_format": "pcm"}'
    answer = httpx.post(f"{url}/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 200 and len(answer.content) > 0


def test_past_the_connection_limit_a_request_gets_the_apis_json_503(url):
    """Three connections at most: with two held open and silent, a third's request is refused as the API refuses
    (JSON, a code, Retry-After, its x-request-id); with them gone it is served. /health is answered whatever the
    load (a probe must not restart a busy server)."""
    held = [socket.create_connection(_address(url), timeout=10) for _ in range(2)]
    try:
        time.sleep(0.2)
        answer = httpx.get(f"{url}/v1/voices", headers={"x-request-id": "probe-1"})
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert answer.json()["error"]["code"] == "too_many_connections"
        assert answer.headers.get_list("x-request-id") == ["probe-1"]
        assert httpx.get(f"{url}/health").status_code == 200
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(f"{url}/v1/voices").status_code == 200


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_cut_response_resets_its_connection_and_one_already_closed_is_left_alone(loop):
    """``reset``, as a cut stream ends (uvicorn runs on uvloop where it is installed): the peer of a live connection
    sees a reset, not an end; a connection the client already reset is left alone, without an error."""
    new_loop = pytest.importorskip("uvloop").new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    accepted: asyncio.Queue = asyncio.Queue()

    async def main() -> type[BaseException] | None:
        server = await asyncio.start_server(lambda r, w: accepted.put_nowait(w), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        live = await accepted.get()
        live.write(b"partial")
        await live.drain()
        reset(live.transport)
        try:
            while await asyncio.wait_for(reader.read(65536), 10):
                pass
            seen = None
        except ConnectionResetError as e:
            seen = type(e)
        writer.close()
        _, leaving = await asyncio.open_connection("127.0.0.1", port)
        gone = await accepted.get()
        leaving.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        leaving.transport.abort()  # the client leaves with a reset
        with contextlib.suppress(ConnectionError):
            while not gone.transport.is_closing():  # until the server's side has seen it go
                gone.write(b"x")
                await gone.drain()
                await asyncio.sleep(0.01)
        reset(gone.transport)  # no error
        server.close()
        return seen

    event_loop = new_loop()
    try:
        assert event_loop.run_until_complete(main()) is ConnectionResetError
    finally:
        event_loop.close()


def test_an_http_1_0_client_gets_a_plain_body_ended_by_the_close(never_eos_checkpoint, tmp_path):
    """HTTP/1.0 has no chunked encoding: a streamed body goes as it is, ended by closing the connection (uvicorn's
    httptools protocol chunked it, so a 1.0 client played the chunk sizes as audio; the server runs h11's). The
    checkpoint never draws eos: 3 frames, whatever the seed."""
    body = json.dumps({"input": "Hi.", "seed": 1, "max_frames": 3, "response_format": "pcm", "sample_rate": 44100})
    request = (
        f"POST /v1/audio/speech HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        + body
    ).encode()
    with serving(never_eos_checkpoint, tmp_path, ServerSettings(workers=1)) as url:
        with socket.create_connection(_address(url), timeout=30) as sock:
            sock.sendall(request)
            raw = _answer(sock)
    head, _, audio = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:])}
    assert lines[0].split()[1] == "200" and "transfer-encoding" not in headers
    assert len(audio) == 3 * 2048 * 2  # 3 frames of 16-bit samples, no chunk lines
