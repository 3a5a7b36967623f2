"""The server's encoders alone (no server): every response format whole and streamed, which formats are byte-stable."""

from __future__ import annotations

import io

import numpy as np
import pytest

from audio8_coreai.audio import SPEECH_FORMATS, STREAMABLE_FORMATS, SpeechEncoder, encode_speech
from tests import clips
from tests.server.http_support import decode


@pytest.mark.parametrize("fmt", SPEECH_FORMATS)
def test_every_format_encodes_whole_and_streamed(fmt):
    audio = clips.sweep(44100, 1.0, 0.4)
    rate = 48000 if fmt == "opus" else 44100
    whole, got_rate = decode(encode_speech(audio, 44100, fmt), fmt, 44100)
    assert got_rate == rate
    if fmt == "aac":  # the encoder's priming and the last frame's padding: at most 2 frames of 1024 more
        assert 0 <= len(whole) - len(audio) <= 2048
    else:
        assert abs(len(whole) - len(audio) * rate / 44100) <= 1
    if fmt in ("wav", "pcm", "flac"):
        assert float(np.abs(whole - audio).max()) < 1e-4  # 16-bit
    if fmt in STREAMABLE_FORMATS:
        encoder = SpeechEncoder(fmt, 44100)
        data = b"".join(encoder.write(audio[i : i + 8192]) for i in range(0, len(audio), 8192)) + encoder.close()
        streamed, got_rate = decode(data, fmt, 44100)
        assert got_rate == rate and len(streamed) >= len(audio) * rate / 44100 - 1


def test_flac_holds_the_samples_of_wav_and_every_format_but_opus_is_byte_stable():
    import soundfile as sf

    from audio8_coreai.audio import SPEECH_FORMATS, encode_speech

    audio = clips.sweep(44100, 1.0, 0.7)
    wav = np.frombuffer(encode_speech(audio, 44100, "wav")[44:], "<i2")
    flac, _ = sf.read(io.BytesIO(encode_speech(audio, 44100, "flac")), dtype="int16")
    assert np.array_equal(flac, wav)
    for fmt in SPEECH_FORMATS:
        same = encode_speech(audio, 44100, fmt) == encode_speech(audio, 44100, fmt)
        assert same is (fmt != "opus"), fmt  # Ogg gives each opus stream a random serial number
