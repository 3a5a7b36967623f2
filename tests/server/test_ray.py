"""`audio8 serve --ray`: the same app over Ray Serve (server/ray_app.py), tiny checkpoint.

Unit tests run the Synth deployment in Ray's local testing mode (in this process) behind the app served by uvicorn;
one integration test starts a local Ray cluster with 2 Synth replicas behind Ray's HTTP proxy. A test that needs
audio spoken (its frames, that it is spoken at all) runs on the checkpoint that never draws eos (steered.py).
"""

from __future__ import annotations

import pickle
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from audio8_coreai import TTS
from audio8_coreai.server import ApiError, create_app, serve_in_thread
from audio8_coreai.settings import RaySettings, ServerSettings
from tests import clips

pytest.importorskip("ray.serve")

from ray import serve  # noqa: E402

from audio8_coreai.server.ray_app import RaySynthesizer, SynthDeployment, application, voice_key  # noqa: E402
from audio8_coreai.voices import VoiceStore  # noqa: E402

TEXT = "The meeting has been moved to Thursday afternoon."
SETTINGS = ServerSettings(max_queue=1, max_input_chars=300, max_upload_bytes=1_000_000, chunk_frames=4)


def speech(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json={"input": TEXT, "seed": 1, "max_frames": 12, **body}, timeout=120)


def add_voice(url: str, name: str, seconds: float, tmp_path: Path) -> httpx.Response:
    clip = clips.write(tmp_path / f"{name}.wav", clips.sweep(22050, seconds), 22050)
    files = {"audio": ("clip.wav", clip.read_bytes(), "audio/wav")}
    form = {"name": name, "transcript": "A rising tone.", "replace": "true"}
    return httpx.post(f"{url}/v1/voices", data=form, files=files, timeout=120)


@contextmanager
def plain_server(checkpoint: Path, voices: Path, batch: int):
    """``audio8 serve --batch N`` (N rows of one model; ``batch`` 0: one instance) in this process."""
    tts = TTS.load(checkpoint, device="cpu", voices_dir=voices)
    with serve_in_thread(create_app(tts.batched(batch)[1] if batch else [tts], SETTINGS)) as url:
        yield url


# ------------------------------------------------------------------------------------------------------------
# Ray's local testing mode: the Synth deployment in this process, the app over its handle


@pytest.fixture(scope="module")
def voices(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shared_voices")


def local_app(checkpoint: Path, voices: Path, name: str):
    """The Synth deployment (2 rows) on ``checkpoint`` in Ray's local testing mode behind the app served by uvicorn;
    yields its base URL."""
    cluster = RaySettings(model=str(checkpoint), voices=str(voices), device="cpu")
    server = SETTINGS.model_copy(update={"batch": 2})
    handle = serve.run(SynthDeployment.bind(cluster, server), name=name, _local_testing_mode=True)
    synth = RaySynthesizer(handle, VoiceStore(voices), SETTINGS.max_queue, handle.info.remote().result())
    with serve_in_thread(create_app(synth, SETTINGS)) as url:
        yield url


@pytest.fixture(scope="module")
def local(tiny_checkpoint, voices):
    yield from local_app(tiny_checkpoint, voices, "audio8-local")


@pytest.fixture(scope="module")
def capped(never_eos_long_checkpoint, voices):
    """The same on the checkpoint that never draws eos: every request speaks to its frame cap."""
    yield from local_app(never_eos_long_checkpoint, voices, "audio8-local-capped")


def test_whole_and_streamed_speech_equal_the_plain_servers(capped, never_eos_long_checkpoint, voices):
    whole = speech(capped, response_format="wav")
    assert whole.status_code == 200, whole.text
    assert whole.headers["x-replica"] == "local" and whole.headers["x-seed"] == "1"
    assert whole.headers["x-sample-rate"] == "44100" and whole.headers["content-type"] == "audio/wav"
    kept = speech(capped, response_format="wav", stream=False)  # a whole file: the replica's frame-cap note, passed on
    assert kept.headers["x-audio8-frame-cap"].startswith("speech stopped at the frame cap (12 frames) before")
    body = {"input": TEXT, "seed": 1, "max_frames": 12, "stream": True, "response_format": "pcm", "sample_rate": 44100}
    with httpx.stream("POST", f"{capped}/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and "content-length" not in r.headers
        chunks = [c for c in r.iter_raw() if c]
    assert len(chunks) > 1 and sum(map(len, chunks)) == 12 * 2048 * 2  # 12 frames of 16-bit samples
    with plain_server(never_eos_long_checkpoint, voices, batch=2) as url:
        assert speech(url, response_format="wav").content == whole.content
        assert speech(url, response_format="pcm", sample_rate=44100).content == b"".join(chunks)


def counters(url: str) -> dict[str, float]:
    """The samples of ``url``'s /metrics by name (unlabelled ones)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics").text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def test_the_ingress_counts_the_speech_its_replicas_make(capped):
    """Frames, seconds of speech, compute seconds and TTFA come back with each stream's end (Finished.spoken):
    /metrics on a cluster counts them as `audio8 serve` does; Ray's queue is not seen there, so no queue depth."""
    before = counters(capped)
    for stream in (False, True):
        assert speech(capped, response_format="wav", stream=stream).status_code == 200
    after = counters(capped)
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    assert delta["audio8_frames_total"] == 24 and delta["audio8_ttfa_seconds_count"] == 2  # 12 frames each
    assert delta["audio8_audio_seconds_total"] == pytest.approx(24 * 2048 / 44100)
    assert delta["audio8_compute_seconds_total"] > 0 and delta["audio8_capped_pieces_total"] == 2
    assert after["audio8_rtf"] > 0 and "audio8_queue_depth" not in after


@pytest.mark.parametrize(
    "body, status, code",
    [
        ({"input": ""}, 400, "empty_input"),  # the schema, at the ingress
        ({"voice": "nobody-here"}, 400, "voice_not_found"),  # the shared store, at the ingress
        ({"max_frames": 600}, 400, "invalid_request"),  # the context, in the replica: raised there, said here
        ({"model": "a\r\nX-Evil: 1"}, 400, "invalid_model"),  # no header-unsafe echo (issue 17), at the ingress
        ({"temperature": "0.7"}, 400, "invalid_request"),  # strict numbers
        ({"input": "...!!"}, 400, "empty_input"),  # nothing to speak
    ],
)
def test_errors_keep_their_status_and_shape(local, body, status, code):
    r = speech(local, **body)
    error = r.json()["error"]
    assert r.status_code == status and error["code"] == code and error["type"] == "invalid_request_error"
    if body.get("max_frames"):
        assert "at most" in error["message"] and "fit the model's context" in error["message"]


def test_voices_register_speak_list_and_delete_through_the_replica(capped, voices, tmp_path, never_eos_long_checkpoint):
    r = add_voice(capped, "ana", 1.5, tmp_path)
    assert r.status_code == 201, r.text
    assert r.json()["frames"] == 33 and (voices / "ana.npz").is_file()  # written by the replica, in the shared store
    files = {"audio": ("clip.wav", b"RIFF", "audio/wav")}
    taken = httpx.post(f"{capped}/v1/voices", data={"name": "ANA", "transcript": "t"}, files=files, timeout=120)
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "voice_exists"
    assert [v["name"] for v in httpx.get(f"{capped}/v1/voices").json()["data"]] == ["ana"]
    cloned = speech(capped, voice="ana", response_format="wav")
    assert cloned.status_code == 200 and cloned.content != speech(capped, response_format="wav").content
    assert httpx.delete(f"{capped}/v1/voices/ana").status_code == 200
    assert speech(capped, voice="ana").json()["error"]["code"] == "voice_not_found"
    health = httpx.get(f"{capped}/health").json()
    assert health["workers"] == 2 and health["running"] == 0 and "batched x2" in health["backend"]
    assert health["max_queue"] == SETTINGS.max_queue and health["device"] == "cpu"
    assert health["model"] == never_eos_long_checkpoint.name  # the folder's name, never its path


def test_a_replica_failure_is_a_json_500_without_details(capped, monkeypatch):
    def boom(self, *args, **kwargs):
        raise RuntimeError("/work/secret/place exploded")

    monkeypatch.setattr(TTS, "stream", boom)
    r = speech(capped, response_format="wav")
    error = r.json()["error"]
    assert r.status_code == 500 and error["code"] == "server_error" and error["type"] == "server_error"
    assert "exploded" not in r.text and "/work" not in r.text and "RuntimeError" in error["message"]
    monkeypatch.undo()
    assert speech(capped, response_format="pcm").status_code == 200


@pytest.mark.parametrize("lost", ["ActorDiedError", "ReplicaUnavailableError"])
def test_a_replica_lost_before_the_first_byte_is_a_503_with_retry_after(capped, monkeypatch, lost):
    """The replica's call ends as Ray's handle reports a replica that died (or cannot be reached) before it gave
    anything: nothing was spoken, so the answer is a 503 replica_unavailable with Retry-After (the client may send
    it again), not a 500; the next request is served."""
    import ray.exceptions
    import ray.serve.exceptions

    from audio8_coreai.server.synth import LocalSynthesizer

    error = {
        "ActorDiedError": ray.exceptions.ActorDiedError(),
        "ReplicaUnavailableError": ray.serve.exceptions.ReplicaUnavailableError("replica gone"),
    }[lost]

    async def dying(self, checked, output):  # in the replica's Synth.speak, before its first item
        raise error

    monkeypatch.setattr(LocalSynthesizer, "open", dying)
    r = speech(capped, response_format="wav")
    error_body = r.json()["error"]
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
    assert error_body["code"] == "replica_unavailable" and "send the request again" in error_body["message"]
    monkeypatch.undo()
    assert speech(capped, response_format="pcm").status_code == 200


def test_health_counts_the_running_replicas_and_is_a_503_without_one(monkeypatch, tmp_path):
    """On a cluster /health asks Ray's controller how many Synth replicas run: a load balancer saw 200 while every
    replica was lost (or not yet started). None running, or a controller that does not answer within
    STATUS_TIMEOUT_S, is a 503 no_replica with Retry-After."""
    from audio8_coreai.server import ray_replicas

    info = {"sample_rate": 44100, "fingerprint": "f", "model": "m", "backend": "torch", "device": "cpu", "workers": 1}
    synth = RaySynthesizer(None, VoiceStore(tmp_path), SETTINGS.max_queue, info, app="audio8")
    running = {"n": 2}
    asked = []

    def replicas(app, deployment):
        asked.append((app, deployment))
        if running["n"] is None:
            time.sleep(ray_replicas.STATUS_TIMEOUT_S + 1)
        return running["n"]

    monkeypatch.setattr(ray_replicas, "running_replicas", replicas)
    with serve_in_thread(create_app(synth, SETTINGS)) as url:
        ok = httpx.get(f"{url}/health", timeout=30)
        assert ok.status_code == 200 and ok.json()["replicas"] == 2 and asked == [("audio8", "Synth")]
        for n, said in ((0, "no replica is running"), (None, "Ray's controller did not answer")):
            running["n"] = n
            t0 = time.perf_counter()
            r = httpx.get(f"{url}/health", timeout=30)
            assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
            assert r.json()["error"]["code"] == "no_replica" and said in r.json()["error"]["message"]
            assert time.perf_counter() - t0 < ray_replicas.STATUS_TIMEOUT_S + 0.5


def test_a_replaced_voice_gets_a_new_key_and_errors_cross_processes_whole(tiny_tts, tmp_path):
    def voice(seconds: float, transcript: str):
        clip = clips.write(tmp_path / f"{seconds}.wav", clips.sweep(22050, seconds), 22050)
        return tiny_tts.voice_from_clip(clip, transcript, name="ana")

    first = voice(1.0, "One.")
    assert voice_key(first) == voice_key(voice(1.0, "One.")) and voice_key(first).startswith("ana@")
    for replaced in (voice(1.5, "One."), voice(1.0, "Two.")):  # other codes, another transcript: another key
        assert voice_key(replaced) != voice_key(first)
    e = pickle.loads(pickle.dumps(ApiError(503, "busy", None, "queue_full", {"Retry-After": "2"})))
    assert (e.status, e.message, e.code, e.headers) == (503, "busy", "queue_full", {"Retry-After": "2"})


# ------------------------------------------------------------------------------------------------------------
# A local Ray cluster: 2 Synth replicas behind Ray's HTTP proxy


@pytest.fixture(scope="module")
def cluster(never_eos_long_checkpoint, voices):
    """Ray (8 CPUs declared: with 2 the actors never start) serving 2 Synth replicas of one row each of the
    checkpoint that never draws eos and a queue of 1; yields the proxy's URL and shuts Ray down. A replica gets this
    process's thread count as its CPUs (Ray sets its OMP_NUM_THREADS from them): float sums split alike, so the
    bytes are the same as here."""
    import ray
    import torch

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        threads = torch.get_num_threads()
        cluster = RaySettings(model=str(never_eos_long_checkpoint), voices=str(voices), replicas=2, cpus=threads)
        serve.run(application(cluster, SETTINGS.model_copy(update={"batch": 1})), name="audio8", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_a_ray_cluster_serves_the_same_api(cluster, never_eos_long_checkpoint, voices, tmp_path):
    import ray

    url = cluster
    # The same request and seed: the same bytes as `audio8 serve --batch 1`.
    whole = speech(url, response_format="wav")
    assert whole.status_code == 200, whole.text
    # One x-request-id, written by Ray's proxy (the client's own when sent); the app reads it for its logs.
    assert len(whole.headers.get_list("x-request-id")) == 1  # it came twice
    health = httpx.get(f"{url}/health", headers={"x-request-id": "trace 7"})
    assert health.headers.get_list("x-request-id") == ["trace 7"]
    assert health.json()["replicas"] == 2  # Ray's controller asked: the Synth replicas running
    with plain_server(never_eos_long_checkpoint, voices, batch=1) as plain:
        assert speech(plain, response_format="wav").content == whole.content
    # The ingress counts requests, and the speech its replicas made as each stream ends.
    metrics = httpx.get(f"{url}/metrics").text
    assert 'audio8_requests_total{status="200"} 1.0' in metrics and "audio8_in_flight 0.0" in metrics
    assert counters(url)["audio8_frames_total"] == 12 and "queue_depth" not in metrics
    # A client's error is answered as the app answers it, and not logged by the replica as a failed request.
    refused = speech(url, max_frames=600, response_format="wav")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_request"
    logs = Path(ray._private.worker._global_node.get_logs_dir_path()) / "serve"
    synth_log = "".join(p.read_text() for p in logs.glob("replica_*Synth*.log"))
    assert "CALL speak" in synth_log and "Traceback" not in synth_log and "Request failed" not in synth_log
    # A voice added through one request is usable by the next, and its requests stay on one replica.
    assert add_voice(url, "bo", 1.0, tmp_path).status_code == 201
    replicas = {speech(url, voice="bo", response_format="wav").headers["x-replica"] for _ in range(3)}
    assert len(replicas) == 1 and replicas != {"local"}
    # A stream's first bytes come well before its last.
    body = {"input": TEXT, "seed": 4, "max_frames": 60, "stream": True, "response_format": "pcm", "sample_rate": 44100}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=120) as r:
        arrivals = [(time.perf_counter() - t0, len(c)) for c in r.iter_raw() if c]
    assert sum(n for _, n in arrivals) == 60 * 2048 * 2 and arrivals[0][0] < 0.5 * arrivals[-1][0]
    frame_s = arrivals[-1][0] / 60
    # Full: 2 streams running (one per replica) and 1 waiting; the next is a 503, and leaving frees the slots.
    long = {**body, "max_frames": 390}  # no eos is ever drawn here: 390 frames of work each
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=120) as client:
        with ExitStack() as streams:
            chunks = [  # kept: a dropped iterator closes its connection
                streams.enter_context(client.stream("POST", f"{url}/v1/audio/speech", json=long)).iter_raw()
                for _ in range(2)
            ]
            assert all(next(c) for c in chunks)  # both running: their first audio came
            waiting = pool.submit(speech, url, response_format="wav")
            time.sleep(2.0)  # it reaches Ray's queue
            busy = speech(url, response_format="wav")
            assert busy.status_code == 503 and not waiting.done()
            assert busy.json()["error"]["code"] == "queue_full" and int(busy.headers["retry-after"]) >= 1
            t_asked = time.perf_counter()  # /health is the ingress's: it waited behind a replica's whole stream
            health = httpx.get(f"{url}/health", timeout=120)
            assert time.perf_counter() - t_asked < 100 * frame_s and health.status_code == 200
            assert health.json()["running"] == 2 and health.json()["queued"] is None
            t_left = time.perf_counter()
        assert waiting.result().status_code == 200
        assert time.perf_counter() - t_left < 200 * frame_s  # long before the rest of the 390 frames nobody reads
