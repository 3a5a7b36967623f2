"""Cloning through the API (tiny checkpoint): registering a voice from a clip, speaking by its name, the context's
limits on a reference, voices of another checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from audio8_coreai.errors import AudioError, ClipWarning, ConfigError, PromptError, VoiceError
from audio8_coreai.voices import VoiceStore
from tests import clips
from tests.test_voices import make_voice

TEXT = "The meeting has been moved to Thursday afternoon."


@pytest.fixture()
def tts(tiny_tts, tmp_path, monkeypatch):
    """The tiny TTS with its voice store in a fresh folder."""
    monkeypatch.setattr(tiny_tts, "voices", VoiceStore(tmp_path / "voices"))
    return tiny_tts


@pytest.fixture(scope="module")
def ref_clip(tmp_path_factory):
    """A 0.75 s stereo 48 kHz 24-bit clip (sweep left, noise bursts right)."""
    return clips.write(tmp_path_factory.mktemp("ref") / "réf clip.wav", clips.stereo(48000, 0.75), 48000, "PCM_24")


def test_register_then_speak_by_name_equals_the_clip_inline(tts, ref_clip):
    voice = tts.register_voice("alice", ref_clip, "Hello there, how are you?")
    assert voice.codes.shape == (10, 17)  # ceil(0.75 * 44100 / 2048)
    assert (voice.sample_rate, voice.duration_s, voice.name) == (48000, 0.75, "alice")
    assert voice.fingerprint == tts.checkpoint.fingerprint() and voice.source == str(ref_clip)
    assert (voice.codebooks, voice.codebook_size) == (10, tts.config.codebook_size)
    assert tts.voices.load("alice").codebook_size == tts.config.codebook_size  # recorded in the file
    assert tts.voices.names() == ["alice"]
    by_name = tts.generate(TEXT, voice="alice", seed=5, max_frames=8)
    inline = tts.generate(TEXT, ref_audio=ref_clip, ref_text="Hello there, how are you?", seed=5, max_frames=8)
    assert by_name.frames > 0
    assert np.array_equal(by_name.codes, inline.codes) and np.array_equal(by_name.audio, inline.audio)
    # The clone prompt: the plain one plus the reference (17 frames) and its transcript.
    want = tts.prompts.clone(TEXT, "Hello there, how are you?", voice.codes)
    assert by_name.prompt_length == want.shape[1] > tts.prompts.plain(TEXT).shape[1] + 17


def test_register_into_another_store(tts, ref_clip, tmp_path):
    tts.register_voice("bob", ref_clip, "Hi.", store=tmp_path / "elsewhere")
    assert VoiceStore(tmp_path / "elsewhere").names() == ["bob"] and tts.voices.names() == []


def test_a_bad_or_taken_name_fails_before_the_clip_is_read(tts, tmp_path):
    with pytest.raises(VoiceError, match="bad voice name"):
        tts.register_voice("../escape", tmp_path / "missing.wav", "Hi.")
    tts.voices.save(make_voice("taken", fingerprint=tts.checkpoint.fingerprint()))
    with pytest.raises(VoiceError, match="already exists"):
        tts.register_voice("taken", tmp_path / "missing.wav", "Hi.")
    with pytest.raises(AudioError, match="does not exist"):
        tts.register_voice("taken", tmp_path / "missing.wav", "Hi.", replace=True)
    for keyword in ("replace", "warn"):  # 'false' would be on: refused before the clip is read
        with pytest.raises(ConfigError, match=f"{keyword} must be True, False or None, not 'false'"):
            tts.register_voice("taken", tmp_path / "missing.wav", "Hi.", **{keyword: "false"})


def test_a_reference_too_long_for_the_context_is_refused_with_the_numbers(tts, tmp_path):
    # The tiny model's context is 512 positions: 20 s of reference is 431 frames.
    clip = clips.write(tmp_path / "long.flac", clips.bursts(16000, 20.0), 16000)
    said = r"431 frames \(20.0 s\).*of the context's 512 positions.*at most \d+\.\d s"
    with pytest.raises(VoiceError, match=said) as e:
        tts.register_voice("long", clip, "Hello.")
    assert tts.voices.names() == [] and e.value.field == "ref_audio"  # the HTTP form's audio


def test_a_transcript_too_long_for_the_context_is_refused_with_its_length(tts, ref_clip):
    # 300 x "word " is 1499 byte tokens (the last space is trimmed): the transcript alone overfills 512 positions.
    with pytest.raises(VoiceError, match=r"transcript is too long for this model: 1499 tokens.*holds 512 positions"):
        tts.register_voice("wordy", ref_clip, "word " * 300)
    assert tts.voices.names() == []


def test_a_voice_that_leaves_little_room_says_so_when_added_and_when_text_cannot_be_split(tts, tmp_path):
    """14 s of reference on the tiny model's 512 positions leave a piece a few tokens of text: said at once (it
    was said only when a text could not be split), as a clip's other warnings; a 1 s clip leaves room."""
    clip = clips.write(tmp_path / "long.flac", clips.bursts(16000, 14.0), 16000)
    with pytest.warns(ClipWarning, match=r"long.flac leaves room for \d tokens of text a piece .* of 512 positions"):
        tts.register_voice("roomy", clip, "Hello.")
    short = clips.write(tmp_path / "short.flac", clips.bursts(16000, 1.0), 16000)
    assert not [w for w in tts.voice_from_clip(short, "Hello.").warnings if "leaves room" in w]
    with pytest.raises(PromptError, match=r"cannot split.*takes \d+ of the context's 512 positions.*shorter clip"):
        tts.stream("Hello there, everyone. Wonderful weather today.", voice="roomy", seed=1)


def test_files_moved_into_place_after_load_change_neither_fingerprint_nor_codec(tiny_checkpoint, tmp_path):
    """A loaded model keeps its fingerprint and encodes voices with its own codec when new checkpoint files are
    moved into place (as an update does), even when the encoder is first built, or rebuilt, after the move."""
    import shutil

    from audio8_coreai import TTS
    from audio8_coreai.checkpoint import make_checkpoint

    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    other = make_checkpoint(tmp_path / "other", "tiny", seed=5)
    short = clips.write(tmp_path / "short.wav", clips.stereo(44100, 0.75), 44100)
    long = clips.write(tmp_path / "long.wav", clips.bursts(44100, 3.0), 44100)
    loaded = TTS.load(ckpt, device="cpu", voices_dir=tmp_path / "voices")
    fingerprint = loaded.checkpoint.fingerprint()
    loaded.voice_from_clip(short, "Short.")  # the encoder is built, sized for the short clip
    for name in ("model.safetensors", "codec.pth"):
        shutil.copy(other / name, ckpt / f"{name}.new")
        (ckpt / f"{name}.new").rename(ckpt / name)
    voice = loaded.voice_from_clip(long, "Long.")  # rebuilt for the longer clip, after the move
    fresh = TTS.load(tiny_checkpoint, device="cpu").voice_from_clip(long, "Long.")
    assert voice.fingerprint == fingerprint == fresh.fingerprint
    assert np.array_equal(voice.codes, fresh.codes)
    assert loaded.generate("Hello.", voice=voice, seed=1, max_frames=4).frames > 0


def test_voice_from_another_checkpoint_is_refused_at_synthesis(tts):
    tts.voices.save(make_voice("other", fingerprint="0" * 64))
    with pytest.raises(VoiceError, match="another checkpoint"):
        tts.generate(TEXT, voice="other", seed=0, max_frames=5)
    with pytest.raises(VoiceError, match="another checkpoint"):
        tts.generate(TEXT, voice=make_voice(fingerprint="0" * 64), seed=0, max_frames=5)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"voice": "x", "ref_audio": "a.wav", "ref_text": "Hi."}, "not both"),
        ({"ref_audio": "a.wav"}, "needs both"),
        ({"ref_text": "Hi."}, "needs both"),
        ({"voice": "nobody"}, "no voice named"),
    ],
)
def test_voice_arguments_are_checked(tts, kwargs, needle):
    with pytest.raises(VoiceError, match=needle):
        tts.generate(TEXT, seed=0, max_frames=5, **kwargs)


@pytest.mark.skipif(clips.ESPEAK is None, reason="espeak-ng is not installed")
def test_a_voice_from_espeak_speech(tts, tmp_path):
    clip = clips.speech(tmp_path / "speech.wav", "Hello, this is a test.")
    voice = tts.register_voice("espeak", clip, "Hello, this is a test.")
    assert voice.sample_rate == 22050 and voice.warnings == ()
    assert voice.frames == -(-round(voice.duration_s * 44100) // 2048)
    assert tts.generate("Good morning.", voice="espeak", seed=1, max_frames=4).codes.shape[1] <= 4
