"""`audio8 prompt`: the [11, P] prompt the model sees, from config.json and the tokenizer alone; a long text's pieces
as `say` speaks them; a clone's from reference codes or a stored voice."""

from __future__ import annotations

import json
import shutil

import numpy as np

from audio8_coreai.voices import Voice, VoiceStore
from tests.cli.cli_support import run


def test_prompt_json_needs_only_config_and_tokenizer(tiny_checkpoint, tmp_path):
    light = tmp_path / "light"
    light.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoint / name, light / name)
    result = run("prompt", "Hi", "--model", light, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["shape"][0] == 11
    row0 = data["prompt"][0]
    # <|im_start|> ... "user\n" then "Hi" as two bytes (ids 3 + byte), <|im_end|> ... <|voice|> last.
    assert row0[0] == 1 and row0[-1] == 259
    user = [3 + b for b in b"user\n"] + [3 + ord("H"), 3 + ord("i"), 2]
    assert any(row0[i : i + len(user)] == user for i in range(len(row0)))


def test_prompt_of_a_long_text_is_the_pieces_say_speaks(tiny_checkpoint):
    """A text too long for one utterance is spoken in pieces, each with its prompt: prompt shows those, not one
    prompt of the whole text that the model never sees."""
    from audio8_coreai import TTS
    from audio8_coreai.request import check_request

    text = "Yes, we can. " * 150
    result = run("prompt", text, "--model", tiny_checkpoint, "--json")
    assert result.exit_code == 0, result.output
    pieces = json.loads(result.output)["pieces"]
    plan = TTS.load(tiny_checkpoint, device="cpu").plan(check_request(text))
    assert len(pieces) == len(plan.pieces) > 1
    for shown, piece in zip(pieces, plan.pieces):
        assert shown["text"] == piece.text and np.array_equal(np.array(shown["prompt"]), piece.prompt)
    assert " ".join(p["text"] for p in pieces) == text.strip()
    ids = sum(np.array(p["prompt"]).size for p in pieces)  # written compactly: a book's ids were 12x its bytes
    assert result.output.count("\n") == 1 and len(result.output) < 4 * ids
    said = run("prompt", text, "--model", tiny_checkpoint).output
    assert said.count("prompt [11, ") == len(pieces) and f"piece {len(pieces)} of {len(pieces)}: " in said


def test_a_clone_prompt_of_a_long_text_is_pieces_too(tiny_checkpoint, tmp_path):
    codes = np.random.default_rng(0).integers(0, 64, (10, 100))
    np.save(tmp_path / "ref.npy", codes)
    args = ("--model", tiny_checkpoint, "--ref-text", "Hello there.", "--ref-codes", tmp_path / "ref.npy", "--json")
    result = run("prompt", "Yes, we can. " * 150, *args)
    assert result.exit_code == 0, result.output
    pieces = [np.array(p["prompt"]) for p in json.loads(result.output)["pieces"]]
    assert len(pieces) > 1  # it was one prompt of the whole text, refused as too long for the context
    for p in pieces:  # rows 1.. hold the reference codes in each piece's head, zero elsewhere
        cols = np.flatnonzero(p[1:].any(axis=0))
        assert np.array_equal(p[1:, cols[0] : cols[0] + 100], codes) and p[1:].sum() == codes.sum()


def test_prompt_clone_with_reference_codes(tiny_checkpoint, tmp_path):
    codes = np.arange(30).reshape(10, 3) % 128
    np.save(tmp_path / "ref.npy", codes)
    result = run(
        "prompt", "Hi", "--model", tiny_checkpoint, "--ref-text", "Ref.", "--ref-codes", tmp_path / "ref.npy", "--json"
    )
    assert result.exit_code == 0, result.output
    prompt = np.array(json.loads(result.output)["prompt"])
    cols = np.nonzero(prompt[0] >= 300)[0]
    assert list(prompt[0, cols]) == list(300 + codes[0])
    assert np.array_equal(prompt[1:, cols], codes)


def test_prompt_of_a_stored_voice_holds_its_codes_and_transcript(tiny_checkpoint, tmp_path):
    codes = np.arange(30).reshape(10, 3) % 128
    VoiceStore(tmp_path).save(Voice(codes, "Ref.", 44100, 0.14, "f" * 64, "2026-01-01T00:00:00+00:00", "ana"))
    stored = run("prompt", "Hi", "--model", tiny_checkpoint, "--voice", "ANA", "--voices", tmp_path, "--json")
    np.save(tmp_path / "ref.npy", codes)
    given = run(
        "prompt", "Hi", "--model", tiny_checkpoint, "--ref-text", "Ref.", "--ref-codes", tmp_path / "ref.npy", "--json"
    )
    assert stored.exit_code == 0, stored.output
    assert json.loads(stored.output) == json.loads(given.output)
    prompt = np.array(json.loads(stored.output)["prompt"])
    assert np.array_equal(prompt[1:, prompt[0] >= 300], codes)
    both = run(
        "prompt",
        "Hi",
        "--model",
        tiny_checkpoint,
        "--voice",
        "ana",
        "--voices",
        tmp_path,
        "--ref-text",
        "R.",
        "--ref-codes",
        tmp_path / "ref.npy",
    )
    assert both.exit_code == 2 and "not both" in both.output
    unknown = run("prompt", "Hi", "--model", tiny_checkpoint, "--voice", "bob", "--voices", tmp_path)
    assert unknown.exit_code != 0 and "no voice named 'bob'" in unknown.output


def test_prompt_refuses_reference_codes_that_are_no_npy_file(tiny_checkpoint, tmp_path):
    """A stored voice's .npz or a text file says it is no .npy file (numpy said "[1]" or "pickled data")."""
    np.savez(tmp_path / "voice.npz", codes=np.zeros((10, 3), np.int64))
    (tmp_path / "codes.txt").write_text("1 2 3\n")
    for path in (tmp_path / "voice.npz", tmp_path / "codes.txt"):
        result = run("prompt", "Hi", "--model", tiny_checkpoint, "--ref-text", "Ref.", "--ref-codes", path)
        assert result.exit_code == 2
        assert f"{path} is not a .npy file: --ref-codes takes a .npy int array [10, frames]" in result.output
        assert "Traceback" not in result.output
