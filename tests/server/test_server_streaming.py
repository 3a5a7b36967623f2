"""`audio8 serve` streams every answer as it is made by default, as OpenAI's does: the first bytes go out while the
rest is being made, `stream: false` (and flac) answer the whole file with its lengths, a failure before the first
byte is a JSON error and one after it cuts the stream (a real uvicorn on 127.0.0.1; the model's stream is a gated
stand-in, so what has been made when the client reads is known, not timed)."""

from __future__ import annotations

import io
import threading

import httpx
import numpy as np
import pytest
import soundfile as sf

from audio8_coreai import TTS
from audio8_coreai.audio import MEDIA_TYPES, STREAMABLE_FORMATS, SpeechEncoder
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings
from tests.server.http_support import decode, metric

FRAMES = 4
HOP = 2048  # samples per frame at 44.1 kHz


def tone(step: int) -> np.ndarray:
    """Frame ``step`` of the stand-in's audio: float32 [HOP]."""
    return (0.3 * np.sin(np.arange(step * HOP, (step + 1) * HOP) / 7)).astype(np.float32)


class Gate:
    """What the stand-in streams of a test do: make frame 0, then wait for ``go`` before frame 1; raise RuntimeError
    instead of making frame ``fail_at`` (None: never)."""

    def __init__(self, fail_at: int | None = None):
        self.go, self.fail_at, self.made = threading.Event(), fail_at, 0


class Gated:
    """A stand-in for a SpeechStream: FRAMES chunks of one frame each (a tone), calling ``on_frame`` before each, as
    ``gate`` says."""

    prefill_s = frames_s = codec_s = 0.0
    first_audio_s = None
    capped: list[int] = []  # every piece ended by the model
    frames, duration_s = FRAMES, FRAMES * HOP / 44100

    def __init__(self, on_frame, gate: Gate):
        self.on_frame, self.gate = on_frame, gate

    def __iter__(self):
        for step in range(FRAMES):
            if step == 1:
                assert self.gate.go.wait(60), "the client had no bytes while the synthesis waited"
            if step == self.gate.fail_at:
                raise RuntimeError("the codec broke")
            self.on_frame(step)
            self.gate.made = step + 1
            yield tone(step)


@pytest.fixture(scope="module")
def served(tiny_checkpoint, tmp_path_factory):
    """A server of one instance whose streams are :class:`Gated` by the test's gate (``served[1]``, replaced per
    test); yields (base URL, gates)."""
    instance = TTS.load(tiny_checkpoint, device="cpu", voices_dir=tmp_path_factory.mktemp("voices"))
    gates = [Gate()]
    instance.stream = lambda *args, on_frame, **kwargs: Gated(on_frame, gates[-1])
    with serve_in_thread(create_app([instance], ServerSettings(workers=1, max_queue=2))) as url:
        yield url, gates


@pytest.fixture
def gate(served) -> Gate:
    gates = served[1]
    gates.append(Gate())
    yield gates[-1]
    gates[-1].go.set()  # nothing left waiting


def post(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json={"input": "Hello there.", **body}, timeout=60)


@pytest.mark.parametrize("fmt", STREAMABLE_FORMATS)
def test_a_default_request_gets_its_first_bytes_while_the_rest_is_made(served, gate, fmt):
    """No ``stream`` in the body: the status line and the first bytes come while the synthesis waits before its
    second frame (had the server waited for the end, the stand-in would fail on its gate); the bytes joined are
    the whole utterance."""
    url, _ = served
    body = {"input": "Hello there.", "response_format": fmt}
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"] == MEDIA_TYPES[fmt]
        assert r.headers["transfer-encoding"] == "chunked" and "content-length" not in r.headers
        chunks = r.iter_raw()
        first = next(chunks)
        assert first and gate.made == 1 and not gate.go.is_set()
        gate.go.set()
        data = first + b"".join(chunks)
    assert gate.made == FRAMES
    audio, rate = decode(data, fmt)
    if fmt in ("wav", "pcm"):
        assert len(audio) == round(FRAMES * HOP * rate / 44100)
    else:  # encoders' priming and padding: a little more
        assert len(audio) >= FRAMES * HOP * rate / 44100 - 1


def test_stream_false_and_flac_answer_the_whole_file_with_its_lengths(served, gate):
    """``stream: false`` keeps the whole-file answer: Content-Length, a wav header with its true sizes (a streamed
    wav's say 'unknown', 0xFFFFFFFF); flac, whose streamed header could give no length, is whole by default and
    refused when a stream is asked for."""
    url, _ = served
    gate.go.set()
    whole = post(url, response_format="wav", stream=False)
    data = whole.content
    assert whole.status_code == 200 and int(whole.headers["content-length"]) == len(data)
    assert "transfer-encoding" not in whole.headers
    assert (
        int.from_bytes(data[4:8], "little") == len(data) - 8
        and int.from_bytes(data[40:44], "little") == 2 * FRAMES * HOP
    )
    streamed = post(url, response_format="wav").content
    assert streamed[4:8] == streamed[40:44] == b"\xff" * 4 and streamed[44:] == data[44:]
    flac = post(url, response_format="flac")
    assert flac.status_code == 200 and int(flac.headers["content-length"]) == len(flac.content)
    assert sf.info(io.BytesIO(flac.content)).frames == FRAMES * HOP
    refused = post(url, response_format="flac", stream=True)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unsupported_format"


def test_a_failure_before_the_first_byte_is_a_json_error_with_its_status(served):
    url, gates = served
    gates.append(Gate(fail_at=0))
    r = post(url, response_format="pcm")
    error = r.json()["error"]
    assert r.status_code == 500 and error["code"] == "server_error" and "RuntimeError" in error["message"]
    assert r.headers["content-type"] == "application/json"


def test_a_failure_after_the_first_byte_cuts_the_stream_and_is_counted(served):
    """The status line has gone: the stream is cut (no last chunk, the connection reset: the client sees it cut,
    not a short file that looks whole), logged and counted 500 stream_cut; the worker serves on."""
    url, gates = served
    gates.append(gate := Gate(fail_at=2))
    cut_before = metric(url, 'audio8_errors_total{code="stream_cut"}')
    received = b""
    with pytest.raises(httpx.ReadError, match="Connection reset"):
        with httpx.stream("POST", f"{url}/v1/audio/speech", json={"input": "Hi.", "response_format": "pcm"}) as r:
            assert r.status_code == 200
            for data in r.iter_raw():
                received += data
                gate.go.set()
    encoder = SpeechEncoder("pcm", 44100, 24000)  # what the two frames made were sent as: pcm at 24 kHz
    assert gate.made == 2 and received == encoder.write(tone(0)) + encoder.write(tone(1))
    assert metric(url, 'audio8_errors_total{code="stream_cut"}') == cut_before + 1
    gates.append(Gate())
    gates[-1].go.set()
    assert post(url, response_format="pcm").status_code == 200
