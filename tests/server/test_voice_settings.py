"""The server's voice settings: ``--sample-rate``, ``--voice-map``, ``--default-voice`` (checked at start, guarded
while it runs, and said when a server sharing the voice folder took the voice away)."""

from __future__ import annotations

import io
import logging

import httpx
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from audio8_coreai import TTS
from audio8_coreai.errors import ConfigError, VoiceError
from audio8_coreai.server import create_app
from audio8_coreai.server.voicenames import parse_voice_map
from audio8_coreai.settings import ServerSettings
from audio8_coreai.voices import VoiceStore
from tests import clips
from tests.server.test_openai import EXTRAS, TEXT


def test_server_sample_rate_and_default_voice(tiny_checkpoint, voices_dir):
    """serve --sample-rate sets every body's rate but opus's (a request may ask another); --default-voice speaks
    requests that name no voice, and an unmapped OpenAI name, in that stored voice."""
    tts = TTS.load(tiny_checkpoint, device="cpu", voices_dir=voices_dir)
    settings = ServerSettings(workers=1, sample_rate=16000, default_voice="ana")
    with TestClient(create_app([tts], settings)) as http:

        def speak(**body) -> httpx.Response:
            return http.post("/v1/audio/speech", json={"input": TEXT, "seed": 2, **EXTRAS, **body})

        wav = speak(response_format="wav")
        assert sf.info(io.BytesIO(wav.content)).samplerate == 16000 and wav.headers["x-sample-rate"] == "16000"
        assert speak(response_format="pcm", sample_rate=22050).headers["x-sample-rate"] == "22050"
        assert speak(response_format="opus").headers["x-sample-rate"] == "48000"  # the server's rate is not opus's
        assert (
            wav.content
            == speak(response_format="wav", voice="ana").content
            == speak(response_format="wav", voice="alloy").content
        )
        assert http.get("/v1/audio/voices").json()["voices"][0] == {"id": "default", "name": "default (ana)"}
        health = http.get("/health").json()  # the model's rate, and the bodies' (it said 44100 alone)
        assert (health["sample_rate"], health["output_sample_rate"]) == (44100, 16000)


def test_the_voice_map_wins_over_a_stored_voice_of_its_name(tiny_checkpoint, voices_dir, tmp_path):
    """An operator's ``--voice-map alloy=ana`` speaks ana for alloy even where a voice named Alloy is stored (a
    client could otherwise take the name over); registering a mapped name is refused; the picker lists it once."""
    import shutil

    from tests.server.wyoming_support import make_voice

    store = tmp_path / "voices"
    shutil.copytree(voices_dir, store)
    tts = TTS.load(tiny_checkpoint, device="cpu", voices_dir=store)
    tts.voices.save(make_voice("Alloy", tts.checkpoint.fingerprint()))

    def speak(http: TestClient, voice: str) -> bytes:
        r = http.post("/v1/audio/speech", json={"input": TEXT, "seed": 2, **EXTRAS, "voice": voice, "stream": False})
        assert r.status_code == 200, r.text
        return r.content

    with TestClient(create_app([tts], ServerSettings(workers=1))) as http:  # unmapped: the stored Alloy speaks
        assert speak(http, "alloy") != speak(http, "ana")
    with TestClient(create_app([tts], ServerSettings(workers=1, voice_map={"alloy": "ana"}))) as http:
        assert speak(http, "alloy") == speak(http, "ALLOY") == speak(http, "ana")
        clip = clips.write(tmp_path / "a.wav", clips.sweep(22050, 1.0), 22050).read_bytes()
        r = http.post("/v1/voices", data={"name": "alloy", "transcript": "Hi."}, files={"audio": ("a.wav", clip)})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_voice"
        assert "'alloy' speaks the stored voice 'ana' here (the server's --voice-map)" in r.json()["error"]["message"]
        ids = [v["id"] for v in http.get("/v1/audio/voices").json()["voices"]]
        assert ids == ["default", "ana", "alloy"]
        # nor through the map's target: replacing or deleting the voice the map speaks is refused
        form = {"name": "ANA", "transcript": "Hi.", "replace": "true"}
        r = http.post("/v1/voices", data=form, files={"audio": ("a.wav", clip)})
        assert r.status_code == 409 and r.json()["error"]["code"] == "voice_in_use"  # as a DELETE of it
        assert "'ANA' is the server's --voice-map alloy=ana" in r.json()["error"]["message"]
        r = http.delete("/v1/voices/ana")
        assert r.status_code == 409 and r.json()["error"]["code"] == "voice_in_use"
        assert speak(http, "alloy") == speak(http, "ana")


def test_unknown_voice_map_targets_are_refused_at_start(tiny_checkpoint, voices_dir):
    tts = TTS.load(tiny_checkpoint, device="cpu", voices_dir=voices_dir)
    with pytest.raises(VoiceError, match=r"--voice-map alloy=bob: no voice named 'bob'"):
        create_app([tts], ServerSettings(voice_map={"alloy": "bob"}))
    with pytest.raises(VoiceError, match=r"--default-voice carl: no voice named 'carl'"):
        create_app([tts], ServerSettings(default_voice="carl"))
    assert parse_voice_map("alloy=ana, Echo=bob") == {"alloy": "ana", "echo": "bob"}
    for bad in ("alloy", "alloy=../x", "=ana"):
        with pytest.raises(ConfigError, match="--voice-map"):
            parse_voice_map(bad)
    with pytest.raises(ConfigError, match="--voice-map 'ALLOY=dc': 'ALLOY' is mapped twice"):  # the last won, unsaid
        parse_voice_map("alloy=ana,ALLOY=dc")
    from typer.testing import CliRunner

    from audio8_coreai.cli import app

    said = CliRunner().invoke(app, ["serve", "--model", str(tiny_checkpoint), "--default-voice", ""]).output
    assert said.startswith("error: --default-voice: bad voice name '': it is empty")  # the option named, as the map's


def test_a_mapped_voice_deleted_by_another_server_is_the_servers_error(tiny_checkpoint, voices_dir, tmp_path, caplog):
    """Two servers share a voice folder: one deletes the voice the other's --voice-map and --default-voice speak.
    The other answers its requests with a 500 that names its setting (logged), not a client's 400 "voice None"."""
    shared = tmp_path / "voices"
    shared.mkdir()
    (shared / "ana.npz").write_bytes((voices_dir / "ana.npz").read_bytes())
    tts = TTS.load(tiny_checkpoint, device="cpu", voices_dir=shared)
    settings = ServerSettings(workers=1, voice_map={"alloy": "ana"}, default_voice="ana")
    with TestClient(create_app([tts], settings)) as http:
        VoiceStore(shared).remove("ana")  # through the other server
        for voice, setting in ((None, "--default-voice ana"), ("alloy", "--voice-map alloy=ana")):
            with caplog.at_level(logging.WARNING, "audio8_coreai.server"):
                r = http.post("/v1/audio/speech", json={"input": TEXT, "voice": voice, **EXTRAS})
            error = r.json()["error"]
            assert r.status_code == 500 and error["code"] == "mapped_voice_missing" and error["param"] == "voice"
            assert (
                f"this server's {setting} names the stored voice 'ana', which is no longer stored" in error["message"]
            )
            assert str(shared) not in r.text and f"{setting} names the stored voice 'ana'" in caplog.text
