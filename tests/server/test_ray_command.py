"""``audio8 serve --ray`` (:func:`audio8_coreai.server.ray_app.run_on_ray`): which Ray it starts or joins, and how it
stops: on SIGTERM (``docker stop``, systemd) with a stream running, as ``audio8 serve``, the stream gets
``server.shutdown_s`` to finish, then the command says 'terminated' and ends by the signal."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from audio8_coreai.settings import RaySettings, ServerSettings
from tests.server.wyoming_support import free_port

pytest.importorskip("ray.serve")

from audio8_coreai.server.ray_app import run_on_ray  # noqa: E402

FRAMES = 300  # about 3 s of frames here: far longer than SIGTERM takes to arrive


@contextlib.contextmanager
def ray_server(checkpoint, tmp_path, shutdown_s: str):
    """``audio8 serve --ray`` on ``checkpoint`` in a session of its own (Ray's processes end with it if the test
    fails), ``AUDIO8_SERVER__SHUTDOWN_S`` ``shutdown_s``; yields (the process, its URL, its stderr file) once
    ``/health`` answers."""
    port = free_port()
    env = {**os.environ, "AUDIO8_SERVER__SHUTDOWN_S": shutdown_s, "RAY_ADDRESS": ""}
    command = [sys.executable, "-m", "audio8_coreai", "serve", "--ray", "--port", str(port)]
    command += ["--model", str(checkpoint), "--voices", str(tmp_path / "voices")]
    stderr = tmp_path / "stderr"
    log = stderr.open("w")  # a file, not a pipe: Ray's lines never fill it up and block the server
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
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
        yield server, url, stderr
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever of Ray's is left, when the test failed
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()


def test_sigterm_lets_a_running_stream_finish(never_eos_long_checkpoint, tmp_path):
    with ray_server(never_eos_long_checkpoint, tmp_path, "60") as (server, url, stderr):
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
        said = stderr.read_text()
        assert server.returncode == -signal.SIGTERM and said.rstrip().endswith("terminated"), said[-2000:]
        assert "answers still running get 60 s to finish" in said


def test_sigterm_to_the_process_group_stops_within_the_shutdown_time(tiny_checkpoint, tmp_path):
    """systemd's stop, timeout and kill -- -PGID signal Ray's own processes too: deleting the app then waited 60 s
    for a GCS that was gone, and Ray aborted the command; now it waits shutdown_s and a margin, and says why."""
    with ray_server(tiny_checkpoint, tmp_path, "2") as (server, url, stderr):
        t0 = time.monotonic()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=120)
        took, said = time.monotonic() - t0, stderr.read_text()
        assert took < 30 and said.rstrip().endswith("terminated"), (took, said[-2000:])


@pytest.fixture(scope="module")
def listening():
    """The HOST:PORT of a socket listening on 127.0.0.1 (where a Ray head would)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize(
    ("address", "env", "joined"),
    [(None, None, "local"), ("auto", None, "auto"), (None, "HEAD", "HEAD"), ("HEAD", "x:2", "HEAD")],
)
def test_serve_on_ray_starts_a_new_instance_unless_told_which_to_join(monkeypatch, listening, address, env, joined):
    """Without --address (or RAY_ADDRESS) a Ray instance of its own: ray.init() alone joins a cluster `ray start`
    began on this machine, and serving there replaced that cluster's deployed audio8 app."""
    import ray

    class Joined(Exception):
        pass

    def init(address=None, **_):
        raise Joined(address)

    address, env, joined = (listening if v == "HEAD" else v for v in (address, env, joined))
    monkeypatch.setattr(ray, "init", init)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    with pytest.raises(Joined) as err:
        run_on_ray(RaySettings(), ServerSettings(), address)
    assert err.value.args == (joined,)


@pytest.mark.parametrize("raised", [ConnectionError("Could not find any running Ray instance."), ValueError("bad")])
def test_no_cluster_at_the_address_is_a_config_error(monkeypatch, raised):
    import ray

    from audio8_coreai.errors import ConfigError

    def init(address=None, **_):
        raise raised

    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ConfigError, match=rf"cannot join the Ray cluster at auto \({raised}\); give --address HEAD_IP"):
        run_on_ray(RaySettings(), ServerSettings(), "auto")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=rf"^cannot start a Ray instance on this machine \({raised}\)$"):
        run_on_ray(RaySettings(), ServerSettings(), None)


def test_an_address_nobody_answers_at_is_said_at_once(monkeypatch):
    """ray.init would retry it for minutes."""
    import ray

    from audio8_coreai.errors import ConfigError

    monkeypatch.setattr(ray, "init", lambda **_: pytest.fail("ray.init was called"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
    for given in (closed, f"ray://{closed}"):
        t0 = time.monotonic()
        with pytest.raises(ConfigError, match=rf"^cannot join the Ray cluster at {re.escape(given)} \(.*refused"):
            run_on_ray(RaySettings(), ServerSettings(), given)
        assert time.monotonic() - t0 < 5
