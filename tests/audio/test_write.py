"""Writing speech out: mono finite samples at a whole rate, chunk by chunk; formats that hold no samples, a full disk,
a folder given as the output."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from audio8_coreai.audio import SpeechEncoder, check_writable, encode_speech, open_audio_writer, write_audio
from audio8_coreai.errors import AudioError


def test_no_samples_are_written_where_the_format_holds_none(tmp_path):
    """flac, mp3, aac and opus encoders write no readable file for no samples (0 bytes, or an Ogg with no page):
    refused; wav, pcm and ogg (Vorbis) hold none."""
    empty = np.zeros(0, np.float32)
    for fmt in ("flac", "mp3", "aac", "opus"):
        with pytest.raises(AudioError, match=f"holds no samples, which {fmt} cannot hold"):
            encode_speech(empty, 44100, fmt)
    with pytest.raises(AudioError, match="holds no samples, which flac cannot hold"):
        write_audio(tmp_path / "out.flac", empty, 44100)
    assert not (tmp_path / "out.flac").exists()
    assert len(encode_speech(empty, 44100, "wav")) == 44 and encode_speech(empty, 44100, "pcm") == b""
    for fmt in ("mp3", "opus", "aac"):  # streamed, no chunk written: nothing readable to close with
        with pytest.raises(AudioError, match=f"holds no samples, which {fmt} cannot hold"):
            SpeechEncoder(fmt, 44100).close()
    assert len(SpeechEncoder("wav", 44100).close()) == 44
    with (
        pytest.raises(AudioError, match="holds no samples, which flac cannot hold"),
        open_audio_writer(tmp_path / "s.flac", 44100),
    ):
        pass  # streamed, no chunk came
    assert list(tmp_path.glob("*s.*flac")) == []
    assert sf.info(write_audio(tmp_path / "out.ogg", empty, 44100)).frames == 0


@pytest.mark.parametrize(
    ("audio", "rate", "message"),
    [
        (np.full(1000, np.nan, np.float32), 44100, "holds 1000 NaN or infinite samples"),  # LAME aborted on NaN
        (np.zeros((1000, 2), np.float32), 44100, r"must be mono \[samples\], not shape \[1000, 2\]"),
        (np.zeros(1000, np.float32), 44100.5, "sample_rate must be a whole number of Hz >= 1, not 44100.5"),
        (np.zeros(1000, np.float32), 0, "sample_rate must be a whole number of Hz >= 1, not 0"),
        (np.zeros(1000, np.int16), 44100, r"is int16 samples: give float samples in \[-1, 1\] \(int16 samples: divide"),
        ((np.zeros(1000, np.float32), 44100), 44100, r"got an \(audio, sample_rate\) pair: synthesize\(\) returns"),
    ],
)
def test_speech_out_is_mono_finite_at_a_whole_rate(tmp_path, audio, rate, message):
    """encode_speech (every format) and write_audio refuse what they cannot write faithfully (integer samples would
    be written unscaled: 32767 times full scale); one channel shaped [1, N] is mono."""
    for fmt in ("wav", "mp3", "flac"):
        with pytest.raises(AudioError, match=message):
            encode_speech(audio, rate, fmt)
    with pytest.raises(AudioError, match=message):
        write_audio(tmp_path / "out.wav", audio, rate)
    assert not (tmp_path / "out.wav").exists()
    one = np.linspace(-0.5, 0.5, 1000, dtype=np.float32)
    assert encode_speech(one[None], 44100, "wav") == encode_speech(one, 44100, "wav")


@pytest.mark.parametrize(
    "chunk, message",
    [(np.array([0.1, np.nan], np.float32), "holds 1 NaN"), (np.zeros((100, 2), np.float32), "must be mono")],
)
def test_each_chunk_written_as_it_comes_is_checked(tmp_path, chunk, message):
    """SpeechEncoder.write and open_audio_writer's write: the chunk path of the same check."""
    from audio8_coreai.audio import SpeechEncoder, open_audio_writer

    encoder = SpeechEncoder("mp3", 44100)
    encoder.write(np.zeros(100, np.float32))
    with pytest.raises(AudioError, match=message):
        encoder.write(chunk)
    encoder.discard()
    with pytest.raises(AudioError, match=message), open_audio_writer(tmp_path / "out.wav", 44100) as f:
        f.write(np.zeros(100, np.float32))
        f.write(chunk)
    assert not (tmp_path / "out.wav").exists()  # the block failed: the target is not written


def test_a_failed_write_is_an_audio_error_that_names_a_full_disk(tmp_path, monkeypatch):
    """A full disk mid-stream (libsndfile says only 'System error.') and a folder that refuses new files: one
    clear AudioError naming the user's file, the target left as it was, the partial file that filled the disk
    removed, never a traceback."""
    import shutil
    from collections import namedtuple

    from audio8_coreai.audio import open_audio_writer, partial_path, write_audio

    out = tmp_path / "keep.wav"
    out.write_bytes(b"old")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(10 << 20, 10 << 20, 0))

    def full(self, data):
        raise sf.LibsndfileError(0, "System error.")

    with pytest.raises(AudioError, match=r"cannot write .*/keep\.wav: .*the disk is full") as caught:
        with open_audio_writer(out, 44100) as f:
            f.write(np.zeros(4096, np.float32))
            f.flush()
            assert f.frames == 4096
            monkeypatch.setattr(sf.SoundFile, "write", full)
            f.write(np.zeros(4096, np.float32))
    assert "partial" not in str(caught.value)
    assert out.read_bytes() == b"old" and not partial_path(out).exists()  # its space given back

    def no_temp_file(**kwargs):  # as mkstemp fails in /proc: naming the hidden temporary file
        raise FileNotFoundError(2, "No such file or directory", str(tmp_path / ".keep.wav.p8bhc020.wav"))

    import tempfile

    monkeypatch.setattr(tempfile, "mkstemp", no_temp_file)
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(10 << 20, 0, 10 << 20))  # room enough
    with pytest.raises(AudioError) as caught:
        write_audio(out, np.zeros(100, np.float32), 44100)
    assert str(caught.value) == (
        f"cannot write {out}: No such file or directory (no file can be made in {tmp_path}: write elsewhere)"
    )
    assert out.read_bytes() == b"old"


def test_a_file_system_without_a_size_is_not_called_full(tmp_path, monkeypatch):
    """A folder whose file system reports no size at all (a pseudo file system such as /proc: total 0, free 0)
    that refuses the file: the error names the user's file, not a full disk; a write opened for streaming names
    the user's file too, not the hidden partial one."""
    import shutil
    from collections import namedtuple

    from audio8_coreai.audio import open_audio_writer

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda folder: usage(0, 0, 0))

    def refused(*args, **kwargs):
        raise sf.LibsndfileError(0, "System error.")

    monkeypatch.setattr(sf, "SoundFile", refused)
    out = tmp_path / "speech.wav"
    with pytest.raises(AudioError) as caught:
        with open_audio_writer(out, 44100):
            pass
    message = str(caught.value)
    assert message.startswith(f"cannot write {out}:") and "full" not in message


@pytest.mark.parametrize("name", ["out", "out.wav"])
def test_a_folder_given_as_the_output_is_told_as_a_folder(tmp_path, name):
    """A folder named as the output file, with or without an audio suffix: told it is a folder, with a file name
    to give instead (not a refused suffix)."""
    folder = tmp_path / name
    folder.mkdir()
    with pytest.raises(AudioError, match=rf"{folder} is a folder: give a file name such as {folder}/speech.wav"):
        check_writable(folder)
