"""Slow clients: a connection that never finishes its request, a stream whose client stops reading."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

from audio8_coreai import TTS
from audio8_coreai.server import ServerSettings, create_app
from audio8_coreai.settings import DEFAULTS
from test_server import TEXT, serving, speech


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
    # its own, up to DEFAULTS.codec_queue chunks decoding beside the frame loop and a chunk's worth less one frame
    # not yet full: 4 frames a chunk
    frames = next(s.value for s in server.metrics.frames.collect()[0].samples if s.name.endswith("_total"))
    bound = (4 + (DEFAULTS.codec_queue if server.synth.instances[0].backend.codec_process else 0)) * 4 + 3
    assert 4 <= frames <= bound
    assert any("not reading" in r.getMessage() for r in caplog.records)
