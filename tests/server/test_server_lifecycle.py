"""``audio8 serve`` starting (it says what it serves) and shutting down (SIGTERM, Ctrl-C: uvicorn's should_exit)
with requests in flight: those waiting for a place are refused at once, what runs gets ``shutdown_s``, then the
app ends it (a whole file a JSON 503, a stream cut): no request is cancelled by uvicorn (a plain-text 500 and a
traceback each)."""

from __future__ import annotations

import threading
import time

import httpx

from audio8_coreai import TTS
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings
from tests.server.http_support import Endless
from tests.server.wyoming_support import free_port

GRACE_S = 2.0


def test_a_shutdown_refuses_the_waiting_then_ends_the_running_as_the_app_says(tiny_checkpoint, capfd):
    instances = [TTS.load(tiny_checkpoint, device="cpu") for _ in range(2)]
    for instance in instances:
        instance.stream = lambda *args, on_frame, **kwargs: Endless(on_frame, seconds=0.1, every_s=0.02)
    settings = ServerSettings(workers=2, max_queue=2, shutdown_s=GRACE_S)
    answers: dict[str, tuple] = {}

    def whole(url: str, name: str) -> None:
        r = httpx.post(f"{url}/v1/audio/speech", json={"input": "Hello.", "stream": False}, timeout=60)
        answers[name] = (r.status_code, r.headers.get("retry-after"), r.json()["error"]["code"], time.monotonic())

    def stream(url: str) -> None:
        received = 0
        body = {"input": "Hello.", "stream": True, "response_format": "pcm"}
        try:
            with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as r:
                for chunk in r.iter_raw():
                    received += len(chunk)
        except httpx.HTTPError as e:  # cut: no last chunk
            answers["stream"] = (type(e).__name__, received)

    with serve_in_thread(create_app(instances, settings)) as url:
        clients = [threading.Thread(target=stream, args=(url,)), threading.Thread(target=whole, args=(url, "whole"))]
        for client in clients:
            client.start()
        while httpx.get(f"{url}/health").json()["running"] < 2:
            time.sleep(0.05)
        clients.append(threading.Thread(target=whole, args=(url, "waiting")))
        clients[-1].start()
        while httpx.get(f"{url}/health").json()["queued"] < 1:
            time.sleep(0.05)
        stopped = time.monotonic()  # leaving the block is SIGTERM's path
    for client in clients:
        client.join(timeout=60)
    assert answers["waiting"][:3] == (503, "1", "shutting_down") and answers["waiting"][3] - stopped < 1.0
    assert answers["whole"][:3] == (503, "1", "shutting_down")
    assert GRACE_S - 1.0 < answers["whole"][3] - stopped < GRACE_S + 1.0  # at the grace's end, not at once
    assert answers["stream"][0] in ("RemoteProtocolError", "ReadError") and answers["stream"][1] > 0
    said = capfd.readouterr().err
    assert "Traceback" not in said and "Exception in ASGI" not in said and "timeout graceful shutdown" not in said
    assert said.count("a stream was cut: the server is shutting down") == 1


def test_serve_says_what_it_serves(tiny_checkpoint, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from audio8_coreai.cli import app
    from audio8_coreai.server.connections import Server

    monkeypatch.setattr(Server, "run", lambda self: None)  # started, not left running
    args = ["serve", "--model", str(tiny_checkpoint), "--voices", str(tmp_path), "--workers", "2"]
    args += ["--port", str(free_port())]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"serving {tiny_checkpoint.name} (torch cpu int16, 2 worker(s); voices in {tmp_path})" in result.output


def test_serve_batches_one_models_rows_by_default_on_a_cuda_device_only(tiny_checkpoint, tmp_path, monkeypatch):
    """On a GPU one utterance at a time left it mostly idle (an H200 ran 64 real-time streams from one fp32 model):
    given neither --batch nor --workers, ``audio8 serve`` serves ``cuda_batch`` rows there, one utterance at a time
    on a CPU; an explicit --batch (0 too), AUDIO8_SERVER__BATCH or --workers decides instead."""
    from typer.testing import CliRunner

    from audio8_coreai.cli import app
    from audio8_coreai.cli.serve import serve_rows
    from audio8_coreai.server.connections import Server
    from audio8_coreai.settings import DEFAULTS

    assert DEFAULTS.server.cuda_batch == 32
    assert serve_rows(None, 0, 1, "cuda") == 32
    assert serve_rows(None, 0, 1, "cpu") == 0
    assert serve_rows(0, 0, 1, "cuda") == 0  # --batch 0
    assert serve_rows(8, 8, 1, "cuda") == 8
    assert serve_rows(None, 0, 2, "cuda") == 0  # --workers 2
    assert serve_rows(None, 4, 1, "cuda") == 4  # AUDIO8_SERVER__BATCH=4
    monkeypatch.setattr(Server, "run", lambda self: None)  # started, not left running
    args = ["serve", "--model", str(tiny_checkpoint), "--voices", str(tmp_path), "--port", str(free_port())]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"serving {tiny_checkpoint.name} (torch cpu int16, 1 worker(s); voices in {tmp_path})" in result.output
