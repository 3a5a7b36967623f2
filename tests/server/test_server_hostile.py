"""`audio8 serve` against hostile and unlucky clients (issue 17): odd strings, storage faults, races
(slow clients: test_server_slow_clients.py).

Every refusal is OpenAI-shaped JSON without a server path or a traceback (:func:`clean`); a worker held busy
(:func:`hold`) makes queue races deterministic.
"""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from audio8_coreai import TTS
from audio8_coreai.server import create_app
from audio8_coreai.settings import ServerSettings
from tests import clips
from tests.server.http_support import TEXT, metric, serving, speech

SETTINGS = ServerSettings(workers=2, max_queue=4, max_input_chars=300, max_upload_bytes=1_000_000, max_frames=200)
LEAKS = ("/tmp", "/work", "Traceback", tempfile.gettempdir())


def clean(r: httpx.Response, status: int, code: str) -> dict:
    """The error of ``r``, checked: ``status``, OpenAI's shape with ``code``, no server path or traceback in the
    body or the headers."""
    shown = r.text + "".join(f"{k}: {v}" for k, v in r.headers.items())
    assert not [leak for leak in LEAKS if leak in shown], shown
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error") and error["message"]
    return error


@pytest.fixture(scope="module")
def base(tiny_checkpoint, tmp_path_factory):
    with serving(tiny_checkpoint, tmp_path_factory.mktemp("voices"), SETTINGS) as url:
        yield url


def raw_speech(base: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{base}/v1/audio/speech", content=body, headers={"content-type": "application/json"}, timeout=60)


def clip_bytes(seconds: float = 1.5, rate: int = 22050) -> bytes:
    out = io.BytesIO()
    import soundfile as sf

    sf.write(out, clips.sweep(rate, seconds), rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def add_voice(base: str, name: str, filename: str = "clip.wav", data: bytes | None = None, **form) -> httpx.Response:
    files = {"audio": (filename, clip_bytes() if data is None else data, "audio/wav")}
    return httpx.post(f"{base}/v1/voices", data={"name": name, "transcript": "A rising tone.", **form}, files=files)


def hold(tts: TTS) -> tuple[threading.Event, threading.Event]:
    """Make ``tts``'s next streams wait on a worker until released: returns (entered, release)."""
    entered, release = threading.Event(), threading.Event()
    real = tts.stream

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(60)
        return real(*args, **kwargs)

    tts.stream = held  # an instance attribute over the method
    return entered, release


# ------------------------------------------------------------------------------------------------------------
# 2: strings that cannot be text or a header, file names, a full temp folder, unexpected exceptions


def test_a_lone_surrogate_in_input_is_a_json_400(base):
    r = raw_speech(base, b'{"input": "Hello \\ud800 there", "seed": 1, "max_frames": 4}')
    error = clean(r, 400, "invalid_input")
    assert error["param"] == "input" and "U+D800" in error["message"]


def test_a_lone_surrogate_is_an_audio8_error_in_the_api_and_the_cli(tiny_tts):
    from typer.testing import CliRunner

    from audio8_coreai.cli import app
    from audio8_coreai.errors import PromptError

    with pytest.raises(PromptError, match="U\\+DC80"):
        tiny_tts.generate("Hello \udc80 there", max_frames=2)
    latin1 = os.fsdecode(b"Caf\xe9 cr\xe8me.")  # a command line's text in Latin-1, as Python reads it
    result = CliRunner().invoke(app, ["say", latin1, "-o", "x.wav", "--max-frames", "2"])
    said = "U+DCE9 at character 3: the byte 0xE9 of text that is not UTF-8 (a file or a command line in Latin-1?"
    assert result.exit_code == 2 and said in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["say", "Hello \ud800 there", "-o", "x.wav", "--max-frames", "2"])
    assert result.exit_code != 0 and "U+D800" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("model", ["tts-\u4e2d", "a\r\nX-Evil: 1", "a\nb", "a\x00b", "a\ud800"])
def test_a_model_name_that_cannot_be_a_header_is_a_400_before_synthesis(base, model):
    frames = metric(base, "audio8_frames_total")
    body = json.dumps({"input": TEXT, "model": model, "seed": 1, "max_frames": 4}).encode()
    error = clean(raw_speech(base, body), 400, "invalid_model")
    assert error["param"] == "model" and metric(base, "audio8_frames_total") == frames


def test_health_names_the_model_without_its_path(base, tiny_checkpoint):
    r = httpx.get(f"{base}/health")
    assert r.json()["model"] == tiny_checkpoint.name and not [leak for leak in LEAKS if leak in r.text]


def test_a_latin1_model_name_is_echoed(base):
    r = speech(base, model="tts-1-hd-\u00e9", response_format="pcm", max_frames=2)
    assert r.status_code == 200 and r.headers["x-model"] == "tts-1-hd-\u00e9"


def multipart(fields: dict[str, str | bytes], filename: bytes, data: bytes) -> tuple[bytes, str]:
    """A multipart body written by hand: clients escape what a hostile one sends raw (a NUL in a file name, a field
    that is not UTF-8: bytes)."""
    boundary = "hostile-boundary"
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n'.encode()
        + (v if isinstance(v, bytes) else v.encode())
        + b"\r\n"
        for k, v in fields.items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="audio"; filename="'.encode()
        + filename
        + b'"\r\nContent-Type: audio/wav\r\n\r\n'
        + data
        + b"\r\n"
    )
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_an_upload_name_with_a_nul_in_its_suffix_registers(base):
    body, kind = multipart({"name": "zero", "transcript": "A rising tone."}, b"take.wav\x00.sh", clip_bytes())
    r = httpx.post(f"{base}/v1/voices", content=body, headers={"content-type": kind}, timeout=60)
    assert r.status_code == 201, r.text
    body, kind = multipart({"name": "zero2", "transcript": "A rising tone."}, b"take\x00.w\x00av", b"not audio")
    error = clean(httpx.post(f"{base}/v1/voices", content=body, headers={"content-type": kind}), 400, "invalid_voice")
    assert "\x00" not in error["message"]
    assert httpx.delete(f"{base}/v1/voices/zero").status_code == 200


@pytest.mark.parametrize(
    "body, code, remedy",
    [
        (b'{"input": "caf\xe9", "seed": 1}', "invalid_utf8", "encoded in UTF-8"),
        (b'{"input": "Hi", "voice": ' + b"[" * 1200 + b"]" * 1200 + b"}", "json_too_deep", "one flat JSON object"),
        (b'{"input": "Hi", "seed": ' + b"9" * 5000 + b"}", "number_too_long", "a few digits"),
    ],
)
def test_a_body_the_json_parser_cannot_read_has_a_code_and_a_remedy(base, body, code, remedy):
    error = clean(raw_speech(base, body), 400, code)
    assert remedy in error["message"] and metric(base, f'audio8_errors_total{{code="{code}"}}') >= 1


def test_a_form_that_cannot_be_read_has_a_code_and_a_remedy(base):
    kind = {"content-type": "multipart/form-data"}  # no boundary
    r = httpx.post(f"{base}/v1/voices", content=b"--x\r\nname=a\r\n", headers=kind)
    assert "the boundary in its Content-Type" in clean(r, 400, "invalid_multipart")["message"]
    r = add_voice(base, "longname", filename="a" * 5000 + ".wav")
    assert "short file name" in clean(r, 400, "part_header_too_long")["message"]
    assert "longname" not in httpx.get(f"{base}/v1/voices").text


def test_a_transcript_that_is_not_utf8_is_refused_naming_it_and_utf8_is_kept(base):
    body, kind = multipart(
        {"name": "latin", "transcript": "Caf\u00e9 au lait.".encode("latin-1")}, b"c.wav", clip_bytes()
    )
    error = clean(httpx.post(f"{base}/v1/voices", content=body, headers={"content-type": kind}), 400, "invalid_utf8")
    assert error["param"] == "transcript" and "'transcript' is not UTF-8" in error["message"]
    assert "latin" not in httpx.get(f"{base}/v1/voices").text
    body, kind = multipart({"name": "latin", "transcript": "Caf\u00e9 au lait."}, b"c.wav", clip_bytes())
    r = httpx.post(f"{base}/v1/voices", content=body, headers={"content-type": kind}, timeout=60)
    assert r.status_code == 201 and r.json()["transcript"] == "Caf\u00e9 au lait."
    assert httpx.delete(f"{base}/v1/voices/latin").status_code == 200


def test_a_form_with_a_field_twice_is_refused_naming_it(base):
    body, kind = multipart({"name": "twice", "transcript": "t"}, b"c.wav", clip_bytes())
    body = body.replace(b"--hostile-boundary--", b'--hostile-boundary\r\nContent-Disposition: form-data; name="name"'
                        b"\r\n\r\nagain\r\n--hostile-boundary--")  # fmt: skip
    error = clean(httpx.post(f"{base}/v1/voices", content=body, headers={"content-type": kind}), 400, "invalid_request")
    assert error["param"] == "name" and "the form holds 2 'name' fields: send one" in error["message"]
    assert "twice" not in httpx.get(f"{base}/v1/voices").text and "again" not in httpx.get(f"{base}/v1/voices").text


def test_a_clip_sent_as_a_text_field_is_told_to_come_as_a_file(base):
    body, kind = multipart({"name": "asfield", "transcript": "t", "audio": clip_bytes()}, b"c.wav", clip_bytes())
    error = clean(httpx.post(f"{base}/v1/voices", content=body, headers={"content-type": kind}), 400, "invalid_utf8")
    assert error["param"] == "audio" and "send the clip as a file (a part with a filename)" in error["message"]


class FullSpool:
    """A SpooledTemporaryFile on a full disk."""

    def __init__(self, *args, **kwargs):
        pass

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/spool-xyz")

    def close(self):
        pass


def test_a_full_temp_folder_while_an_upload_spools_is_a_507(base, monkeypatch):
    import starlette.formparsers

    monkeypatch.setattr(starlette.formparsers, "SpooledTemporaryFile", FullSpool)
    error = clean(add_voice(base, "spooled"), 507, "insufficient_storage")
    assert "full" in error["message"]
    monkeypatch.undo()
    assert add_voice(base, "spooled").status_code == 201
    assert httpx.delete(f"{base}/v1/voices/spooled").status_code == 200


def test_a_full_temp_folder_for_the_clip_is_a_507(base, monkeypatch):
    from audio8_coreai.server import synth

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/tmpabc")

    monkeypatch.setattr(synth.tempfile, "mkdtemp", full)
    clean(add_voice(base, "clipfull"), 507, "insufficient_storage")


def test_an_unexpected_exception_is_a_json_500_without_details(base, monkeypatch, caplog):
    from audio8_coreai.server.metrics import Metrics

    def boom(self, *args):
        raise RuntimeError("/work/secret/place exploded")

    monkeypatch.setattr(Metrics, "text", boom)
    error = clean(httpx.get(f"{base}/metrics"), 500, "server_error")
    assert "exploded" not in error["message"]
    assert any("exploded" in r.getMessage() or "exploded" in str(r.exc_info) for r in caplog.records)


# ------------------------------------------------------------------------------------------------------------
# 3, 4: a voice deleted while its request waits; two registrations racing for one name


def test_deleting_a_voice_while_its_request_waits_in_the_queue(tiny_checkpoint, tmp_path):
    instance = TTS.load(tiny_checkpoint, device="cpu", voices_dir=tmp_path)
    settings = ServerSettings(workers=1, max_queue=2, max_frames=50)
    from audio8_coreai.server import serve_in_thread

    with serve_in_thread(create_app([instance], settings)) as url:
        assert add_voice(url, "ana").status_code == 201
        alone = speech(url, voice="ana", response_format="pcm", max_frames=6).content
        entered, release = hold(instance)
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(speech, url, response_format="pcm", max_frames=4)
            assert entered.wait(30)
            queued = pool.submit(speech, url, voice="ana", response_format="pcm", max_frames=6)
            deadline = time.monotonic() + 30
            while httpx.get(f"{url}/health").json()["queued"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            assert httpx.delete(f"{url}/v1/voices/ana").status_code == 200
            release.set()
            assert first.result().status_code == 200
            r = queued.result()
    assert r.status_code == 200 and r.content == alone  # spoken in the voice as it was when admitted


def test_two_registrations_racing_for_one_new_name_give_one_201_and_one_409(base):
    for round_ in range(4):
        name = f"race{round_}"
        start = threading.Barrier(2)

        def post(_, name=name, start=start):
            start.wait()
            return add_voice(base, name)

        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(post, range(2)))
        assert sorted(r.status_code for r in answers) == [201, 409], [r.text for r in answers]
        clean(next(r for r in answers if r.status_code == 409), 409, "voice_exists")
        assert httpx.delete(f"{base}/v1/voices/{name}").status_code == 200


# ------------------------------------------------------------------------------------------------------------
# 7: storage faults


@pytest.mark.parametrize(
    "fault, status, code",
    [
        (errno.ENOSPC, 507, "insufficient_storage"),
        (errno.EROFS, 500, "storage_error"),
        (errno.EACCES, 500, "storage_error"),
    ],
)
def test_storage_faults_are_5xx_without_paths(base, monkeypatch, fault, status, code):
    import audio8_coreai.voices as store

    def fail(*args, **kwargs):
        raise OSError(fault, "storage fault", "/work/voices/.x.tmp")

    monkeypatch.setattr(store.tempfile, "mkstemp", fail)
    clean(add_voice(base, "faulty"), status, code)
    monkeypatch.undo()
    assert add_voice(base, "faulty").status_code == 201
    monkeypatch.setattr(store.os, "unlink", fail)
    monkeypatch.setattr("pathlib.Path.unlink", fail)
    clean(httpx.delete(f"{base}/v1/voices/faulty"), status, code)
    monkeypatch.undo()
    assert httpx.delete(f"{base}/v1/voices/faulty").status_code == 200


# ------------------------------------------------------------------------------------------------------------
# 8, 14: strict numbers, one code for text with nothing to speak, 405's Allow


@pytest.mark.parametrize(
    "body, param", [({"temperature": "0.7"}, "temperature"), ({"top_p": "0.9"}, "top_p"), ({"speed": "1.0"}, "speed")]
)
def test_numbers_in_strings_are_refused(base, body, param):
    error = clean(speech(base, **body), 400, "invalid_request")
    assert error["param"] == param


def test_whole_numbers_are_fine_where_a_float_is_asked(base):
    assert speech(base, temperature=1, top_p=1, speed=1, response_format="pcm", max_frames=2).status_code == 200


@pytest.mark.parametrize("text", ["", "   ", "...!!", " \u2014 "])
def test_text_with_nothing_to_speak_has_one_code(base, text):
    assert clean(speech(base, input=text), 400, "empty_input")["param"] == "input"


def test_405_lists_every_method_of_the_path(base):
    r = httpx.put(f"{base}/v1/voices")
    clean(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "GET, HEAD, POST"


# ------------------------------------------------------------------------------------------------------------
# 11: the upload limit is about bytes; clips too short in samples


def test_the_upload_limit_says_bytes_and_the_setting(base):
    error = clean(add_voice(base, "big", data=b"\0" * 1_100_000), 413, "upload_too_large")
    assert "1.0 MB" in error["message"] and "--max-upload-mb" in error["message"]


def test_a_chunked_upload_past_the_limit_is_refused_as_it_is_read(base):
    """No content-length to refuse by: the form is read up to the limit (and a field's worth more), never to the
    disk or memory a client would fill, and refused there; the server serves on."""
    sent = []

    def body():  # a file part of 64 MB, in 64 KB chunks, unless the server stops taking them
        yield b'--b\r\nContent-Disposition: form-data; name="audio"; filename="big.wav"\r\n\r\n'
        for _ in range(1024):
            sent.append(65536)
            yield b"\0" * 65536

    kind = "multipart/form-data; boundary=b"
    try:
        r = httpx.post(f"{base}/v1/voices", content=body(), headers={"content-type": kind}, timeout=60)
    except httpx.WriteError:  # the server answered and closed while the client was still sending
        pass
    else:
        assert "1.0 MB" in clean(r, 413, "upload_too_large")["message"]
    assert sum(sent) < 16 * 2**20  # what the sockets took beyond the limit, not the 64 MB
    assert httpx.get(f"{base}/v1/voices").status_code == 200


def test_a_clip_of_three_samples_and_a_blank_transcript_are_refused_naming_their_field(base):
    import soundfile as sf

    out = io.BytesIO()
    sf.write(out, np.array([0.5, -0.5, 0.5], np.float32), 1, format="WAV", subtype="PCM_16")
    error = clean(add_voice(base, "tiny", data=out.getvalue()), 400, "invalid_voice")
    assert "clip.wav" in error["message"] and "Hz" in error["message"] and error["param"] == "audio"
    error = clean(add_voice(base, "blank", transcript="  "), 400, "invalid_voice")  # the field it is about
    assert "empty" in error["message"] and error["param"] == "transcript"
    out = io.BytesIO()
    sf.write(out, clips.bursts(16000, 20.0), 16000, format="WAV", subtype="PCM_16")
    error = clean(add_voice(base, "long", data=out.getvalue()), 400, "invalid_voice")  # over the tiny context
    assert "too long for this model" in error["message"] and error["param"] == "audio"  # was null
