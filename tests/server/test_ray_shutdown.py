"""``audio8 serve --ray`` stopped by SIGTERM (``docker stop``, systemd) with a stream running: as ``audio8 serve``,
the stream gets ``server.shutdown_s`` to finish, then the command says 'terminated' and ends by the signal."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.server.wyoming_support import free_port

pytest.importorskip("ray.serve")

FRAMES = 300  # about 3 s of frames here: far longer than SIGTERM takes to arrive


def test_sigterm_lets_a_running_stream_finish(never_eos_long_checkpoint, tmp_path):
    port = free_port()
    env = {**os.environ, "AUDIO8_SERVER__SHUTDOWN_S": "60", "RAY_ADDRESS": ""}
    command = [sys.executable, "-m", "audio8_coreai", "serve", "--ray", "--port", str(port)]
    command += ["--model", str(never_eos_long_checkpoint), "--voices", str(tmp_path / "voices")]
    log = (tmp_path / "stderr").open("w")  # a file, not a pipe: Ray's lines never fill it up and block the server
    server = subprocess.Popen(  # a session of its own: Ray's processes are ended with it if the test fails
        command, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:  # Ray's instance, its proxy, then the app's replicas
            assert server.poll() is None and time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        body = {"input": "Hello there.", "seed": 1, "max_frames": FRAMES, "stream": True}
        body |= {"response_format": "pcm", "sample_rate": 44100}
        received = 0
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=120) as r:
            for chunk in r.iter_raw():
                if not received:  # the stream runs: stop the server
                    server.send_signal(signal.SIGTERM)
                received += len(chunk)
        assert received == FRAMES * 2048 * 2  # whole: the stream was let finish
        server.wait(timeout=120)
        said = (tmp_path / "stderr").read_text()
        assert server.returncode == -signal.SIGTERM and said.rstrip().endswith("terminated"), said[-2000:]
        assert "answers still running get 60 s to finish" in said
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of Ray's is left, when the test failed
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()
