"""The voice store (names, atomic writes, damaged files, checkpoint fingerprints) and cloning through the API."""

from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest

from audio8_coreai.errors import ConfigError, DamagedVoice, VoiceError
from audio8_coreai.voices import Voice, VoiceStore, check_name, default_voices_dir

TEXT = "The meeting has been moved to Thursday afternoon."


def make_voice(name: str = "alice", frames: int = 5, fingerprint: str = "f" * 64, seed: int = 0) -> Voice:
    codes = np.random.default_rng(seed).integers(0, 128, (10, frames))
    return Voice(codes, "Hello there.", 48000, 1.5, fingerprint, "2026-01-01T00:00:00+00:00", name, "/clips/a.wav")


# ---------------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    "name", ["alice", "Bob 2", "narrator_en-GB", "v1.2", "_x", "Zoë", "王小明", "a" * 64, "console", "null", "com10"]
)
def test_good_names(name):
    assert check_name(name) == name


def test_names_are_nfc():
    assert check_name("Zoe\u0308") == "Zo\u00eb"


@pytest.mark.parametrize(
    "name, why",
    [
        ("", "empty"),
        ("a" * 65, "65 characters"),
        ("a/b", "path separator"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        ("..\\x", "path separator"),
        (".hidden", "starts with '.'"),
        ("-opt", "starts with '-'"),
        (" lead", "starts with ' '"),
        ("trail ", "ends with ' '"),
        ("dot.", "ends with '.'"),
        ("a:b", "':'"),
        ("tab\tx", "'\\t'"),
        ("nul\0", "'\\x00'"),
        ("CON", "Windows reserves"),
        ("nul", "Windows reserves"),
        ("com1.voice", "Windows reserves"),
    ],
)
def test_bad_names_are_refused_with_the_rule(name, why):
    with pytest.raises(VoiceError, match="bad voice name") as e:
        check_name(name)
    assert why in str(e.value) and "no path separators" in str(e.value)


# ---------------------------------------------------------------------------------------------------
# The store


def test_round_trip_list_show_remove(tmp_path):
    store = VoiceStore(tmp_path / "voices")
    assert store.names() == []  # an absent folder holds no voices
    voice = make_voice("Zoë")
    path = store.save(voice)
    assert path == tmp_path / "voices" / "Zoë.npz"
    store.save(make_voice("bob"))
    assert store.names() == ["Zoë", "bob"]  # sorted by code point
    back = store.load("Zoe\u0308")  # the decomposed spelling finds the same voice
    assert back.codes.dtype == np.int64 and np.array_equal(back.codes, voice.codes)
    assert back.meta() == voice.meta()
    store.remove("bob")
    assert store.names() == ["Zoë"]
    with pytest.raises(VoiceError, match="no voice named 'bob'"):
        store.remove("bob")


def test_unknown_voice_suggests_close_names(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(make_voice("alice"))
    with pytest.raises(VoiceError, match="no voice named 'alcie'.*did you mean 'alice'"):
        store.load("alcie")


def test_a_taken_name_needs_replace(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(make_voice(seed=1))
    with pytest.raises(VoiceError, match="already exists"):
        store.save(make_voice(seed=2))
    for default in ("default", "DEFAULT"):  # a server's requests name its default voice so: a CLI stored one too
        with pytest.raises(VoiceError, match=f"{default!r} names the default voice in a server's requests"):
            store.save(make_voice(default))
    for text in ("false", "no", 0.5):  # a form's or config file's text: refused, the voice kept
        with pytest.raises(ConfigError, match=f"replace must be True, False or None, not {text!r}"):
            store.save(make_voice(seed=2), replace=text)
        assert np.array_equal(store.load("alice").codes, make_voice(seed=1).codes)
    store.save(make_voice(seed=2), replace=True)
    assert np.array_equal(store.load("alice").codes, make_voice(seed=2).codes)


def test_a_store_that_cannot_be_written_is_refused_before_any_work(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(VoiceError, match=r"cannot store voices in .*file is not a folder"):
        VoiceStore(blocker / "voices").check_new("alice")
    # the folder itself a file: refused as the store opens (it listed no voices, "no voice named 'ana' in FILE")
    with pytest.raises(VoiceError, match=f"the voices folder {blocker} is a file, not a folder: give a folder"):
        VoiceStore(blocker)


def test_a_folder_named_like_a_voice_is_no_voice(tmp_path):
    store = VoiceStore(tmp_path)
    (tmp_path / "dirv.npz").mkdir()
    assert store.names() == []
    for call in (store.load, store.remove):
        with pytest.raises(VoiceError, match="no voice named 'dirv'") as e:
            call("dirv")
        assert "did you mean" not in str(e.value)
    assert (tmp_path / "dirv.npz").is_dir()


def test_names_differing_only_in_case_are_refused(tmp_path):
    """One file on macOS and Windows disks: refused everywhere, so a store moves between machines intact."""
    store = VoiceStore(tmp_path)
    store.save(make_voice(seed=1))
    for replace in (False, True):
        with pytest.raises(VoiceError, match="'alice' already exists .* differ only in case"):
            store.save(make_voice(name="Alice", seed=2), replace=replace)
    assert store.names() == ["alice"]


def test_a_name_differing_only_in_case_finds_the_voice(tmp_path):
    """One voice whatever the case, for use as for conflicts (ALICE was 'no voice named' though 'alice' refused
    it as taken): load, find, the server's resolve and remove."""
    from audio8_coreai.server.voicenames import resolve

    store = VoiceStore(tmp_path)
    store.save(make_voice(seed=1))
    assert store.find("ALICE") == store.find("alice") == tmp_path / "alice.npz" and store.find("bob") is None
    assert store.load("ALICE").name == "alice"
    assert resolve("Alice", store, {}, None).name == "alice"
    assert store.remove("ALICE") == tmp_path / "alice.npz" and store.names() == []


def test_damaged_and_newer_files_are_refused_clearly(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(make_voice("cut"))
    path = tmp_path / "cut.npz"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(VoiceError, match=r"cut.npz is damaged.*audio8 voice rm cut"):
        store.load("cut")
    newer = make_voice("newer")
    store.save(newer)
    meta = {**newer.meta(), "format": 99}
    np.savez(tmp_path / "newer.npz", codes=newer.codes.astype(np.int16), meta=np.array(json.dumps(meta)))
    with pytest.raises(VoiceError, match="format 99"):
        store.load("newer")


@pytest.mark.parametrize("transcript", ["", "  ", "..."])
def test_a_file_whose_transcript_says_nothing_is_a_damaged_voice(tmp_path, transcript):
    """A hand-made file with no words in its transcript: damaged when read (it was listed healthy, then every text
    spoken with it failed with 'reference text is empty')."""
    store = VoiceStore(tmp_path)
    voice = make_voice("mute")
    store.save(voice)
    meta = {**voice.meta(), "transcript": transcript}
    np.savez(tmp_path / "mute.npz", codes=voice.codes.astype(np.int16), meta=np.array(json.dumps(meta)))
    with pytest.raises(DamagedVoice, match=r"mute.npz is damaged \(its transcript .*\).*audio8 voice rm mute"):
        store.load("mute")


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("transcript", 5, "transcript 5 is not a text"),  # it was read as '5'
        ("warnings", "abc", "warnings 'abc' are not a list of texts"),  # it was read as ('a', 'b', 'c')
        ("sample_rate", "44100", "sample_rate '44100' is not a whole number of Hz >= 1"),
        ("duration_s", -1.5, "duration_s -1.5 is not a number of seconds >= 0"),
        ("codebooks", True, "codebooks True is not a whole number >= 0"),
    ],
)
def test_a_file_whose_meta_holds_the_wrong_types_is_a_damaged_voice(tmp_path, field, value, why):
    """A hand-edited meta is checked, not converted: each field its type and range."""
    store = VoiceStore(tmp_path)
    voice = make_voice("edited")
    store.save(voice)
    meta = {**voice.meta(), field: value}
    np.savez(tmp_path / "edited.npz", codes=voice.codes.astype(np.int16), meta=np.array(json.dumps(meta)))
    with pytest.raises(DamagedVoice, match=f"edited.npz is damaged \\({why}\\)"):
        store.load("edited")


@pytest.mark.parametrize(
    "change, why",
    [
        ({"transcript": None}, "transcript None is not a text"),  # it was stored, then read as the text 'None'
        ({"transcript": ""}, "its transcript"),  # it was stored, then refused as damaged when read
        ({"warnings": ("clipped", 3)}, "warnings \\('clipped', 3\\) are not a list of texts"),
        ({"sample_rate": 0}, "sample_rate 0 is not a whole number of Hz >= 1"),
    ],
)
def test_a_voice_the_store_would_refuse_to_read_is_not_saved(tmp_path, change, why):
    store = VoiceStore(tmp_path)
    with pytest.raises(VoiceError, match=f"voice 'odd': {why}"):
        store.save(dataclasses.replace(make_voice("odd"), **change))
    assert store.names() == []
    store.save(dataclasses.replace(make_voice("odd"), sample_rate=np.int64(22050), duration_s=np.float32(1.5)))
    assert store.load("odd").sample_rate == 22050  # numpy numbers are numbers
    # as a hand-made voice of the last version may hold them: a list of warnings, whole numbers as floats
    store.save(dataclasses.replace(make_voice("hand"), warnings=["clipped"], sample_rate=44100.0, codebooks=10.0))
    hand = store.load("hand")
    assert (hand.warnings, hand.sample_rate, hand.codebooks, hand.duration_s) == (("clipped",), 44100, 10, 1.5)
    assert type(hand.sample_rate) is int and type(hand.codebooks) is int and type(hand.duration_s) is float


def rewrite_codes(path, codes: np.ndarray) -> None:
    """Replace the codes of the voice file ``path``, its meta kept (a damaged or hand-edited file)."""
    with np.load(path) as f:
        meta = f["meta"]
    np.savez(path, codes=codes.astype(np.int16), meta=meta)


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda c: np.where(np.arange(c.size).reshape(c.shape) == 12, 200, c), "code 200 at codebook 2, frame 2 is "),
        (lambda c: c[:9], "codes of 9 codebooks, where the codec that made them gives 10"),
        (lambda c: c - 200, "is outside \\[0, 128\\) of the codec"),
    ],
)
def test_codes_out_of_range_or_of_the_wrong_codebook_count_are_a_damaged_voice_when_read(tmp_path, damage, why):
    """The codes' shape and range are checked as the store reads the file (no model loaded), against what the codec
    that made them gives (recorded in the file): a damaged voice with its remedy, listed as damaged by the CLI."""
    from tests.cli.cli_support import run

    store = VoiceStore(tmp_path)
    voice = make_voice("edited")
    store.save(dataclasses.replace(voice, codebooks=10, codebook_size=128))
    assert store.load("edited").codebook_size == 128
    rewrite_codes(tmp_path / "edited.npz", damage(voice.codes))
    with pytest.raises(
        DamagedVoice, match=f"edited.npz is damaged \\(.*{why}.*remove it \\(`audio8 voice rm edited --voices "
    ):  # the store named: the hint without it acted on the per-user store ("no voice named 'edited'")
        store.load("edited")
    listed = run("voice", "list", "--voices", tmp_path)
    said = "".join(listed.output.split())  # rich may break the path anywhere
    assert listed.exit_code == 0 and "damaged:" in said and f"audio8voicermedited--voices{tmp_path}" in said


def test_codes_outside_their_codec_s_range_are_not_stored(tmp_path):
    voice = make_voice("wide")
    with pytest.raises(VoiceError, match="code 127 at codebook 0, frame 0 is outside \\[0, 100\\)"):
        codes = voice.codes.copy()
        codes[0, 0] = 127
        VoiceStore(tmp_path).save(dataclasses.replace(voice, codes=codes, codebook_size=100))
    assert VoiceStore(tmp_path).names() == []


def test_voice_from_another_checkpoint_is_refused(tmp_path):
    store = VoiceStore(tmp_path)
    store.save(make_voice(fingerprint="a" * 64))
    assert store.load("alice", fingerprint="a" * 64).name == "alice"
    with pytest.raises(
        VoiceError,
        match=r"another checkpoint \(fingerprint aaaaaaaaaaaa; this model's is "
        r"bbbbbbbbbbbb\).*/clips/a.wav.*voice add alice",
    ):
        store.load("alice", fingerprint="b" * 64)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="XDG_DATA_HOME applies on Linux")
def test_default_folder_is_the_per_user_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_voices_dir() == tmp_path / "audio8-coreai" / "voices"
    assert VoiceStore().root == tmp_path / "audio8-coreai" / "voices"


def test_a_huge_name_is_refused_without_echoing_it_whole():
    """A request may send 100,000 characters of name: the error shows its first 64 (a 400 of 100 KB before)."""
    with pytest.raises(VoiceError, match="it is 100000 characters long") as e:
        check_name("a" * 100_000)
    assert f"bad voice name {'a' * 64!r}...: " in str(e.value) and len(str(e.value)) < 400


def test_a_name_of_astral_letters_is_refused_by_its_bytes_before_any_file(tmp_path):
    """64 letters of 4 bytes each (U+1D400) are 256 bytes: a file name no file system takes (it failed writing the
    voice). 60 of them (240 bytes) are a name whose files fit."""
    with pytest.raises(VoiceError, match="it is 256 bytes in UTF-8"):
        check_name("\U0001d400" * 64)
    assert check_name("\U0001d400" * 60) == "\U0001d400" * 60


def test_a_voice_of_no_frames_is_said_to_have_none():
    from audio8_coreai.voice_rules import codes_problem

    assert codes_problem(np.zeros((10, 0), np.int16)) == "codes [10, 0]: no frames"  # said "not integers"
    assert codes_problem(np.zeros((10, 3), np.float32)).endswith("not integers [codebooks, frames]")
