"""`audio8 serve`: a real uvicorn on 127.0.0.1 driven by httpx and the official openai client (tiny checkpoint).

Frame caps keep every request to a few dozen tiny frames; streaming servers emit every 4 frames. A test about the
audio spoken (its frames, its bytes, that it is spoken at all) runs on the checkpoint that never draws eos
(steered.py), so each request runs to its frame cap whatever the seed; the refusals run on the random one.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from audio8_coreai import TTS, EngineError, PromptError
from audio8_coreai.audio import SPEECH_FORMATS
from audio8_coreai.settings import ServerSettings
from tests import clips
from tests.server.http_support import JSON, RATES, SETTINGS, TEXT, decode, metric, serving, speech


@pytest.fixture(scope="module")
def base(tiny_checkpoint, tmp_path_factory):
    with serving(tiny_checkpoint, tmp_path_factory.mktemp("voices"), SETTINGS) as url:
        yield url


@pytest.fixture(scope="module")
def capped(never_eos_long_checkpoint, tmp_path_factory):
    """The same server on the checkpoint that never draws eos: every request speaks to its frame cap."""
    with serving(never_eos_long_checkpoint, tmp_path_factory.mktemp("voices"), SETTINGS) as url:
        yield url


# ------------------------------------------------------------------------------------------------------------
# Speech


@pytest.mark.parametrize("fmt", SPEECH_FORMATS)
def test_every_response_format_decodes(capped, fmt):
    r = speech(capped, response_format=fmt)
    assert r.status_code == 200, r.text
    rate = RATES.get(fmt, 44100)
    assert r.headers["x-seed"] == "1" and r.headers["x-sample-rate"] == str(rate)
    audio, got_rate = decode(r.content, fmt)
    assert got_rate == rate and len(audio) > 0


def test_openai_client_speaks_and_streams(capped):
    client = openai.OpenAI(base_url=f"{capped}/v1", api_key="unused")
    extras = {"seed": 1, "max_frames": 12}
    out = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="wav", extra_body=extras)
    audio, rate = decode(out.content, "wav")
    assert rate == 44100 and len(audio) == 12 * 2048
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="nova", input=TEXT, response_format="pcm", extra_body={**extras, "stream": True}
    ) as response:
        assert response.headers["x-model"] == "gpt-4o-mini-tts"
        streamed = b"".join(response.iter_bytes())
    assert np.array_equal(decode(streamed, "pcm")[0], decode(speech(capped, response_format="pcm").content, "pcm")[0])


def test_same_request_and_seed_give_the_same_bytes_and_another_seed_differs(capped):
    a, b, c = (speech(capped, response_format="wav", seed=seed) for seed in (1, 1, 2))
    assert a.content == b.content and a.content != c.content


def test_streaming_sends_audio_before_the_last_frame(capped):
    body = {"input": TEXT, "seed": 1, "max_frames": 40, "stream": True, "response_format": "wav"}
    with httpx.stream("POST", f"{capped}/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and "content-length" not in r.headers
        chunks = r.iter_bytes()
        first = next(chunks)
        frames_at_first = metric(capped, "audio8_frames_total")
        rest = b"".join(chunks)
    assert frames_at_first < metric(capped, "audio8_frames_total")
    streamed, _ = decode(first + rest, "wav")
    whole, _ = decode(speech(capped, response_format="wav", max_frames=40).content, "wav")
    assert np.array_equal(streamed, whole)


def test_four_concurrent_streams_complete_without_cross_talk(capped):
    bodies = [
        {
            "input": f"Request number {i} speaks now.",
            "seed": 10 + i,
            "max_frames": 12,
            "stream": True,
            "response_format": "pcm",
        }
        for i in range(4)
    ]

    def fetch(body):
        with httpx.stream("POST", f"{capped}/v1/audio/speech", json=body, timeout=120) as r:
            assert r.status_code == 200
            return b"".join(r.iter_bytes())

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(fetch, bodies))
    alone = [fetch(b) for b in bodies]
    assert together == alone
    assert len(set(together)) == 4


def test_batched_server_streams_equal_unbatched_ones(never_eos_long_checkpoint, tmp_path):
    """``--batch 4``: four concurrent streaming requests share one model's frame calls and get the bytes each
    gets from an unbatched fp32 server (fp32: the same codes on this checkpoint)."""
    bodies = [
        {
            "input": f"Request number {i} speaks now.",
            "seed": 10 + i,
            "max_frames": 12,
            "stream": True,
            "response_format": "pcm",
        }
        for i in range(4)
    ]

    def fetch(url, body):
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, timeout=120) as r:
            assert r.status_code == 200
            return b"".join(r.iter_bytes())

    settings = ServerSettings(workers=4, max_queue=4, max_frames=200, chunk_frames=4)
    with serving(never_eos_long_checkpoint, tmp_path, settings, batch=4, precision="fp32") as url:
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(lambda b: fetch(url, b), bodies))
        health = httpx.get(f"{url}/health").json()
    with serving(never_eos_long_checkpoint, tmp_path, ServerSettings(workers=1), precision="fp32") as url:
        alone = [fetch(url, b) for b in bodies]
    assert len(set(together)) == 4
    for got, ref in zip(together, alone):  # equal codes; the float rounding of batching may move a 16-bit LSB
        a, b = np.frombuffer(got, "<i2").astype(int), np.frombuffer(ref, "<i2").astype(int)
        assert a.shape == b.shape and a.size > 0 and np.abs(a - b).max() <= 1
    assert health["workers"] == 4 and "batched x4" in health["backend"]


def test_long_input_is_split_and_fully_spoken(capped):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(3))
    r = speech(capped, input=text, max_frames=4, response_format="wav")
    audio, _ = decode(r.content, "wav")
    pause = round(0.25 * 44100)
    assert r.status_code == 200 and len(audio) == 3 * 4 * 2048 + 2 * pause  # 3 pieces, 2 pauses


BAD_REQUESTS = [
    ({"input": ""}, 400, "empty_input"),
    ({"input": "   "}, 400, "empty_input"),
    ({"input": "x" * 301}, 400, "input_too_long"),
    ({"input": "...!!"}, 400, "empty_input"),
    ({"response_format": "ogg"}, 400, "unsupported_format"),
    ({"response_format": "flac", "stream": True}, 400, "unsupported_format"),
    ({"speed": 9}, 400, "invalid_speed"),
    ({"speed": 0.2}, 400, "invalid_speed"),
    ({"sample_rate": 7999}, 400, "invalid_sample_rate"),
    ({"sample_rate": 10000, "response_format": "mp3"}, 400, "unsupported_sample_rate"),
    ({"sample_rate": 16000, "response_format": "opus"}, 400, "unsupported_sample_rate"),  # opus: 48 kHz, said
    ({"stream_format": "sse", "response_format": "flac"}, 400, "unsupported_format"),
    ({"voice": {"name": "ana"}}, 400, "invalid_request"),
    ({"voice": {"id": "ana", "extra": 1}}, 400, "invalid_request"),
    ({"voice": {"id": 5}}, 400, "invalid_request"),
    ({"voice": ["ana"]}, 400, "invalid_request"),
    ({"voice": "../etc"}, 400, "invalid_voice"),
    ({"voice": "nobody-here"}, 400, "voice_not_found"),
    ({"stream_format": "chunks"}, 400, "unsupported_stream_format"),
    ({"stream_format": "sse", "stream": False}, 400, "unsupported_stream_format"),  # was sse regardless
    ({"temperature": 0}, 400, "invalid_request"),
    ({"top_k": 0}, 400, "invalid_request"),
    ({"seed": -1}, 400, "invalid_request"),
    ({"seed": 2**53}, 400, "invalid_request"),  # past what a JSON client reads exactly (request.MAX_SEED)
    ({"top_p": 1.5}, 400, "invalid_request"),
    ({"max_frames": 201}, 400, "max_frames_too_large"),
    ({"input": None}, 400, "invalid_request"),
    ({"stream": "yes"}, 400, "invalid_request"),
    ({"stream": "false"}, 400, "invalid_request"),
    ({"seed": True}, 400, "invalid_request"),
    ({"seed": "1"}, 400, "invalid_request"),
    ({"max_frames": 2.5}, 400, "invalid_request"),
    ({"ref_audio": "/clips/ana.wav", "ref_text": "Hi."}, 400, "invalid_request"),  # was spoken in the default voice
]


@pytest.mark.parametrize("body, status, code", BAD_REQUESTS)
def test_bad_requests_get_clear_json_errors(base, body, status, code):
    r = speech(base, **body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and len(error["message"]) > 10
    if code == "invalid_request" and set(body) <= {"temperature", "top_k", "top_p", "seed"}:
        assert error["param"] == next(iter(body))  # the field to change
    if "ref_audio" in body:
        assert "over HTTP register the clip with POST /v1/voices" in error["message"]
    if set(body) == {"voice"} and code == "invalid_request":  # not a name nor {"id": NAME}: said so
        assert error["param"] == "voice" and error["message"].startswith('voice must be a name or {"id": NAME}, got ')


def test_the_models_refusals_name_their_field(base, tiny_tts):
    """A refusal made past the schema (by the plan) names its field as param too: a word too long to split the
    input; the library's field is the keyword (a frame cap past the context: max_frames; an empty ref_text)."""
    error = speech(base, input="x" * 290).json()["error"]
    assert (error["param"], error["code"]) == ("input", "invalid_request") and "cannot split" in error["message"]
    room = tiny_tts.checkpoint.config.max_seq_len - tiny_tts.prompts.plain("Hi.").shape[1]
    with pytest.raises(EngineError, match="so at most") as refused:
        tiny_tts.generate("Hi.", max_frames=room + 1)
    assert refused.value.field == "max_frames"
    with pytest.raises(PromptError, match="reference text is empty") as refused:
        tiny_tts.voice_from_clip("clip.wav", "  ")
    assert refused.value.field == "ref_text"


def test_an_utterance_that_ends_at_once_is_a_422_not_an_empty_file(
    eos_first_checkpoint, never_eos_checkpoint, tmp_path
):
    """With top-k 1 the first checkpoint draws eos on the first frame (steered.py): no audio, said so, streamed (the
    default: nothing was sent before the first frame) or whole; the same request to one that never draws eos is
    speech."""
    with serving(eos_first_checkpoint, tmp_path / "a", ServerSettings(workers=1)) as url:
        answers = [speech(url, input="Hi.", top_k=1, **body) for body in ({}, {"stream": False})]
    for r in answers:
        error = r.json()["error"]
        assert r.status_code == 422 and error["code"] == "no_audio" and error["param"] == "seed"
    with serving(never_eos_checkpoint, tmp_path / "b", ServerSettings(workers=1)) as url:
        assert speech(url, input="Hi.", top_k=1).status_code == 200


def test_the_server_frame_cap_is_a_ceiling_clipped_to_the_context(never_eos_checkpoint, tmp_path):
    """serve --max-frames caps a request that sets none; a cap above what the context leaves is clipped to it (a
    never-ending checkpoint with a 128-position context makes every frame count)."""
    body = {"input": "Hi.", "response_format": "wav", "seed": 1}
    room = 128 - TTS.load(never_eos_checkpoint, device="cpu").prompts.plain("Hi.").shape[1]  # frames that fit
    for cap in (5, 100_000):
        with serving(never_eos_checkpoint, tmp_path / str(cap), ServerSettings(workers=1, max_frames=cap)) as url:
            r = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        frames = len(decode(r.content, "wav")[0]) // 2048
        assert frames == min(cap, room)


def test_a_huge_speech_body_is_a_413_before_it_is_parsed(capped):
    body = b'{"input": "Hi", "pad": "' + b"x" * (2 << 20) + b'"}'
    r = httpx.post(f"{capped}/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunked(data: bytes, size: int = 1 << 16):  # no content-length: sent chunked
        for i in range(0, len(data), size):
            yield data[i : i + size]

    r = httpx.post(f"{capped}/v1/audio/speech", content=chunked(body), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    small = json.dumps({"input": TEXT, "seed": 1, "max_frames": 4, "response_format": "wav"}).encode()
    r = httpx.post(
        f"{capped}/v1/audio/speech", content=chunked(small, 16), headers={"content-type": "application/json"}
    )
    assert r.status_code == 200 and r.content[:4] == b"RIFF"


def test_a_body_that_is_not_json_is_a_400(base):
    for body, at in ((b"not json", 0), (b'{"input": "Hi", "voice": ', 25)):
        r = httpx.post(f"{base}/v1/audio/speech", content=body, headers={"content-type": "application/json"})
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "invalid_json"
        assert f"not valid JSON (at character {at})" in error["message"]
    empty = httpx.post(f"{base}/v1/audio/speech", content=b"", headers={"content-type": "application/json"})
    assert empty.status_code == 400 and empty.json()["error"]["message"].startswith("the body is empty: send a JSON")


def test_a_body_not_a_json_object_says_to_send_one(base):
    """JSON null, a list, or a JSON object sent as a form (curl -d's default type) is told what to send; a speed of
    NaN is refused as not finite (not as over 4)."""
    for body, kind in ((b"null", "application/json"), (b"[1]", "application/json"), (b'{"input": "Hi"}', None)):
        r = httpx.post(f"{base}/v1/audio/speech", content=body, headers={"content-type": kind or "text/plain"})
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "invalid_request"
        assert error["message"].startswith("the body must be a JSON object sent with Content-Type: application/json")
    r = httpx.post(f"{base}/v1/audio/speech", content=b'{"input": "Hi", "speed": NaN}', headers=JSON)
    error = r.json()["error"]
    assert r.status_code == 400 and (error["code"], error["param"]) == ("invalid_speed", "speed")
    assert error["message"].startswith("speed: Input should be a finite number: change it and send again")
    r = httpx.post(f"{base}/v1/audio/speech", content=b'{"voice": "alloy"}', headers=JSON)
    error = r.json()["error"]
    assert r.status_code == 400 and (error["code"], error["param"]) == ("invalid_request", "input")
    assert error["message"].startswith("input is required: send it, as in {") and "GET /docs" in error["message"]
    r = httpx.post(f"{base}/v1/audio/speech", content=b'{"input": "Hi", "temperature": "hot"}', headers=JSON)
    assert "temperature: Input should be a valid number" in r.json()["error"]["message"]
    assert "GET /docs, or /openapi.json offline" in r.json()["error"]["message"]  # /docs needs a CDN


def test_unknown_routes_and_methods_get_the_same_error_shape(base):
    r = httpx.post(f"{base}/v1/audio/speak", json={"input": "Hi"})
    error = r.json()["error"]
    assert r.status_code == 404 and error["code"] == "unknown_url" and error["type"] == "invalid_request_error"
    assert "POST /v1/audio/speak" in error["message"] and "POST /v1/audio/speech" in error["message"]
    # the list is the app's own routes, every one (it was a hand-written copy that had lost four)
    for endpoint in ("GET and POST /v1/voices", "GET /v1/audio/voices", "DELETE /v1/voices/NAME", "GET /v1/models"):
        assert endpoint in error["message"]
    assert (
        "GET /v1/audio/models" in error["message"]
        and "GET /docs (every field; offline: GET /openapi.json)" in (error["message"])
    )
    assert "HEAD" not in error["message"] and "/static/" not in error["message"]
    r = httpx.get(f"{base}/v1/audio/speech")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert r.headers["allow"] == "POST"
    r = httpx.post(f"{base}/v1/audio/speech/", json={"input": "Hi"})  # a slash too many: said, not a bodyless 307
    assert r.status_code == 404 and r.json()["error"]["message"].startswith(
        "no such endpoint: POST /v1/audio/speech/ (without the last slash: /v1/audio/speech); this server has"
    )


# ------------------------------------------------------------------------------------------------------------
# Voices, health, metrics


def test_voices_register_speak_list_and_delete(capped, tmp_path):
    clip = clips.write(tmp_path / "clip.wav", clips.sweep(22050, 1.5), 22050)
    files = {"audio": ("clip.wav", clip.read_bytes(), "audio/wav")}
    r = httpx.post(
        f"{capped}/v1/voices", data={"name": "ana", "transcript": "A rising tone."}, files=files, timeout=120
    )
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "ana" and r.json()["frames"] == 33
    again = httpx.post(f"{capped}/v1/voices", data={"name": "ana", "transcript": "x"}, files=files)
    assert again.status_code == 409 and "exists" in again.json()["error"]["message"]
    assert "replace=true in POST /v1/voices" in again.json()["error"]["message"]
    assert [v["name"] for v in httpx.get(f"{capped}/v1/voices").json()["data"]] == ["ana"]
    cloned = speech(capped, voice="ana", response_format="wav")
    assert cloned.status_code == 200 and cloned.content != speech(capped, response_format="wav").content
    deleted = httpx.delete(f"{capped}/v1/voices/ANA")  # its name as stored, whatever the case asked with
    assert deleted.status_code == 200 and deleted.json() == {"name": "ana", "deleted": True}
    assert httpx.delete(f"{capped}/v1/voices/ana").status_code == 404
    assert httpx.delete(f"{capped}/v1/voices/..").status_code in (400, 404)
    assert httpx.get(f"{capped}/v1/voices").json()["data"] == []
    for form, sent, missing in (
        ({"name": "bo", "text": "Hi."}, files, "transcript"),  # a field misnamed
        ({"name": "bo", "transcript": "Hi.", "audio": "clip.wav"}, None, "audio"),  # the clip as text, not a file
        ({}, None, "name, transcript, audio"),
    ):
        r = httpx.post(f"{capped}/v1/voices", data=form, files=sent)
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == missing.split(",")[0], r.text
        assert error["message"].endswith(f"missing: {missing}")


@pytest.mark.parametrize(
    "form, files, status",
    [
        ({"name": "big", "transcript": "t"}, {"audio": ("big.wav", b"\0" * 1_100_000, "audio/wav")}, 413),
        ({"name": "bad/name", "transcript": "t"}, {"audio": ("c.wav", b"RIFF", "audio/wav")}, 400),
        ({"name": "junk", "transcript": "t"}, {"audio": ("my take.wav", b"not audio at all", "audio/wav")}, 400),
        ({"name": "junk2", "transcript": "t"}, {"audio": ("myrecording", b"not audio at all", "audio/wav")}, 400),
        ({"name": "nofile", "transcript": "t"}, None, 400),
        ({"name": "Default", "transcript": "t"}, {"audio": ("c.wav", b"RIFF", "audio/wav")}, 400),
        ({"name": "bo", "transcript": "t", "replace": "maybe"}, {"audio": ("c.wav", b"RIFF", "audio/wav")}, 400),
    ],
)
def test_bad_voice_uploads(base, form, files, status):
    r = httpx.post(f"{base}/v1/voices", data=form, files=files, timeout=60)
    message = r.json()["error"]["message"]
    assert r.status_code == status and message
    if form["name"] == "junk":  # the client's file name, never the server's temporary path
        assert "my take.wav" in message and "/tmp" not in message
    if form["name"] == "junk2":  # a name without a suffix replaces no word of the message
        assert "myrecording" in message and "a myrecording" not in message and "clip" in message
    if form["name"] == "Default":  # the id requests use for the default voice is no stored voice's name
        assert "'Default' names the default voice in a server's requests" in message
    if "replace" in form:
        assert message == "replace must be true or false, got 'maybe'"


def test_health_and_metrics(capped):
    health = httpx.get(f"{capped}/health").json()
    assert health["status"] == "ok" and health["device"] == "cpu" and health["backend"].startswith("torch cpu")
    assert health["workers"] == 2
    for path in ("/health", "/", "/v1/models", "/v1/audio/voices", "/metrics"):  # every GET answers HEAD (was a 405)
        head = httpx.head(f"{capped}{path}")
        assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 0
    speech(capped, response_format="pcm")
    text = httpx.get(f"{capped}/metrics").text
    assert "# TYPE audio8_frames_total counter" in text
    assert metric(capped, "audio8_frames_total") >= 12 and metric(capped, "audio8_rtf") > 0
    assert metric(capped, "audio8_queue_depth") == 0 and metric(capped, "audio8_ttfa_seconds_mean") > 0
    assert metric(capped, "audio8_ttfa_seconds_count") >= 1
    speech(capped, voice="nobody-here")
    assert metric(capped, 'audio8_errors_total{code="voice_not_found"}') >= 1
