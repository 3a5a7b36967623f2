"""The `audio8` command: speak to a WAV, replay parity (prompts: test_cli_prompt.py)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
import soundfile as sf

from audio8_coreai.cli import app
from tests.cli.cli_support import run, runner


def test_say_writes_a_44k_mono_wav(never_eos_long_checkpoint, tmp_path):
    out = tmp_path / "dir with spaces" / "späch.wav"
    out.parent.mkdir()
    result = run(
        "say",
        "Hello there, this is a test.",
        "-o",
        out,
        "--model",
        never_eos_long_checkpoint,
        "--seed",
        1,
        "--max-frames",
        40,
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    frames = int(re.search(r"(\d+) frames", result.output).group(1))
    data, rate = sf.read(out, dtype="float32")
    info = sf.info(out)
    assert rate == 44100 and info.channels == 1
    assert data.shape == (frames * 2048,)
    assert "RTF" in result.output


def test_say_to_stdout_streams_a_16_bit_wav_of_the_same_speech(never_eos_long_checkpoint, tmp_path):
    """-o -: the wav goes to stdout as it is made (the summary to stderr); the samples are the file's, to 16 bits."""
    import io

    args = (
        "say",
        "Hello there, this is a test.",
        "--model",
        never_eos_long_checkpoint,
        "--seed",
        1,
        "--max-frames",
        24,
        "--device",
        "cpu",
    )
    piped = run(*args, "-o", "-")
    assert piped.exit_code == 0, piped.output
    assert piped.stdout_bytes[:4] == b"RIFF" and "frames" in piped.stderr and "frames" not in piped.stdout[:200]
    assert "\nstdout: 24 frames in 1 piece," in piped.stderr  # it said "-: 24 frames"
    data, rate = sf.read(io.BytesIO(piped.stdout_bytes), dtype="float32")
    assert run(*args, "-o", tmp_path / "o.wav").exit_code == 0
    want, _ = sf.read(tmp_path / "o.wav", dtype="float32")
    assert rate == 44100 and data.shape == want.shape and want.size >= 2048
    np.testing.assert_allclose(data, want, rtol=0, atol=2 / 32767)  # 16-bit rounding and the 32767/32768 scales


def test_say_same_seed_identical_samples(never_eos_long_checkpoint, tmp_path):
    paths = [tmp_path / "a.wav", tmp_path / "b.wav"]
    for p in paths:
        assert (
            run(
                "say",
                "Same seed twice.",
                "-o",
                p,
                "--model",
                never_eos_long_checkpoint,
                "--seed",
                11,
                "--max-frames",
                30,
                "--device",
                "cpu",
            ).exit_code
            == 0
        )
    a, _ = sf.read(paths[0], dtype="float32")
    b, _ = sf.read(paths[1], dtype="float32")
    assert np.array_equal(a, b)


def test_say_splits_text_too_long_for_one_utterance_as_say_stream_does(never_eos_long_checkpoint, tmp_path):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(16))  # ~620 tokens: over 512
    plain, streamed = tmp_path / "plain.wav", tmp_path / "streamed.wav"
    common = ("--model", never_eos_long_checkpoint, "--seed", 2, "--max-frames", 5, "--device", "cpu")
    result = run("say", text, "-o", plain, *common)
    assert result.exit_code == 0, result.output
    assert "split into sentences" in result.output
    pieces = int(re.search(r"in (\d+) pieces?,", result.output).group(1))
    assert pieces >= 2
    assert run("say", text, "-o", streamed, "--stream", *common).exit_code == 0
    a, _ = sf.read(plain, dtype="float32")
    b, _ = sf.read(streamed, dtype="float32")
    assert a.shape == b.shape and a.shape[0] > pieces * 0.25 * 44100
    assert np.array_equal(a, b)


def test_a_long_list_of_capped_pieces_is_cut_short(never_eos_checkpoint, tmp_path):
    """A text of many pieces, each stopped at its cap: the warning names the first 10 and the count, not them all."""
    text = " ".join(["Hi."] * 40)
    model = ("--model", never_eos_checkpoint, "--device", "cpu", "--seed", 1, "--max-frames", 1)
    result = run("say", text, "-o", tmp_path / "many.wav", *model)
    said = " ".join(result.output.split())
    found = re.search(r"in (\d+) pieces?,", said)
    assert result.exit_code == 0 and found, said
    pieces = int(found.group(1))
    assert pieces > 10, said
    listed = ", ".join(str(i) for i in range(1, 11))
    assert f"pieces {listed}... ({pieces} of {pieces}) stopped at the frame cap" in said


def test_say_ending_at_once_names_the_seed(eos_first_checkpoint, tmp_path):
    model = ("--model", eos_first_checkpoint, "--device", "cpu", "--top-k", 1)
    result = run("say", "Hi.", "-o", tmp_path / "out.wav", *model, "--seed", 3)  # eos on the first frame
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "eos on the first frame, seed 3)" in said and "try another --seed" in said
    assert not (tmp_path / "out.wav").exists()
    result = run("say", "Hi.", "-o", "-", *model, "--seed", 3)
    assert result.exit_code == 2 and "nothing written to stdout;" in " ".join(result.output.split())  # said "to -"


def test_say_stream_ending_at_once_leaves_an_existing_file_untouched(eos_first_checkpoint, tmp_path):
    out = tmp_path / "out.wav"
    out.write_bytes(b"keep me")
    result = run(
        "say",
        "Hi.",
        "-o",
        out,
        "--model",
        eos_first_checkpoint,
        "--top-k",
        1,
        "--max-frames",
        5,
        "--device",
        "cpu",
        "--stream",
    )  # top-k 1 on this checkpoint: eos on the first frame
    assert result.exit_code == 2 and re.search(r"eos on the first frame, seed \d+\)", result.output)  # the seed drawn
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]  # no empty partial file either


def test_text_dash_is_read_from_stdin_and_bounded(tiny_checkpoint, monkeypatch, tmp_path):
    """``-`` for TEXT reads stdin (a file too long for a command line, 128 KiB an argument), as UTF-8, at most
    MAX_STDIN_BYTES: the same prompt as the text given as an argument."""
    import importlib

    app_module = importlib.import_module("audio8_coreai.cli.app")  # the module: the package's ``app`` is the Typer

    given = run("prompt", "Hello there, from a file.", "--model", tiny_checkpoint, "--json")
    piped = runner.invoke(
        app, ["prompt", "-", "--model", str(tiny_checkpoint), "--json"], input="Hello there, from a file.\n"
    )
    assert piped.exit_code == 0 and json.loads(piped.output) == json.loads(given.output)
    bom = runner.invoke(  # a Windows editor's file starts with a byte order mark, which is no text
        app, ["prompt", "-", "--model", str(tiny_checkpoint), "--json"], input="\ufeffHello there, from a file."
    )
    assert bom.exit_code == 0 and json.loads(bom.output) == json.loads(given.output)
    utf16 = runner.invoke(  # a Windows "Unicode" file: the Latin-1 advice garbled it
        app, ["prompt", "-", "--model", str(tiny_checkpoint)], input="Hello there, from a file.".encode("utf-16")
    )
    said = (
        "text is UTF-16 (it begins with UTF-16's byte-order mark, as Windows' 'Unicode' files do), not UTF-8: convert"
    )
    assert utf16.exit_code == 2 and said in " ".join(utf16.output.split()) and "latin1" not in utf16.output
    (tmp_path / "book.txt").write_text("Hello there, from a file.")
    monkeypatch.chdir(tmp_path)
    named = runner.invoke(app, ["prompt", "book.txt", "--model", str(tiny_checkpoint)])  # spoke "book.txt", unsaid
    assert (
        named.exit_code == 0 and "'book.txt' is also a file here; to speak what it holds: - < book.txt" in named.output
    )
    assert "also a file" not in runner.invoke(app, ["prompt", "notes.txt", "--model", str(tiny_checkpoint)]).output
    monkeypatch.setattr(app_module, "MAX_STDIN_BYTES", 10)
    big = runner.invoke(app, ["say", "-", "--model", str(tiny_checkpoint)], input="Hello there, from a file.")
    assert big.exit_code == 2 and "the text on stdin is over" in big.output and "speak it in parts" in big.output


def test_parity_command_passes_on_the_oracle(oracle_dir):
    result = run("parity", "--model", oracle_dir, "--fixture", oracle_dir / "fixture.npz")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output
    assert re.search(r"encoder clone\[0\] +codes 110/110 equal", result.output)


def test_parity_against_other_weights_names_the_fixture_checkpoint(oracle_dir, tiny_checkpoint):
    result = run("parity", "--model", tiny_checkpoint, "--fixture", oracle_dir / "fixture.npz", "--precision", "fp32")
    assert result.exit_code == 1 and "FAIL" in result.output
    assert f"recorded from the checkpoint in {oracle_dir}" in result.output
    assert f"run with --model {oracle_dir}" in result.output


def test_parity_refuses_a_file_that_is_not_a_fixture(oracle_dir, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not an archive")
    result = run("parity", "--model", oracle_dir, "--fixture", text)
    assert result.exit_code == 2
    assert "notes.txt is not an oracle fixture (a .npz archive" in result.output
    assert "pickle" not in result.output
    np.savez(tmp_path / "other.npz", codes=np.zeros(3))
    result = run("parity", "--model", oracle_dir, "--fixture", tmp_path / "other.npz")
    assert (
        result.exit_code == 2
        and "other.npz is not an oracle fixture: it has no meta_json (its arrays: codes)"
        in " ".join(result.output.split())
    )
    result = run("parity", "--model", oracle_dir, "--fixture", oracle_dir)
    assert result.exit_code == 2 and f"give {oracle_dir / 'fixture.npz'}" in " ".join(result.output.split())


def test_output_is_not_wrapped_when_not_a_terminal(never_eos_long_checkpoint, tmp_path):
    out = tmp_path / ("a-long-folder-name-" * 4) / "speech.wav"  # the summary line runs past 80 columns
    out.parent.mkdir()
    # a fresh seed each run: the checkpoint that never draws eos makes the speech certain (steered.py)
    result = run(
        "say", "Hello there.", "-o", out, "--model", never_eos_long_checkpoint, "--device", "cpu", "--max-frames", 2
    )
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.output.splitlines() if line.startswith(str(out)))
    assert len(summary) > 80 and "RTF" in summary and "seed" in summary, result.output


def test_the_folder_the_missing_checkpoint_message_describes_speaks(never_eos_checkpoint, tmp_path):
    """The message lists what a folder must hold (the tokenizer included: TTS.load needs it), and a folder of just
    those files speaks (whatever the fresh seed: the checkpoint never draws eos, steered.py)."""
    result = run("say", "Hi.", "-o", tmp_path / "x.wav", "--model", tmp_path / "nowhere")
    said = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "config.json, model.safetensors, codec.pth (or codec.safetensors) and tokenizer.json" in said, said
    assert "tokenizer.json, tokenizer_config.json and generation_config.json are used when present" not in said
    folder = tmp_path / "minimal"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "codec.pth", "tokenizer.json"):
        shutil.copy(never_eos_checkpoint / name, folder / name)
    model = ("--model", folder, "--device", "cpu", "--max-frames", 2)
    assert run("say", "Hi.", "-o", tmp_path / "ok.wav", *model).exit_code == 0
    (folder / "tokenizer.json").unlink()
    result = run("say", "Hi.", "-o", tmp_path / "no.wav", *model)
    said = " ".join(result.output.split())
    assert (
        result.exit_code == 2
        and "has no tokenizer.json" in said
        and "(or codec.safetensors) and tokenizer.json" in said
    )


def test_ctrl_c_that_a_library_turned_into_another_error_is_interrupted(monkeypatch):
    """Ctrl-C in a C extension's import (torch's, numpy's) left a module half made, and a later import failed with
    a RecursionError traceback: an error after a Ctrl-C the command heard is the interruption, said as one (status
    130), and a Ctrl-C heard while the modules loaded ends the command before it runs."""
    import importlib
    import signal
    import threading
    import time

    import typer

    app_module = importlib.import_module("audio8_coreai.cli.app")
    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(app_module, "_HEARD", [])
    ran = []

    @app_module.friendly
    def command() -> None:
        ran.append(1)
        try:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            raise RecursionError("maximum recursion depth exceeded") from None  # numpy half imported

    try:
        app_module.listen_for_interrupts()  # as the audio8 command does first
        with pytest.raises(typer.Exit) as exited:
            command()
        assert exited.value.exit_code == 130 and app_module._HEARD == [signal.SIGINT]
        with pytest.raises(typer.Exit) as exited:  # heard before it ran: it does not run
            command()
        assert exited.value.exit_code == 130 and ran == [1]
    finally:
        signal.signal(signal.SIGINT, before)
