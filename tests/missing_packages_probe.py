"""Run by test_optional_packages.py in a Python where av, pedalboard, sse_starlette and opentelemetry cannot be
imported (its sitecustomize): ``python missing_packages_probe.py CHECKPOINT FOLDER`` speaks through the API, the
CLI and the server and prints what each gave as one JSON object (the tests assert on it).

opentelemetry is fastapi's own dependency (fastapi imports it at its top), so the server part lets it back in:
the server needs it, as it needs fastapi; it never needs the other three."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import soundfile as sf

import audio8_coreai
from audio8_coreai import TTS, Audio8Error
from audio8_coreai.audio import SpeechEncoder, StreamStretcher, encode_speech, time_stretch, write_audio

TEXT = "Hello there, this is a test."
checkpoint, folder = Path(sys.argv[1]), Path(sys.argv[2])
got: dict = {"package": audio8_coreai.__name__, "missing": sorted(m for m, v in sys.modules.items() if v is None)}


def refusal(call, *args) -> str:
    """The message of the Audio8Error ``call(*args)`` raises ('' when it raises none)."""
    try:
        call(*args)
    except Audio8Error as e:
        return f"{type(e).__name__}: {e}"
    return ""


tts = TTS.load(checkpoint, device="cpu", codec_process=False)
audio, rate = tts.synthesize(TEXT, seed=1, max_frames=12)
result = tts.generate(TEXT, seed=1, max_frames=12)
got["synthesize"] = {"samples": int(audio.size), "rate": rate, "peak": float(abs(audio).max())}
got["generate"] = {"samples": int(result.audio.size), "codes": list(result.codes.shape)}
wav = write_audio(folder / "api.wav", audio, rate)
got["wav"] = {"samples": sf.info(wav).frames, "rate": sf.info(wav).samplerate}
got["bodies"] = {fmt: len(encode_speech(audio, rate, fmt)) for fmt in ("wav", "pcm", "flac", "mp3")}
got["speed_1"] = bool((time_stretch(audio, rate, 1.0) == audio).all())
got["api_refusals"] = {
    "encode aac": refusal(encode_speech, audio, rate, "aac"),
    "stream aac": refusal(SpeechEncoder, "aac", rate),
    "time_stretch": refusal(time_stretch, audio, rate, 1.5),
    "StreamStretcher": refusal(StreamStretcher, rate, 0.5),
}

from typer.testing import CliRunner  # noqa: E402

from audio8_coreai.cli import app as cli  # noqa: E402

got["cli"] = {}
for suffix in ("wav", "flac"):
    out = folder / f"cli.{suffix}"
    args = ["say", TEXT, "-o", str(out), "--model", str(checkpoint), "--seed", "1", "--max-frames", "12"]
    ran = CliRunner().invoke(cli, [*args, "--device", "cpu"])
    got["cli"][suffix] = {"exit": ran.exit_code, "output": ran.output, "samples": sf.info(out).frames}

del sys.modules["opentelemetry"]  # fastapi's own dependency: see the module's docstring
from fastapi.testclient import TestClient  # noqa: E402

from audio8_coreai.server import create_app  # noqa: E402
from audio8_coreai.settings import ServerSettings  # noqa: E402

asked = {
    "wav": {"response_format": "wav"},
    "mp3": {"response_format": "mp3"},
    "pcm": {"response_format": "pcm", "speed": 1.0},
    "aac": {"response_format": "aac"},
    "speed": {"response_format": "wav", "speed": 1.5},
    "sse": {"response_format": "pcm", "stream_format": "sse"},
}
got["http"] = {}
with TestClient(create_app([tts], ServerSettings(workers=1, max_frames=12)), raise_server_exceptions=False) as http:
    for name, fields in asked.items():
        r = http.post("/v1/audio/speech", json={"model": "tts-1", "input": TEXT, "seed": 1, **fields})
        body = r.json() if r.headers["content-type"] == "application/json" else {"bytes": len(r.content)}
        got["http"][name] = {"status": r.status_code, "head": r.content[:4].decode("latin-1"), **body}
got["still_missing"] = sorted(m for m, v in sys.modules.items() if v is None)
print(json.dumps(got))
