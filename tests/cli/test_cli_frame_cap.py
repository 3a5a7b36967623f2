"""`audio8 say`'s warning of speech stopped at its frame cap: what it says to do, one utterance or a split text."""

from __future__ import annotations

import json
import re

import pytest

from audio8_coreai.errors import EngineError
from tests.cli.cli_support import run


def test_frame_cap_warning_says_when_the_context_is_full(never_eos_checkpoint, tmp_path):
    # a checkpoint that never draws eos runs to the frames its prompt leaves of its 128-position context
    model = ("--model", never_eos_checkpoint, "--device", "cpu")
    room = 128 - json.loads(run("prompt", "Hi.", "--model", never_eos_checkpoint, "--json").output)["shape"][1]
    result = run("say", "Hi.", "-o", tmp_path / "full.wav", *model)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"stopped at the frame cap ({room} frames)" in said and "the context is full" in said
    # text whose prompt fits but whose estimated speech would not is split, not cut at the cap
    result = run("say", " ".join(["Hi."] * 6), "-o", tmp_path / "long.wav", *model, "--max-frames", 4)
    assert result.exit_code == 0 and "split into sentences" in result.output
    result = run("say", "Hi.", "-o", tmp_path / "cap.wav", *model, "--max-frames", 3)
    said = " ".join(result.output.split())
    assert "stopped at the frame cap (3 frames)" in said and "raise --max-frames" in said
    assert result.output.startswith("warning:")  # off a terminal, no blank line where the progress bar was


def test_the_cap_warning_of_split_text_suggests_a_frame_cap_the_context_takes(never_eos_checkpoint, tmp_path):
    """Split (streamed) text stopped at --max-frames: the warning names the most --max-frames every piece's context
    takes, and the API takes exactly that much and refuses one more."""
    from audio8_coreai import TTS

    text = "Hi. Hi. Hi. Hi."  # pieces of a few tokens on this 128-position context
    model = ("--model", never_eos_checkpoint, "--device", "cpu", "--seed", 1)
    result = run("say", text, "-o", tmp_path / "split.wav", *model, "--stream", "--max-frames", 2)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    most = int(re.search(r"raise --max-frames, up to (\d+)", said).group(1))
    tts = TTS.load(never_eos_checkpoint, device="cpu")
    assert len(tts.stream(text, max_frames=most).pieces) >= 2
    with pytest.raises(EngineError, match="at most"):
        tts.stream(text, max_frames=most + 1)


def test_the_cap_warning_of_a_stream_at_the_context_says_shorten(never_eos_checkpoint, tmp_path):
    from audio8_coreai import TTS

    room = 128 - TTS.load(never_eos_checkpoint, device="cpu").prompts.plain("Hi.").shape[1]
    args = ("--model", never_eos_checkpoint, "--device", "cpu", "--stream", "--max-frames", room)
    result = run("say", "Hi.", "-o", tmp_path / "full.wav", *args)
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and "the context is full" in said and "raise --max-frames" not in said, said
    assert "shorten the text" in said


def test_the_cap_warning_of_a_split_text_at_the_context_says_what_a_split_text_can_do(never_eos_checkpoint, tmp_path):
    """Pieces the split made, stopped where the context is full: "shorten the text" was advice a long text's reader
    could not act on (a new-user trial); shorter sentences or another seed they can."""
    from audio8_coreai import TTS

    text = " ".join(["Hi."] * 6)
    pieces = TTS.load(never_eos_checkpoint, device="cpu").stream(text).pieces
    most = min(128 - p.prompt.shape[1] for p in pieces)
    args = ("--model", never_eos_checkpoint, "--device", "cpu", "--stream", "--max-frames", most)
    result = run("say", text, "-o", tmp_path / "split.wav", *args)
    said = " ".join(result.output.split())
    assert result.exit_code == 0 and len(pieces) >= 2, said
    assert "the context is full: shorter sentences make shorter pieces, or try another --seed" in said, said
