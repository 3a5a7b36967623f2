"""Fixtures shared by the server tests."""

from __future__ import annotations

import pytest

from audio8_coreai import TTS
from tests import clips
from tests.server.wyoming_support import make_voice


@pytest.fixture(scope="module")
def never_eos_tts(tiny_checkpoint, tmp_path_factory) -> TTS:
    """The tiny checkpoint that never draws eos (steered.py), its full context (sentences stay one utterance): every
    utterance runs to its cap. Its voice store holds ``ana`` (this checkpoint's), ``stranger`` (another's) and
    ``broken`` (a damaged file)."""
    from tests.steered import steer_eos

    never_eos = steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "never_eos", "never")
    tts = TTS.load(never_eos, device="cpu", voices_dir=tmp_path_factory.mktemp("voices"))
    tts.voices.save(make_voice("ana", tts.checkpoint.fingerprint()))
    tts.voices.save(make_voice("stranger", "f" * 64))
    tts.voices.path("broken").write_bytes(b"not a voice")
    return tts


@pytest.fixture(scope="module")
def voices_dir(tiny_checkpoint, tmp_path_factory):
    """A voice store holding ``ana`` (a 1.5 s sweep), made with the tiny checkpoint."""
    folder = tmp_path_factory.mktemp("voices")
    clip = clips.write(folder.parent / "ana.wav", clips.sweep(22050, 1.5), 22050)
    TTS.load(tiny_checkpoint, device="cpu", voices_dir=folder).register_voice("ana", clip, "A rising tone.")
    return folder
