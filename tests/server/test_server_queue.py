"""`audio8 serve` under load and loss: a full queue, a client that goes away, a damaged stored voice (a real
uvicorn on 127.0.0.1, tiny checkpoint; the helpers are test_server.py's)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import numpy as np

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings
from tests.server.http_support import SETTINGS, TEXT, metric, serving, speech


def assert_worker_freed(url: str) -> None:
    """The one worker stops within 30 s of its client leaving a 300-frame request, counted 499, and serves again."""
    deadline = time.monotonic() + 30
    while httpx.get(f"{url}/health").json()["running"]:
        assert time.monotonic() < deadline, "the worker kept generating after the client left"
        time.sleep(0.05)
    assert metric(url, 'audio8_requests_total{status="499"}') == 1
    assert metric(url, "audio8_frames_total") < 300
    assert speech(url, response_format="wav").status_code == 200


def test_full_queue_is_503_and_a_disconnect_frees_the_slot(never_eos_long_checkpoint, tmp_path):
    settings = ServerSettings(workers=1, max_queue=0, chunk_frames=4)
    # a checkpoint that never draws eos runs the whole 300 frames (steered.py), seconds of work
    body = {"input": TEXT, "seed": 4, "max_frames": 300, "stream": True, "response_format": "pcm"}
    with serving(never_eos_long_checkpoint, tmp_path, settings) as url:
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", f"{url}/v1/audio/speech", json=body) as r:
                assert r.status_code == 200
                chunks = r.iter_bytes()  # kept: a dropped iterator closes the connection
                next(chunks)
                busy = speech(url)
                assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
                assert busy.json()["error"]["code"] == "queue_full"
                assert busy.json()["error"]["message"].startswith(
                    "the server is busy: its 1 worker and 0 queue places are all taken; retry later"
                )
            # leaving the block closed the connection mid-stream
        assert_worker_freed(url)


class Ticking:
    """A stand-in for a SpeechStream: a chunk of 2048 samples every 10 ms for 300 frames, calling ``on_frame`` before
    each (which raises once the request is cancelled) and waiting at frame 8 for ``go``: chunks come far faster
    than any poll, however loaded the machine."""

    frames, duration_s, prefill_s, frames_s, codec_s, first_audio_s = 300, 300 * 2048 / 44100, 0.0, 0.0, 0.0, None
    capped: list[int] = []  # every piece ended by the model

    def __init__(self, on_frame, at_8: threading.Event, go: threading.Event):
        self.on_frame, self.at_8, self.go = on_frame, at_8, go

    def __iter__(self):
        for step in range(self.frames):
            if step == 8:
                self.at_8.set()
                assert self.go.wait(60)
            self.on_frame(step)
            time.sleep(0.01)
            yield np.zeros(2048, np.float32)


def test_a_client_that_leaves_a_whole_file_request_frees_the_worker(tiny_checkpoint, tmp_path):
    """Not streamed, nothing is sent until the end: the server still notices the client left and stops, even while
    chunks come every 10 ms, faster than any poll."""
    instance = TTS.load(tiny_checkpoint, device="cpu", voices_dir=tmp_path)
    at_8, go = threading.Event(), threading.Event()
    instance.stream = lambda *args, on_frame, **kwargs: Ticking(on_frame, at_8, go)
    body = json.dumps({"input": TEXT, "seed": 4, "response_format": "wav"}).encode()
    with serve_in_thread(create_app([instance], ServerSettings(workers=1, max_queue=0))) as url:
        parts = httpx.URL(url)
        with socket.create_connection((parts.host, parts.port)) as s:
            head = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            assert at_8.wait(60)
        go.set()  # the client has closed its connection
        assert_worker_freed(url)


def test_a_damaged_stored_voice_is_a_500_with_the_http_remedy(tiny_checkpoint, tmp_path, caplog):
    """The server's own file is broken, not the request: 500 voice_damaged, DELETE then POST, no server path; the
    file logged for the operator."""
    (tmp_path / "cut.npz").write_bytes(b"not a zip")
    with serving(tiny_checkpoint, tmp_path, SETTINGS) as url:
        with caplog.at_level(logging.ERROR, "audio8_coreai.server"):
            r = speech(url, voice="cut")
        error = r.json()["error"]
        assert r.status_code == 500 and error["code"] == "voice_damaged" and error["param"] == "voice"
        assert "DELETE /v1/voices/cut" in error["message"] and str(tmp_path) not in error["message"]
        assert f"damaged voice: voice file {tmp_path / 'cut.npz'} is damaged" in caplog.text
        (listed,) = httpx.get(f"{url}/v1/voices").json()["data"]
        assert listed["name"] == "cut" and str(tmp_path) not in listed["error"]
        assert httpx.delete(f"{url}/v1/voices/cut").status_code == 200


def test_the_free_instance_listed_first_takes_the_job():
    """Batched rows stay low: an idle server hands each job to its first free instance (row 0 again and again), a
    busy one to the next free one, never round-robin."""
    import asyncio

    from audio8_coreai.server.workers import Workers

    instances = [f"row{i}" for i in range(4)]  # stand-ins: the jobs only say which instance ran them
    workers = Workers(instances, max_queue=4)
    release = threading.Event()

    async def run() -> list[str]:
        seen = []
        for _ in range(3):  # one at a time: always the first
            workers.admit()
            seen.append(await workers.submit(lambda tts: tts))
        workers.admit()
        held = workers.submit(lambda tts: (release.wait(10), tts)[1])  # row0 busy
        while workers.running < 1:
            await asyncio.sleep(0.01)
        workers.admit()
        seen.append(await workers.submit(lambda tts: tts))
        release.set()
        seen.append(await held)
        workers.admit()
        seen.append(await workers.submit(lambda tts: tts))
        return seen

    try:
        assert asyncio.run(run()) == ["row0", "row0", "row0", "row1", "row0", "row0"]
    finally:
        workers.shutdown()
