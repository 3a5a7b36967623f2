"""The keyword API's arguments checked before anything runs: types, ranges, switches and callbacks (each refusal a
ConfigError or PromptError/VoiceError naming its ``field``), and what is normalised (numpy numbers, whitespace)."""

from __future__ import annotations

import numpy as np
import pytest

from audio8_coreai.errors import ConfigError, PromptError, VoiceError
from audio8_coreai.request import check_request
from audio8_coreai.settings import DEFAULTS

TEXT = "The meeting has been moved to Thursday afternoon."


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"top_k": 0}, {"top_p": 1.5}, {"seed": -1}])
def test_bad_sampling_settings(tiny_tts, kwargs):
    with pytest.raises(ConfigError):
        tiny_tts.generate(TEXT, **{"seed": 0, **kwargs})


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_frames": 8.5}, "max_frames"),
        ({"max_frames": True}, "max_frames"),
        ({"max_frames": "16"}, "max_frames"),
        ({"max_frames": 0}, "max_frames"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": "5"}, "top_k"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": None, "seed": 1.0}, "seed"),
        ({"chunk_frames": 2.5}, "chunk_frames"),
    ],
)
def test_wrong_types_are_config_errors_naming_the_setting(tiny_tts, kwargs, field):
    """Before any frame: a float where a count goes is refused (not rounded), as are strings and bools."""
    stream_only = "chunk_frames" in kwargs
    call = tiny_tts.stream if stream_only else tiny_tts.generate
    with pytest.raises(ConfigError) as e:
        call("Hello there.", **{"max_frames": 4, **kwargs})
    assert e.value.field == field


@pytest.mark.parametrize(
    "call, kwargs, said",
    [
        ("load", {"codec_process": "no"}, "codec_process must be True, False or None, not 'no'"),  # was taken as on
        ("load", {"cuda_graphs": "false"}, "cuda_graphs must be True, False or None, not 'false'"),
        ("stream", {"overlap_codec": "off"}, "overlap_codec must be True, False or None, not 'off'"),
        ("generate", {"on_frame": 5}, "on_frame must be a function or None, not int"),  # failed after the prefill
        ("synthesize", {"on_start": 5}, "on_start must be a function or None, not int"),
    ],
)
def test_switches_and_callbacks_are_checked_before_anything_runs(tiny_checkpoint, tiny_tts, call, kwargs, said):
    from audio8_coreai import TTS

    run = (
        (lambda: TTS.load(tiny_checkpoint, **kwargs))
        if call == "load"
        else (lambda: getattr(tiny_tts, call)("Hello there.", max_frames=2, **kwargs))
    )
    with pytest.raises(ConfigError, match=said) as e:
        run()
    assert e.value.field == next(iter(kwargs))


def test_numpy_bools_and_0_or_1_are_switches(tiny_checkpoint):
    """As the bools they are: codec_process=np.False_ loads without a codec process (it was refused since the
    switches were checked), 1 with one."""
    from audio8_coreai import TTS

    with TTS.load(tiny_checkpoint, device="cpu", codec_process=np.False_) as tts:
        assert tts.backend.codec_process is False
        speech = tts.stream("Hi.", max_frames=2, seed=1, overlap_codec=np.True_)
        list(speech)  # taken as True: no ConfigError
        assert speech.seed == 1
    with TTS.load(tiny_checkpoint, device="cpu", codec_process=1) as tts:
        assert tts.backend.codec_process is True


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        ({"text": "..."}, PromptError, "text"),
        ({"voice": "a/b"}, VoiceError, None),
        ({"ref_audio": "clip.wav"}, VoiceError, None),
        ({"ref_audio": "clip.wav", "ref_text": " "}, PromptError, "ref_text"),
        ({"temperature": 0}, ConfigError, "temperature"),
        ({"top_p": 1.5}, ConfigError, "top_p"),
        ({"top_k": 2.5}, ConfigError, "top_k"),
        ({"seed": -1}, ConfigError, "seed"),
        ({"max_frames": 0}, ConfigError, "max_frames"),
        ({"chunk_frames": 0}, ConfigError, "chunk_frames"),
        ({"chunk_frames": 4, "first_chunk_frames": 5}, ConfigError, "first_chunk_frames"),
    ],
)
def test_check_request_refuses_without_a_model(kwargs, error, field):
    """The weights-free check the CLI runs before loading and the server before taking a worker."""
    with pytest.raises(error) as e:
        check_request(**{"text": "Hello there.", **kwargs})
    assert e.value.field == field


def test_check_request_normalises():
    req = check_request("  Hello\n there. ", voice="Ann", top_k=np.int32(20), seed=None, first_chunk_frames=2)
    assert (req.text, req.voice, req.top_k, req.temperature) == ("Hello there.", "Ann", 20, None)
    assert type(req.top_k) is int and 0 <= req.seed < 2**31
    assert (req.chunk_frames, req.first_chunk_frames) == (DEFAULTS.speech.chunk_frames, 2)


def test_numpy_integers_are_whole_numbers(tiny_tts):
    a = tiny_tts.generate("Hello there.", seed=np.int64(3), top_k=np.int32(20), max_frames=np.int64(6))
    b = tiny_tts.generate("Hello there.", seed=3, top_k=20, max_frames=6)
    assert np.array_equal(a.codes, b.codes) and a.max_frames == 6 and type(a.max_frames) is int
