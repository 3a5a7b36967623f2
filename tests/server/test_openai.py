"""The clients people point at a local TTS server, each with its own request shape: the OpenAI SDK (current API),
Pipecat 1.14, LiveKit Agents (livekit-plugins-openai 1.8) and Open WebUI 0.12, replayed as they send and read (the
README's "Use it from..."), against a real uvicorn on 127.0.0.1 (tiny checkpoint, a few frames)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import soxr
from openai._streaming import SSEDecoder

from audio8_coreai import TTS
from audio8_coreai.audio import StreamStretcher, time_stretch
from audio8_coreai.server import create_app, serve_in_thread
from audio8_coreai.settings import ServerSettings

TEXT = "The meeting has been moved to Thursday afternoon."
FRAMES = 12
EXTRAS = {"max_frames": FRAMES}  # every request: at most 12 frames of the tiny model
FRESH_ID = re.compile(r"req_[0-9a-f]{32}")  # the server's own x-request-id
SETTINGS = ServerSettings(workers=1, max_queue=4, max_frames=40, chunk_frames=4, voice_map={"echo": "ana"})


@pytest.fixture(scope="module")
def base(tiny_checkpoint, voices_dir):
    instances = [TTS.load(tiny_checkpoint, device="cpu", voices_dir=voices_dir)]
    with serve_in_thread(create_app(instances, SETTINGS)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused")


def post(base: str, **body) -> httpx.Response:
    r = httpx.post(f"{base}/v1/audio/speech", json={"input": TEXT, **EXTRAS, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, "<i2").astype(np.float32) / 32767


def centroid(audio: np.ndarray, rate: int) -> float:
    """The power spectrum's centroid (Hz)."""
    power = np.abs(np.fft.rfft(audio)) ** 2
    return float((power * np.fft.rfftfreq(len(audio), 1 / rate)).sum() / power.sum())


# ------------------------------------------------------------------------------------------------------------
# The OpenAI SDK


def test_sdk_default_call_streams_mp3_and_stream_false_sends_the_whole_file(client):
    """The SDK's plain call gets mp3 sent as it is made (chunked: no length is known when it starts, as OpenAI's);
    ``stream: false`` the whole file, its length in Content-Length and in LAME's gapless tag. The streamed mp3 has
    the same audio with up to two mp3 frames more at its end (its tag cannot give the length: docs/server.md)."""
    streamed = client.audio.speech.with_raw_response.create(
        model="tts-1-hd", voice="alloy", input=TEXT, extra_body=EXTRAS
    )
    whole = client.audio.speech.with_raw_response.create(
        model="tts-1-hd", voice="alloy", input=TEXT, extra_body={**EXTRAS, "stream": False}
    )
    assert streamed.headers["transfer-encoding"] == "chunked" and "content-length" not in streamed.headers
    assert int(whole.headers["content-length"]) == len(whole.content) and "transfer-encoding" not in whole.headers
    for r in (streamed, whole):
        assert r.headers["content-type"] == "audio/mpeg" and r.headers["x-model"] == "tts-1-hd"
        assert r.headers["x-sample-rate"] == "44100"
    audio, rate = sf.read(io.BytesIO(whole.content), dtype="float32")
    # at most 12 frames of 2048 samples; LAME's gapless tag gives the length back to within one mp3 frame
    frames = round(len(audio) / 2048)
    assert rate == 44100 and 1 <= frames <= FRAMES and abs(len(audio) - frames * 2048) <= 1152
    played, rate = sf.read(io.BytesIO(streamed.content), dtype="float32")
    assert rate == 44100 and 0 <= len(played) - len(audio) <= 2 * 1152


def test_the_readme_sdk_example_streams_to_a_file(client, tmp_path):
    """The README's call, as the SDK's current API writes a file: the streaming response, its request id."""
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="wav", extra_body={"seed": 1, **EXTRAS}
    ) as response:
        response.stream_to_file(tmp_path / "hello.wav")
        assert FRESH_ID.fullmatch(response.request_id) and response.headers["x-seed"] == "1"
    audio, rate = sf.read(tmp_path / "hello.wav", dtype="float32")
    assert rate == 44100 and len(audio) == FRAMES * 2048


def test_requests_without_voice_or_seed_get_one_steady_voice(base):
    """The model's own voice is drawn with the fixed seed DEFAULTS.server.default_voice_seed (0) when a request gives
    none: the same text gives the same bytes, under no voice, 'default' or an unmapped OpenAI name."""
    first = post(base, response_format="wav")
    assert first.headers["x-seed"] == "0"
    assert post(base, response_format="wav").content == first.content
    assert post(base, response_format="wav", voice="default").content == first.content
    assert post(base, response_format="wav", voice="nova").content == first.content
    assert post(base, response_format="wav", seed=5).content != first.content


def test_sdk_speed_stretches_the_audio(client):
    """speed 1.25 (whole: the streamed stretch is test_time_stretch_keeps_pitch's) is the speed-1 audio
    time-stretched by Rubber Band: round(N / 1.25) samples, the library's
    stretch of the 16-bit speed-1 body to within 1% RMS (the server stretches the float audio; the 16-bit
    rounding of that input, 1.5e-5, moves a few of Rubber Band's transient decisions, by up to 0.03 there, so
    no sample-wise bound holds). Pitch is kept: see test_time_stretch_keeps_pitch."""

    def speak(speed: float) -> np.ndarray:
        out = client.audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="pcm", speed=speed,
            extra_body={**EXTRAS, "sample_rate": 44100, "stream": False},
        )  # fmt: skip
        return pcm(out.content)

    normal, fast = speak(1.0), speak(1.25)
    assert len(normal) > 0 and len(fast) == round(len(normal) / 1.25)
    error = fast - time_stretch(normal, 44100, 1.25)
    assert float(np.sqrt(np.mean(error**2) / np.mean(fast**2))) < 0.01
    slow = speak(0.5)
    assert len(slow) == 2 * len(normal)


def test_sdk_sse_events_carry_the_same_samples(client, base):
    """stream_format sse: OpenAI's events, parsed by the SDK's own SSE decoder; the deltas joined are the
    bytes of the plain pcm body (both 24 kHz: soxr's streaming resampler equals its one-shot), and the done
    event's usage counts the frames made."""
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format="pcm", stream_format="sse",
        extra_body=EXTRAS,
    ) as response:  # fmt: skip
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(e.data) for e in SSEDecoder().iter_bytes(response.iter_bytes()) if e.data]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) > 2
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert streamed == post(base, response_format="pcm").content
    frames = len(pcm(post(base, response_format="pcm", sample_rate=44100).content)) // 2048
    done = events[-1]
    assert done["type"] == "speech.audio.done" and done["usage"]["output_tokens"] == frames
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + frames


def test_sdk_voice_object_names_a_stored_voice(client, base):
    def speak(voice) -> bytes:
        return client.audio.speech.create(
            model="tts-1", voice=voice, input=TEXT, response_format="wav", extra_body={**EXTRAS, "seed": 3}
        ).content

    by_object = speak({"id": "ana"})
    assert by_object == speak("ana") and by_object != speak("alloy")
    assert speak("echo") == by_object  # --voice-map echo=ana


def test_sdk_aac_decodes(client):
    out = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="aac", extra_body=EXTRAS)
    with av.open(io.BytesIO(out.content)) as f:
        assert f.format.name == "aac" and f.streams.audio[0].rate == 44100
        audio = np.concatenate([frame.to_ndarray()[0] for frame in f.decode(audio=0)])
    # at most 12 frames of 2048 samples, plus the encoder's priming and last-frame padding (2 AAC frames of 1024)
    assert 2048 <= len(audio) <= FRAMES * 2048 + 2048


def test_sdk_streams_aac(client):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="aac", extra_body={**EXTRAS, "stream": True}
    ) as response:
        data = response.read()
    with av.open(io.BytesIO(data)) as f:
        assert sum(frame.samples for frame in f.decode(audio=0)) >= 2048


# ------------------------------------------------------------------------------------------------------------
# Pipecat, LiveKit, Open WebUI


async def pipecat_run_tts(base: str, text: str, voice: str = "alloy") -> tuple[dict, list[bytes]]:
    """What Pipecat 1.14's ``OpenAITTSService(base_url=..., settings=OpenAITTSService.Settings(model="tts-1",
    voice=voice))`` does for one sentence (its ``run_tts``): pcm through the SDK's streaming response, read in
    chunks of half a second at 24 kHz; returns the response's headers and the chunks."""
    client = openai.AsyncOpenAI(api_key="unused", base_url=f"{base}/v1")
    create_params = {"input": text, "model": "tts-1", "voice": voice, "response_format": "pcm"}
    async with client.audio.speech.with_streaming_response.create(**create_params) as r:
        assert r.status_code == 200
        return dict(r.headers), [chunk async for chunk in r.iter_bytes(int(24000 * 0.5 * 2)) if chunk]


def test_pipecat_pcm_is_24_khz_soxr_of_the_model_output(base):
    """Pipecat's OpenAITTSService: pcm, no sample rate, the body streamed (chunked: it plays the first chunk as it
    comes and gives up on a sentence with no audio after 3 s), played as 24 kHz. Its samples are the 44.1 kHz
    output resampled by soxr (very high quality): compared with soxr applied here to the 16-bit 44.1 kHz body,
    within 3 LSB (both sides round to 16 bits; soxr's gain is at most about 1)."""
    headers, chunks = asyncio.run(pipecat_run_tts(base, TEXT))
    assert headers["x-sample-rate"] == "24000" and headers["transfer-encoding"] == "chunked"
    assert FRESH_ID.fullmatch(headers["x-request-id"])
    got = pcm(b"".join(chunks))
    native = pcm(post(base, response_format="pcm", sample_rate=44100, max_frames=None).content)
    expected = soxr.resample(native, 44100, 24000, quality="VHQ")
    assert len(got) == len(expected) == round(len(native) * 24000 / 44100) and len(got) > 0
    assert float(np.abs(got - expected).max()) <= 3 / 32767


async def livekit_synthesize(base: str, text: str, model: str, instructions: str | None = None) -> tuple[str, bytes]:
    """What LiveKit Agents' ``openai.TTS(base_url=..., model=model, voice="alloy")`` (livekit-plugins-openai 1.8)
    does for one text (its ``ChunkedStream._run``): mp3, speed 1.0 always sent, instructions when set, events
    (``stream_format`` sse) unless the model is tts-1 or tts-1-hd; the body read as the Content-Type says (audio
    bytes, or the base64 of ``speech.audio.delta`` events). Returns the request id it reports and the mp3 bytes."""
    client = openai.AsyncOpenAI(max_retries=0, api_key="unused", base_url=f"{base}/v1")
    call = client.audio.speech.with_streaming_response.create(
        input=text, model=model, voice="alloy", response_format="mp3", speed=1.0,
        instructions=instructions or openai.omit, stream_format="audio" if model in ("tts-1", "tts-1-hd") else "sse",
        timeout=30,
    )  # fmt: skip
    audio = b""
    async with call as stream:
        media_type = stream.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "text/event-stream":
            async for chunk in stream.iter_bytes():
                audio += chunk
        else:
            async for line in stream.iter_lines():
                if line.startswith("data: ") and (event := json.loads(line[6:]))["type"] == "speech.audio.delta":
                    audio += base64.b64decode(event.get("delta", "") or event.get("audio", ""))
        return stream.request_id or "", audio


def test_livekit_mp3_streamed_or_as_events_with_instructions_ignored(base):
    """LiveKit Agents' openai.TTS: with tts-1 the mp3 bytes as made, with another model the same mp3 in events;
    its instructions are ignored (same bytes as without) and each answer has the request id it logs (it warns
    without one)."""
    rid, audio = asyncio.run(livekit_synthesize(base, TEXT, "tts-1"))
    rid_events, events = asyncio.run(livekit_synthesize(base, TEXT, "gpt-4o-mini-tts", "Speak in a cheerful tone."))
    assert FRESH_ID.fullmatch(rid) and FRESH_ID.fullmatch(rid_events) and rid != rid_events
    assert audio == events == post(base, response_format="mp3", max_frames=None).content
    played, rate = sf.read(io.BytesIO(audio), dtype="float32")
    assert rate == 44100 and len(played) > 0


def open_webui_speech(base: str, voice: str, params: dict | None = None) -> httpx.Response:
    """The request Open WebUI's backend (0.12) sends for its OpenAI TTS engine, as aiohttp puts it on the wire: the
    browser's ``{"input", "voice"}`` with the configured model and the admin's "OpenAI params"
    (AUDIO_TTS_OPENAI_PARAMS) merged in, a bearer key, aiohttp's own headers; the whole answer is read (and cached
    as an .mp3 file)."""
    payload = {"input": TEXT, "voice": voice, "model": "tts-1", **(params or {})}
    headers = {
        "Host": httpx.URL(base).netloc.decode(),
        "Content-Type": "application/json",
        "Authorization": "Bearer unused",
        "Accept": "*/*",
        "Accept-Encoding": "gzip, deflate",
        "User-Agent": "Python/3.11 aiohttp/3.12.15",
    }
    return httpx.post(f"{base}/v1/audio/speech", content=json.dumps(payload).encode(), headers=headers, timeout=120)


def test_open_webui_gets_mp3_streamed_or_whole_as_its_params_say(base, tmp_path):
    streamed = open_webui_speech(base, "alloy")
    whole = open_webui_speech(base, "echo", {"stream": False, "seed": 1})  # echo: --voice-map echo=ana
    assert streamed.status_code == whole.status_code == 200
    assert streamed.headers["transfer-encoding"] == "chunked"
    assert int(whole.headers["content-length"]) == len(whole.content) and whole.headers["x-seed"] == "1"
    for r in (streamed, whole):
        cached = tmp_path / f"{r.headers['x-request-id']}.mp3"
        cached.write_bytes(r.content)
        audio, rate = sf.read(cached, dtype="float32")
        assert r.headers["content-type"] == "audio/mpeg" and rate == 44100 and len(audio) > 0
    assert whole.content == post(base, voice="ana", seed=1, stream=False, max_frames=None).content


def test_open_webui_lists_our_voices_and_models(base, client, voices_dir):
    broken = voices_dir / "broken.npz"
    broken.write_bytes(b"not a voice")  # damaged: left out of the picker (it offered a 500), told in /v1/voices
    try:
        voices = httpx.get(f"{base}/v1/audio/voices").json()["voices"]
        listed = httpx.get(f"{base}/v1/voices").json()["data"]
    finally:
        broken.unlink()
    assert voices == [
        {"id": "default", "name": "default (the model's own voice)"},
        {"id": "ana", "name": "ana"},
        {"id": "echo", "name": "echo (ana)"},
    ]
    assert [v["name"] for v in listed if "error" in v] == ["broken"]
    models = httpx.get(f"{base}/v1/audio/models").json()["models"]
    assert {"id": "tts-1"} in models and {"id": "audio8-tts"} in models
    listed = client.models.list()
    assert [m.id for m in listed.data] == [m["id"] for m in models]
    assert client.models.retrieve("tts-1").model_dump() == listed.data[1].model_dump()
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("whisper-1")
    assert missing.value.body["code"] == "model_not_found" and "this server lists audio8-tts, tts-1" in str(
        missing.value
    )
    assert all(m.object == "model" and m.owned_by == "audio8-coreai" and m.created > 0 for m in listed.data)


# ------------------------------------------------------------------------------------------------------------
# The time stretch itself


def voiced(rate: int, seconds: float) -> np.ndarray:
    """A voice-like test tone: 150 Hz and its first 20 harmonics falling 6 dB per octave, gliding +-10%
    at 2 Hz (float32 [N])."""
    t = np.arange(int(rate * seconds)) / rate
    phase = 2 * np.pi * 150 * (t + 0.1 / (2 * np.pi * 2) * np.sin(2 * np.pi * 2 * t))
    return (0.1 * sum(np.sin(k * phase) / k for k in range(1, 21))).astype(np.float32)


@pytest.mark.parametrize("speed", [0.5, 1.25, 3.0])
def test_time_stretch_keeps_pitch(speed):
    """Whole and streamed (chunks of 1, 2, 4 then 16 frames, as the server's): round(N / speed) samples, and the
    spectral centroid (about 340 Hz) within 5% of the input's (measured: within 2%), where resampling to that
    length would move it by the factor itself (25% at the smallest speed change here)."""
    rate, tone = 44100, voiced(44100, 2.0)
    whole = time_stretch(tone, rate, speed)
    stretcher, sizes, chunks, at = StreamStretcher(rate, speed), [2048, 4096, 8192], [], 0
    while at < len(tone):
        size = sizes[len(chunks)] if len(chunks) < len(sizes) else 32768
        chunks.append(stretcher.write(tone[at : at + size]))
        at += size
    streamed = np.concatenate([*chunks, stretcher.close()])
    for out in (whole, streamed):
        assert len(out) == round(len(tone) / speed)
        assert abs(centroid(out, rate) / centroid(tone, rate) - 1) < 0.05
        # loudness kept in every 23 ms (no drop-out or blow-up at the joins; a crossfade of two phase-shifted
        # versions dips to about 0.72 of the input's RMS at worst here, the whole stretch to 0.8)
        n = len(out) // 1024 * 1024
        envelope = np.sqrt((out[:n].reshape(-1, 1024) ** 2).mean(axis=1)) / np.sqrt(np.mean(tone**2))
        assert 0.65 < envelope.min() and envelope.max() < 1.2
