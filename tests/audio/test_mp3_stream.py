"""A streamed mp3 decodes as the whole-file mp3 does: its LAME tag gives decoders the encoder delay to trim."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soundfile as sf

from audio8_coreai.audio import SpeechEncoder, encode_speech
from tests import clips

# 44.1 and 48 kHz are MPEG-1 (1152-sample frames), 24 kHz MPEG-2 and 8 kHz MPEG-2.5 (576-sample frames).
FRAME = {44100: 1152, 48000: 1152, 24000: 576, 8000: 576}
DECODER_LAG = 576 + 529  # LAME's encoder delay and the decoder's (samples)


def speech_like(rate: int) -> np.ndarray:
    """1.3 s: silence, then noise bursts over a sweep (a sharp onset for the cross-correlation), float32 [N]."""
    audio = 0.5 * clips.sweep(rate, 1.3, 0.4) + clips.bursts(rate, 1.3, 0.3, seed=3)
    audio[: rate // 20] = 0.0
    return audio.astype(np.float32)


def streamed(audio: np.ndarray, rate: int, chunk: int = 4096) -> bytes:
    encoder = SpeechEncoder("mp3", rate)
    return b"".join(encoder.write(audio[i : i + chunk]) for i in range(0, len(audio), chunk)) + encoder.close()


def decode_av(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as f:
        return np.concatenate([frame.to_ndarray().reshape(-1) for frame in f.decode(audio=0)])


def decode_sf(data: bytes) -> np.ndarray:
    return sf.read(io.BytesIO(data), dtype="float32")[0]


def delay(reference: np.ndarray, b: np.ndarray, most: int = 2400) -> int:
    """The shift (samples, 0 to ``most``) by which ``b`` lags ``reference``: the best dot product of the two."""
    n = len(reference) - most
    return int(np.argmax([np.dot(reference[:n], b[d : d + n]) for d in range(most)]))


@pytest.mark.parametrize("rate", sorted(FRAME))
@pytest.mark.parametrize("decode", [decode_av, decode_sf], ids=["pyav", "soundfile"])
def test_streamed_mp3_decodes_as_the_whole_file_behind_at_most_lames_delay(rate, decode):
    """Before its tag, a stream decoded behind the whole file by a blank frame plus LAME's delay (2,257 samples
    at 44.1 kHz). ffmpeg and mpg123 trim the delay only with a frame count, which a stream cannot know: ffmpeg
    keeps one frame (the tag's, 1152 or 576 samples), mpg123 LAME's 1,105."""
    audio = speech_like(rate)
    whole, stream = decode(encode_speech(audio, rate, "mp3")), decode(streamed(audio, rate))
    assert len(whole) == len(audio) and delay(audio, whole) == 0  # the whole file's tag: exact
    lag = delay(whole, stream)
    assert lag in (FRAME[rate], DECODER_LAG)
    assert 0 <= len(stream) - lag - len(whole) < 2 * FRAME[rate]  # LAME's padding, kept
    n = len(whole)
    assert np.corrcoef(whole, stream[lag : lag + n])[0, 1] > 0.85  # two lossy codings (VBR, CBR) of noise


def test_streamed_mp3_starts_with_a_lame_info_tag():
    data = streamed(speech_like(44100), 44100)
    side_info = 17  # MPEG-1 mono
    assert data[:2] == b"\xff\xfb" and data[4 + side_info : 8 + side_info] == b"Info"
    lame = data.index(b"LAME")
    delay_padding = int.from_bytes(data[lame + 21 : lame + 24], "big")
    assert (delay_padding >> 12, delay_padding & 0xFFF) == (576, 0)  # LAME's encoder delay; padding unknown


def test_an_mp3_stream_shorter_than_a_frame_decodes_to_it_and_at_most_a_frame_more():
    audio = speech_like(44100)[:600]
    for decode in (decode_av, decode_sf):
        assert 600 <= len(decode(streamed(audio, 44100))) < 600 + DECODER_LAG + 2 * FRAME[44100]


def test_a_streamed_mp3_is_128_kbit_s_at_44_1_khz():
    """The constant bit rate the encoder says (a reader tells the length from the size): libsndfile's level 0.5 gave
    160 kbit/s, twice the whole file's VBR."""
    audio = speech_like(44100)
    bits = 8 * len(streamed(audio, 44100)) / (len(audio) / 44100)
    assert 120_000 < bits < 140_000
