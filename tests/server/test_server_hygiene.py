"""What serving leaves alone and keeps to itself: the host process's warning filters, and the server's paths
(no answer names the checkpoint's or the Core AI assets' folder)."""

from __future__ import annotations

import gc
import io
import sys
import warnings

import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from audio8_coreai import UnsupportedLanguageWarning
from audio8_coreai.audio import SpeechEncoder
from audio8_coreai.server.app import create_app
from tests import clips

RUSSIAN = "Привет, как дела?"
SPEECH = {"model": "audio8", "seed": 1, "max_frames": 2, "response_format": "wav"}


def wav_file(audio, rate: int) -> tuple[str, bytes, str]:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV")
    return ("clip.wav", buf.getvalue(), "audio/wav")


def test_create_app_leaves_the_warning_filters_alone(tiny_tts):
    before = list(warnings.filters)
    app = create_app([tiny_tts])
    assert warnings.filters == before
    with warnings.catch_warnings(record=True) as caught:  # the workers' threads too: showwarning is global
        warnings.simplefilter("always")
        with TestClient(app) as client:
            r = client.post("/v1/audio/speech", json={**SPEECH, "input": RUSSIAN})
    assert r.status_code == 200 and "Cyrillic" in r.headers["X-Audio8-Warning"]
    assert [w for w in caught if issubclass(w.category, UnsupportedLanguageWarning)] == []  # said in the header
    assert warnings.filters == before
    with pytest.warns(UnsupportedLanguageWarning, match="Cyrillic"):  # the API in this process still warns
        tiny_tts.stream(RUSSIAN, seed=1, max_frames=2)


@pytest.fixture(scope="module")
def coreai_server(tiny_checkpoint, tmp_path_factory):
    """A server on Core AI assets of the tiny checkpoint without a codec encoder (a folder that speaks in stored
    voices only), with its voices in a folder of its own; yields (client, tts, folders)."""
    pytest.importorskip("coreai.runtime", reason="the coreai extra is not installed (pip install -e '.[coreai]')")
    from audio8_coreai import TTS
    from audio8_coreai.backends.coreai import convert

    root = tmp_path_factory.mktemp("hygiene")
    parts = {"parts": ("dualar", "codec_decoder"), "decoder_frames": 4}
    assets = convert(tiny_checkpoint, root / "assets", "fp32", context=256, **parts, progress=False)
    voices = root / "voices"
    tts = TTS.load(tiny_checkpoint, backend="coreai", assets=assets, voices_dir=voices)
    with TestClient(create_app([tts]), raise_server_exceptions=False) as client:
        yield client, tts, (str(tiny_checkpoint), str(assets), str(voices), str(root))


def test_no_answer_names_a_server_folder(coreai_server):
    """/health, the model lists, the voice list and page, speech, and the error a new voice meets without the
    codec encoder: none carries a server path."""
    client, _, folders = coreai_server
    clip = (clips.sweep(44100, 0.6), 44100)
    answers = {
        "health": client.get("/health"),
        "models": client.get("/v1/models"),
        "audio models": client.get("/v1/audio/models"),
        "voices": client.get("/v1/voices"),
        "page": client.get("/"),
        "metrics": client.get("/metrics"),
        "new voice": client.post(
            "/v1/voices", data={"name": "ann", "transcript": "Hi."}, files={"audio": wav_file(*clip)}
        ),
        "speech": client.post("/v1/audio/speech", json={**SPEECH, "input": "Hello there."}),
        "unknown voice": client.post("/v1/audio/speech", json={**SPEECH, "input": "Hi.", "voice": "nobody"}),
        "delete": client.delete("/v1/voices/nobody"),
    }
    assert answers["health"].status_code == 200 and answers["health"].json()["backend"].startswith("coreai fp32")
    assert answers["new voice"].status_code == 500  # no codec encoder in the assets: the operator's fault
    assert answers["speech"].status_code == 200
    for what, r in answers.items():
        for folder in folders:
            assert folder not in r.text, f"{what} ({r.status_code}) names {folder}: {r.text[:300]}"
        assert "Traceback" not in r.text, what


def test_no_wyoming_error_names_a_server_folder(coreai_server, monkeypatch):
    """An asset fault met while speaking (the codec decoder's program, say, gone after load) is said without it."""
    from wyoming.error import Error
    from wyoming.tts import Synthesize

    from audio8_coreai.errors import AssetError
    from tests.server.wyoming_support import talk

    _, tts, folders = coreai_server

    def gone():
        raise AssetError(f"{folders[1]}/codec_decoder.aimodel: no main.mlirb; convert the checkpoint again")

    monkeypatch.setattr(tts.backend, "codec_stream", gone)
    ((answer, *_),) = talk(tts, [Synthesize(text="Hello there.").event(), None])
    error = Error.from_event(answer)
    assert error.code == "server_error" and "operator" in error.text  # a part of the assets is missing
    assert not [folder for folder in folders if folder in error.text], error.text


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "wav"])
def test_a_stream_left_unfinished_is_discarded_without_noise(fmt):
    """A client that leaves mid-stream: the server discards its encoder, which the garbage collector then frees
    without libsndfile writing into a closed sink ("Exception ignored ... I/O operation on closed file")."""
    caught = []
    hook, sys.unraisablehook = sys.unraisablehook, caught.append
    try:
        encoder = SpeechEncoder(fmt, 44100)
        assert encoder.write(clips.sweep(44100, 0.2)) is not None
        encoder.discard()
        encoder.cycle = encoder  # freed by the collector, in whatever order, as an abandoned response body is
        del encoder
        gc.collect()
    finally:
        sys.unraisablehook = hook
    assert [str(u.exc_value) for u in caught] == []
