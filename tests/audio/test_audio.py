"""Reading reference clips: formats, rates, channels, resampling, and the rules that refuse or warn."""

from __future__ import annotations

import os
import re
import struct

import numpy as np
import pytest
import soundfile as sf
import soxr

from audio8_coreai.audio import open_audio_writer, read_reference, write_audio
from audio8_coreai.errors import AudioError
from tests import clips

RATES = [8000, 16000, 22050, 44100, 48000]
# (extension, subtype): 16/24-bit integer and float WAV, 16/24-bit FLAC (FLAC has no float samples).
FORMATS = [("wav", "PCM_16"), ("wav", "PCM_24"), ("wav", "FLOAT"), ("flac", "PCM_16"), ("flac", "PCM_24")]


@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("ext, subtype", FORMATS)
def test_any_rate_channels_and_sample_format(tmp_path, rate, channels, ext, subtype):
    data = clips.sweep(rate, 1.0) if channels == 1 else clips.stereo(rate, 1.0)
    path = clips.write(tmp_path / f"clip.{ext}", data, rate, subtype)
    audio, info = read_reference(path)
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.flags.c_contiguous
    assert abs(len(audio) - 44100) <= 1  # 1.0 s at 44.1 kHz
    assert (info.sample_rate, info.channels, info.subtype) == (rate, channels, subtype)
    assert info.duration_s == pytest.approx(1.0)
    assert info.format == ext.upper()
    low_rate = [w for w in info.warnings if f"{rate} Hz" in w]
    assert bool(low_rate) == (rate < 16000) and len(info.warnings) == len(low_rate)
    # The level survives the mix-down and the resampling (RMS within 2 %).
    mono = data if channels == 1 else data.mean(axis=1)
    assert np.sqrt(np.mean(audio**2)) == pytest.approx(np.sqrt(np.mean(mono**2)), rel=0.02)


def test_channels_are_averaged_and_44k_is_not_resampled(tmp_path):
    left, right = clips.sweep(44100, 1.0), clips.bursts(44100, 1.0)
    path = clips.write(tmp_path / "s.wav", np.stack([left, right], axis=1), 44100, "FLOAT")
    audio, _ = read_reference(path)
    np.testing.assert_array_equal(audio, (np.stack([left, right], axis=1)).mean(axis=1))


def test_resampling_keeps_the_pitch(tmp_path):
    rate = 48000
    tone = (0.5 * np.sin(2 * np.pi * 1000 * np.arange(rate) / rate)).astype(np.float32)
    audio, _ = read_reference(clips.write(tmp_path / "tone.wav", tone, rate, "FLOAT"))
    spectrum = np.abs(np.fft.rfft(audio * np.hanning(len(audio))))
    assert np.fft.rfftfreq(len(audio), 1 / 44100)[spectrum.argmax()] == pytest.approx(1000, abs=1.5)
    np.testing.assert_allclose(audio, soxr.resample(tone, rate, 44100, quality="VHQ"), atol=1e-6)


@pytest.mark.parametrize(
    "ext, subtype",
    [("wav", "PCM_U8"), ("wav", "PCM_32"), ("ogg", "VORBIS"), ("aiff", "PCM_16"), ("mp3", "MPEG_LAYER_III")],
)
def test_more_containers_and_depths(tmp_path, ext, subtype):
    if not sf.check_format(ext.upper() if ext != "aiff" else "AIFF", subtype):
        pytest.skip(f"this libsndfile cannot write {ext}/{subtype}")
    audio, info = read_reference(clips.write(tmp_path / f"c.{ext}", clips.sweep(22050, 1.0), 22050, subtype))
    assert info.subtype == subtype
    assert abs(len(audio) / 44100 - 1.0) < 0.06  # mp3 may pad a few ms


def test_paths_with_spaces_and_non_ascii(tmp_path):
    path = clips.write(tmp_path / "dossier à espaces" / "クリップ ü.flac", clips.sweep(16000, 0.8), 16000)
    audio, info = read_reference(str(path))
    assert info.path == path and abs(len(audio) - round(0.8 * 44100)) <= 1


@pytest.mark.parametrize(
    "samples, shown",
    [(2400, "0.30 s"), (360000, "45.00 s"), (240010, "30.001 s"), (3995, "0.499 s")],  # past a limit: told so
)
def test_too_short_or_too_long_is_refused_with_the_duration(tmp_path, samples, shown):
    path = clips.write(tmp_path / "c.wav", clips.bursts(8000, 60)[:samples], 8000)
    with pytest.raises(AudioError, match=f"{shown} long.*0.5 to 30 s"):
        read_reference(path)


@pytest.mark.parametrize("rate, samples", [(8000, 4000), (8000, 240000), (44100, 22050), (16000, 480000)])
def test_a_clip_of_exactly_a_limit_is_taken(tmp_path, rate, samples):
    """0.5 s and 30 s are inside "0.5 to 30 s" (they stopped in the duration's wording: a StopIteration)."""
    path = clips.write(tmp_path / "c.wav", clips.bursts(rate, 30)[:samples], rate)
    audio, info = read_reference(path)
    assert info.duration_s == samples / rate and abs(len(audio) - round(samples / rate * 44100)) <= 1


@pytest.mark.parametrize("rate, samples", [(1, 3), (100, 300), (4000, 4000)])
def test_a_clip_of_too_few_samples_is_refused_whatever_its_length_in_seconds(tmp_path, rate, samples):
    """Three samples at 1 Hz are "3 s" by the header: a voice needs a rate that holds speech (8 kHz) as well."""
    path = clips.write(tmp_path / "c.wav", clips.bursts(8000, 1.0)[:samples], rate)
    with pytest.raises(AudioError, match=f"{samples} samples at {rate} Hz.*8000 Hz"):
        read_reference(path)


def test_long_file_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = clips.write(tmp_path / "long.wav", np.zeros((8000 * 45, 1), np.float32), 8000)

    def no_read(*args, **kwargs):
        raise AssertionError("the samples were read")

    monkeypatch.setattr(sf.SoundFile, "read", no_read)
    with pytest.raises(AudioError, match="45.00 s"):
        read_reference(path)


@pytest.mark.parametrize("subtype", ["GSM610", "G721_32"])
def test_a_wav_libsndfile_cannot_seek_is_read(tmp_path, subtype):
    """GSM 6.10 and G.721 WAVs are not seekable to libsndfile: a read without a frame count raised ValueError."""
    path = clips.write(tmp_path / "c.wav", clips.bursts(8000, 3.0), 8000, subtype)
    audio, info = read_reference(path)
    assert info.subtype == subtype and info.duration_s == pytest.approx(3.0, abs=0.05)
    assert abs(len(audio) - round(info.duration_s * 44100)) <= 1


def _without_length(path):
    """``path``, a FLAC, with its header's sample count zeroed: 'unknown', as an encoder writing to a pipe leaves it."""
    data = bytearray(path.read_bytes())
    data[21] &= 0xF0
    data[22:26] = bytes(4)
    path.write_bytes(data)
    return path


def test_a_flac_of_unknown_length_is_read_and_bounded(tmp_path):
    """libsndfile gives such a file 2**63 - 1 frames: it was refused as "209146758205323.72 s long"."""
    whole = clips.write(tmp_path / "whole.flac", clips.bursts(16000, 3.0), 16000)
    unknown = _without_length(clips.write(tmp_path / "unknown.flac", clips.bursts(16000, 3.0), 16000))
    assert sf.info(str(unknown)).frames == 2**63 - 1
    assert np.array_equal(read_reference(unknown)[0], read_reference(whole)[0])
    long = _without_length(clips.write(tmp_path / "long.flac", clips.bursts(16000, 40.0), 16000))
    with pytest.raises(AudioError, match="is over 30 s long; a voice needs 0.5 to 30 s"):
        read_reference(long)


def test_digital_silence_is_refused(tmp_path):
    with pytest.raises(AudioError, match="digital silence"):
        read_reference(clips.write(tmp_path / "z.wav", np.zeros(44100, np.float32), 44100))


@pytest.mark.parametrize("subtype", ["FLOAT", "PCM_16"])
def test_channels_that_cancel_out_are_told_as_such(tmp_path, subtype):
    """[x, -x]: no sample is 0, their average is (it was called "every sample is 0"); in 16 bits nearly so (the
    rounding leaves steps of 1)."""
    x = clips.sweep(44100, 1.0)
    with pytest.raises(AudioError, match="channels cancel out: their average"):
        read_reference(clips.write(tmp_path / "z.wav", np.stack([x, -x], axis=1), 44100, subtype))


def test_a_float_clip_over_full_scale_gets_a_warning(tmp_path):
    _, info = read_reference(clips.write(tmp_path / "hot.wav", clips.sweep(44100, 1.0, 30.0), 44100, "FLOAT"))
    assert info.peak_dbfs == pytest.approx(29.5, abs=0.1)
    assert [w for w in info.warnings if "over full scale (peak +29.5 dBFS" in w]


@pytest.mark.parametrize("kind", ["one blip", "a constant offset"])
def test_nearly_all_silence_is_refused(tmp_path, kind):
    rate = 16000
    if kind == "one blip":  # 0.2 s of sound in 5 s
        data = np.zeros(5 * rate, np.float32)
        data[rate : rate + rate // 5] = clips.sweep(rate, 0.2)
    else:  # DC at 5 times full scale, 3 s: no sound (it was taken for a voice), however loud
        data = np.full(3 * rate, 5.0, np.float32)
    with pytest.raises(AudioError, match="nearly all silence") as refused:
        read_reference(clips.write(tmp_path / "q.wav", data, rate, "FLOAT"))
    assert "varies above -50 dBFS (a steady level, however loud, is no sound)" in str(refused.value)


@pytest.mark.parametrize("kind", ["speech at -55 dBFS", "hiss"])
def test_a_clip_too_quiet_to_hear_is_told_to_be_raised(tmp_path, kind):
    """Under -50 dBFS everywhere a real recording is "too quiet", not "nearly all silence" (said of a steady level)."""
    rate = 16000
    if kind == "hiss":  # steady noise at about -65 dBFS RMS
        data = np.random.default_rng(1).normal(0, 10 ** (-65 / 20), 2 * rate).astype(np.float32)
    else:
        data = clips.bursts(rate, 3.0, amplitude=10 ** (-55 / 20))
    with pytest.raises(AudioError, match=r"is too quiet to hear a voice in \(peak -5\d\.\d dBFS.*raise its level"):
        read_reference(clips.write(tmp_path / "q.wav", data, rate, "FLOAT"))


@pytest.mark.parametrize("given, said", [("", "no reference clip given"), ("-", "not from stdin ('-')")])
def test_no_path_or_stdin_is_said(given, said):
    with pytest.raises(AudioError, match=re.escape(said)):
        read_reference(given)


def test_an_empty_file_is_said(tmp_path):
    (tmp_path / "empty.wav").write_bytes(b"")
    with pytest.raises(AudioError, match=r"empty.wav is an empty file \(0 bytes\)"):
        read_reference(tmp_path / "empty.wav")


def test_half_silence_is_accepted(tmp_path):
    read_reference(clips.write(tmp_path / "b.wav", clips.bursts(22050, 1.0), 22050))


def test_clipping_gets_a_warning_and_a_full_scale_sine_does_not(tmp_path):
    loud = np.clip(clips.sweep(44100, 1.0, amplitude=1.6), -1, 1)
    _, info = read_reference(clips.write(tmp_path / "clip.wav", loud, 44100, "PCM_16"))
    assert any("clipped" in w for w in info.warnings)
    for subtype in ("FLOAT", "PCM_16"):  # the sweep's 100 Hz crests span several samples above 0.999
        _, info = read_reference(clips.write(tmp_path / "full.wav", clips.sweep(44100, 1.0, 1.0), 44100, subtype))
        assert info.warnings == []


def test_very_low_level_gets_a_warning(tmp_path):
    _, info = read_reference(clips.write(tmp_path / "quiet.wav", clips.sweep(44100, 1.0, 0.01), 44100, "PCM_24"))
    assert info.peak_dbfs == pytest.approx(-40, abs=0.5)
    assert [w for w in info.warnings if "very quiet" in w and "-40" in w]


@pytest.mark.parametrize("kind", ["not audio", "truncated header"])
def test_unreadable_files_are_refused_clearly(tmp_path, kind):
    path = tmp_path / "broken.wav"
    good = clips.write(tmp_path / "good.wav", clips.sweep(16000, 1.0), 16000).read_bytes()
    path.write_bytes({"not audio": b"this is text, not sound\n" * 20, "truncated header": good[:30]}[kind])
    with pytest.raises(AudioError, match="cannot read reference audio .*broken.wav") as refused:
        read_reference(path)
    assert str(path) in str(refused.value) and "b'" not in str(refused.value)  # the name once, as given


def _wav_with(tmp_path, before_data: bytes = b"", data_size: int | None = None, keep: float = 1.0):
    """A 2 s 16 kHz PCM_16 WAV (64,000 bytes of samples) with a chunk before ``data``, the ``data`` size field set
    to ``data_size`` and only ``keep`` of its samples left in the file."""
    raw = clips.write(tmp_path / "whole.wav", clips.sweep(16000, 2.0), 16000, "PCM_16").read_bytes()
    at = raw.index(b"data")
    samples = raw[at + 8 :]
    size = len(samples) if data_size is None else data_size
    head = raw[12:at] + before_data + b"data" + struct.pack("<I", size)
    body = head + samples[: round(len(samples) * keep)]
    path = tmp_path / "clip.wav"
    path.write_bytes(b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body)
    return path


@pytest.mark.parametrize("before_data", [b"", b"LIST" + struct.pack("<I", 5) + b"INFOx\0"])  # odd: padded
def test_a_wav_cut_short_is_refused_and_one_from_a_pipe_is_read(tmp_path, before_data):
    assert read_reference(_wav_with(tmp_path, before_data))[0].shape == (2 * 44100,)
    with pytest.raises(
        AudioError, match=r"clip.wav is cut short: .* 64000 bytes of samples and the file holds 38400 \(60.0 %\)"
    ):
        read_reference(_wav_with(tmp_path, before_data, keep=0.6))
    assert read_reference(_wav_with(tmp_path, before_data, keep=0.995))[0].shape[0] > 2 * 44100 * 0.99  # a slip
    for unknown in (0xFFFFFFFF, 0x7FFFF000):  # ffmpeg's and sox's placeholders: a pipe cannot seek back
        assert read_reference(_wav_with(tmp_path, before_data, data_size=unknown))[0].shape == (2 * 44100,)


def test_nan_samples_are_refused(tmp_path):
    data = clips.sweep(16000, 1.0)
    data[100] = np.nan
    with pytest.raises(AudioError, match="NaN"):
        read_reference(clips.write(tmp_path / "nan.wav", data, 16000, "FLOAT"))


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(AudioError, match="does not exist"):
        read_reference(tmp_path / "nope.wav")
    with pytest.raises(AudioError, match="is a folder"):
        read_reference(tmp_path)
    with pytest.raises(AudioError, match="/dev/null is not a regular file"):
        read_reference("/dev/null")


def test_file_names_that_are_no_utf8_are_read_and_written(tmp_path):
    """A name from a Latin-1 archive (byte 0xE9, no UTF-8) reaches Python with a surrogate escape: read and written
    as bytes, not a UnicodeEncodeError after the synthesis."""
    name = os.fsdecode(b"caf\xe9")
    clip = clips.write(tmp_path / "ref.wav", clips.sweep(22050, 1.0), 22050).rename(tmp_path / f"{name}-ref.wav")
    audio, _ = read_reference(clip)
    assert audio.shape == (44100,)  # 1 s at the codec's 44.1 kHz
    speech = np.linspace(-0.5, 0.5, 4096, dtype=np.float32)
    for ext in (".wav", ".flac"):
        assert sf.info(os.fsencode(write_audio(tmp_path / f"{name}{ext}", speech, 44100))).frames == 4096
    with open_audio_writer(tmp_path / f"{name}-stream.wav", 44100) as writer:
        writer.write(speech)
    assert sf.info(os.fsencode(tmp_path / f"{name}-stream.wav")).frames == 4096
    assert b"caf\xe9.wav" in os.listdir(os.fsencode(tmp_path))


@pytest.mark.skipif(clips.ESPEAK is None, reason="espeak-ng is not installed")
def test_espeak_speech_reads_without_warnings(tmp_path):
    path = clips.speech(tmp_path / "speech.wav")
    audio, info = read_reference(path)
    assert info.sample_rate == 22050 and info.warnings == []
    assert len(audio) == pytest.approx(info.duration_s * 44100, abs=1)
