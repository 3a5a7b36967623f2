"""The `audio8` command: speak to a WAV, print prompts, replay parity; bad input gives one clear line."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from audio8_coreai.cli import app

runner = CliRunner()


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def test_say_writes_a_44k_mono_wav(tiny_checkpoint, tmp_path):
    out = tmp_path / "dir with spaces" / "späch.wav"
    out.parent.mkdir()
    result = run("say", "Hello there, this is a test.", "-o", out, "--model", tiny_checkpoint, "--seed", 1,
                 "--max-frames", 40, "--device", "cpu")
    assert result.exit_code == 0, result.output
    frames = int(re.search(r"(\d+) frames", result.output).group(1))
    data, rate = sf.read(out, dtype="float32")
    info = sf.info(out)
    assert rate == 44100 and info.channels == 1
    assert data.shape == (frames * 2048,)
    assert "RTF" in result.output


def test_say_same_seed_identical_samples(tiny_checkpoint, tmp_path):
    paths = [tmp_path / "a.wav", tmp_path / "b.wav"]
    for p in paths:
        assert run("say", "Same seed twice.", "-o", p, "--model", tiny_checkpoint, "--seed", 11,
                   "--max-frames", 30, "--device", "cpu").exit_code == 0
    a, _ = sf.read(paths[0], dtype="float32")
    b, _ = sf.read(paths[1], dtype="float32")
    assert np.array_equal(a, b)


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
    assert any(row0[i:i + len(user)] == user for i in range(len(row0)))


def test_prompt_clone_with_reference_codes(tiny_checkpoint, tmp_path):
    codes = np.arange(30).reshape(10, 3) % 128
    np.save(tmp_path / "ref.npy", codes)
    result = run("prompt", "Hi", "--model", tiny_checkpoint, "--ref-text", "Ref.", "--ref-codes",
                 tmp_path / "ref.npy", "--json")
    assert result.exit_code == 0, result.output
    prompt = np.array(json.loads(result.output)["prompt"])
    cols = np.nonzero(prompt[0] >= 300)[0]
    assert list(prompt[0, cols]) == list(300 + codes[0])
    assert np.array_equal(prompt[1:, cols], codes)


def test_parity_command_passes_on_the_oracle(oracle_dir):
    result = run("parity", "--model", oracle_dir, "--fixture", oracle_dir / "fixture.npz")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output


def test_make_checkpoint_refuses_a_non_empty_folder(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep.txt").write_text("data")
    result = run("make-checkpoint", tmp_path / "x", "--size", "tiny")
    assert result.exit_code == 2
    assert (tmp_path / "x" / "keep.txt").read_text() == "data"


@pytest.fixture()
def wrong_type(tiny_checkpoint, tmp_path):
    bad = tmp_path / "wrong_type"
    shutil.copytree(tiny_checkpoint, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "qwen2"
    (bad / "config.json").write_text(json.dumps(cfg))
    return bad


@pytest.mark.parametrize("case, args, needle", [
    ("empty", ["say", "", "-o", "{tmp}/o.wav"], "empty"),
    ("punctuation", ["say", "?!...", "-o", "{tmp}/o.wav"], "no letters"),
    ("no folder", ["say", "Hi", "-o", "{tmp}/missing/o.wav"], "does not exist"),
    ("bad extension", ["say", "Hi", "-o", "{tmp}/o.txt"], ".wav"),
    ("missing model", ["say", "Hi", "-o", "{tmp}/o.wav", "--model", "{tmp}/nowhere"], "no checkpoint"),
    ("device", ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "tpu"], "device"),
    ("dtype", ["say", "Hi", "-o", "{tmp}/o.wav", "--dtype", "fp8"], "dtype"),
    ("cuda absent", ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "cuda"], "CUDA"),
    ("wrong type", ["say", "Hi", "-o", "{tmp}/o.wav", "--model", "{wrong}"], "arktts"),
    ("frames", ["say", "Hi", "-o", "{tmp}/o.wav", "--max-frames", "100000"], "frames"),
    ("temperature", ["say", "Hi", "-o", "{tmp}/o.wav", "--temperature", "0"], "temperature"),
])
def test_bad_input_is_one_clear_line(case, args, needle, tiny_checkpoint, wrong_type, tmp_path):
    import torch

    if case == "cuda absent" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    args = [a.format(tmp=tmp_path, wrong=wrong_type) for a in args]
    if "--model" not in args:
        args += ["--model", str(tiny_checkpoint)]
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output
    assert needle in result.output
    assert not (tmp_path / "o.wav").exists()
