"""Slow clients: a connection that never finishes its request, a stream whose client stops reading."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import struct
import time
from urllib.parse import urlsplit

import httpx
import pytest

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import DEFAULTS, ServerSettings
from tests.server.http_support import TEXT, Endless, metric, serving, speech


def test_a_connection_that_never_finishes_its_request_is_closed(tiny_checkpoint, tmp_path):
    settings = ServerSettings(workers=1, request_timeout_s=0.5)
    with serving(tiny_checkpoint, tmp_path, settings) as url:
        host, port = urlsplit(url).hostname, urlsplit(url).port
        partial = [
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Ty",  # headers cut short
            b'POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"input"',  # a body cut short
            b"",  # connected, silent
        ]
        for data in partial:
            with socket.create_connection((host, port), timeout=20) as s:
                s.sendall(data)
                t0 = time.monotonic()
                while s.recv(4096):  # whatever the server answers, it then closes the connection
                    pass
                assert time.monotonic() - t0 < 15
        assert speech(url, response_format="pcm", max_frames=2).status_code == 200


def test_a_stream_whose_client_stops_reading_buffers_a_bounded_amount_then_is_dropped(tiny_checkpoint, caplog):
    """At the ASGI seam, a client that reads the headers and one chunk, then nothing (its ``send`` never returns,
    as a full socket): the frame loop waits once ``stream_buffer_chunks`` chunks are queued, and after ``stall_s``
    the stream is dropped with a logged reason and the worker is free."""
    settings = ServerSettings(
        workers=1, max_frames=300, chunk_frames=4, first_chunk_frames=4, stream_buffer_chunks=2, stall_s=1.0
    )
    app = create_app([TTS.load(tiny_checkpoint, device="cpu")], settings)
    server = app.state.server
    workers = server.synth.workers
    body = json.dumps({"input": TEXT, "seed": 4, "max_frames": 300, "stream": True, "response_format": "pcm"})

    async def drive() -> list[dict]:
        sent, blocked = [], asyncio.Event()
        delivered = False

        async def receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body.encode(), "more_body": False}
            await asyncio.Event().wait()  # the client stays connected

        async def send(message):
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                blocked.set()
                await asyncio.Event().wait()  # the client reads no more

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/audio/speech",
            "raw_path": b"/v1/audio/speech",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        task = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.wait_for(blocked.wait(), 60)
        deadline = time.monotonic() + 60
        while workers.running or not workers.admitted == 0:
            assert time.monotonic() < deadline, "the worker kept the stream"
            await asyncio.sleep(0.05)
        task.cancel()
        return sent

    sent = asyncio.run(drive())
    assert sent[0]["status"] == 200
    # one chunk sent, two queued, one made while waiting for room (4 chunks), and, with the codec in a process of
    # its own, up to DEFAULTS.torch.codec_queue chunks decoding beside the frame loop and a chunk's worth less one frame
    # not yet full: 4 frames a chunk
    frames = next(s.value for s in server.metrics.frames.collect()[0].samples if s.name.endswith("_total"))
    bound = (4 + (DEFAULTS.torch.codec_queue if server.synth.instances[0].backend.codec_process else 0)) * 4 + 3
    assert 4 <= frames <= bound
    assert any("not reading" in r.getMessage() for r in caplog.records)


def _stop_reading_after_the_head(s: socket.socket, url: str, request: dict) -> bytes:
    """Send the speech ``request`` on ``s`` (a small receive window, so the server's sends back up), read its answer's
    head (a 200) and return what was read: the client then reads nothing."""
    body = json.dumps(request).encode()
    head = (
        "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect((urlsplit(url).hostname, urlsplit(url).port))
    s.sendall(head + body)
    received = b""
    while b"\r\n\r\n" not in received:
        received += s.recv(256)
    assert received.startswith(b"HTTP/1.1 200")
    return received


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_stream_dropped_for_a_client_that_stopped_reading_is_cut_and_counted_as_it_is_dropped(
    tiny_checkpoint, stream_format, caplog, capfd
):
    """Over a real socket, a client that reads the head and then nothing (its receive window full): after ``stall_s``
    the server drops the stream, counts the 499 client_stalled while the client still reads nothing, frees the
    worker, and aborts the connection (what the server still buffered discarded, no last chunk): the client that
    reads on gets what its own socket held and then a reset, a body it can tell was cut; audio or OpenAI's events
    alike."""
    instance = TTS.load(tiny_checkpoint, device="cpu")
    instance.stream = lambda *args, on_frame, **kwargs: Endless(on_frame)
    settings = ServerSettings(workers=1, stream_buffer_chunks=2, stall_s=1.0)
    with serve_in_thread(create_app([instance], settings)) as url:
        before = metric(url, 'audio8_errors_total{code="client_stalled"}')
        request = {"input": "Hello.", "response_format": "pcm", "stream": True, "stream_format": stream_format}
        with socket.socket() as s:
            received = _stop_reading_after_the_head(s, url, request)
            deadline = time.monotonic() + 30
            while metric(url, 'audio8_errors_total{code="client_stalled"}') < before + 1:
                assert time.monotonic() < deadline, "the stalled stream was not dropped"
                time.sleep(0.1)
            assert httpx.get(f"{url}/health").json()["running"] == 0
            with pytest.raises(ConnectionResetError):  # reading on: what the client's socket held, then a reset
                while data := s.recv(65536):
                    received += data
        assert b"transfer-encoding: chunked" in received.lower()
        assert not received.endswith(b"0\r\n\r\n")  # no last chunk: cut, not ended
        assert b"speech.audio.done" not in received  # events: no last event either
        assert metric(url, 'audio8_errors_total{code="client_stalled"}') == before + 1
    gc.collect()  # a worker's failure nobody retrieved would be logged as its future is collected
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    logged = [line for line in capfd.readouterr().err.splitlines() if "without completing response" in line]
    assert len(logged) == 1 and logged[0].startswith("WARNING")  # uvicorn's line for a cut stream: no ERROR


def test_a_shutdown_waits_shutdown_s_for_a_client_that_reads_nothing_not_its_stall_drop(tiny_checkpoint):
    """SIGTERM's path (uvicorn's should_exit) with a stream whose client reads nothing: the server ends about
    ``shutdown_s`` after, not at the stream's ``stall_s`` drop (it took 40 s; docker stop kills after 10)."""
    instance = TTS.load(tiny_checkpoint, device="cpu")
    instance.stream = lambda *args, on_frame, **kwargs: Endless(on_frame)
    settings = ServerSettings(workers=1, stream_buffer_chunks=2, stall_s=60.0, shutdown_s=1.0)
    with socket.socket() as s:
        with serve_in_thread(create_app([instance], settings)) as url:
            _stop_reading_after_the_head(s, url, {"input": "Hello.", "response_format": "pcm", "stream": True})
            time.sleep(0.5)  # the server's sends back up
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 20  # shutdown_s and the threads' ends, far from stall_s's 60


def test_a_client_that_leaves_mid_stream_is_counted_without_an_error_in_the_log(tiny_checkpoint, capfd):
    """Over a real socket (uvloop where it is installed, as ``audio8 serve``): clients that read a stream's first
    bytes and leave (closing, or with a reset) are counted 499 client_closed, and the server logs no error."""
    instance = TTS.load(tiny_checkpoint, device="cpu")
    instance.stream = lambda *args, on_frame, **kwargs: Endless(on_frame)
    with serve_in_thread(create_app([instance], ServerSettings(workers=1))) as url:
        before = metric(url, 'audio8_errors_total{code="client_closed"}')
        body = json.dumps({"input": "Hello.", "response_format": "pcm", "stream": True}).encode()
        head = (
            "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        for leaving in range(6):
            with socket.create_connection((urlsplit(url).hostname, urlsplit(url).port), timeout=30) as s:
                s.sendall(head + body)
                received = b""
                while len(received) < 100_000:
                    received += s.recv(65536)
                if leaving % 2:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        deadline = time.monotonic() + 30
        while metric(url, 'audio8_errors_total{code="client_closed"}') < before + 6:
            assert time.monotonic() < deadline, "the streams were not counted as left"
            time.sleep(0.1)
        assert httpx.get(f"{url}/health").json()["running"] == 0
    assert "Exception in ASGI" not in capfd.readouterr().err
