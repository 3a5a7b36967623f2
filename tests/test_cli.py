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
    result = run(
        "say",
        "Hello there, this is a test.",
        "-o",
        out,
        "--model",
        tiny_checkpoint,
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


def test_say_to_stdout_streams_a_16_bit_wav_of_the_same_speech(tiny_checkpoint, tmp_path):
    """-o -: the wav goes to stdout as it is made (the summary to stderr); the samples are the file's, to 16 bits."""
    import io

    args = (
        "say",
        "Hello there, this is a test.",
        "--model",
        tiny_checkpoint,
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
    data, rate = sf.read(io.BytesIO(piped.stdout_bytes), dtype="float32")
    assert run(*args, "-o", tmp_path / "o.wav").exit_code == 0
    want, _ = sf.read(tmp_path / "o.wav", dtype="float32")
    assert rate == 44100 and data.shape == want.shape and want.size >= 2048
    np.testing.assert_allclose(data, want, rtol=0, atol=2 / 32767)  # 16-bit rounding and the 32767/32768 scales


def test_say_same_seed_identical_samples(tiny_checkpoint, tmp_path):
    paths = [tmp_path / "a.wav", tmp_path / "b.wav"]
    for p in paths:
        assert (
            run(
                "say",
                "Same seed twice.",
                "-o",
                p,
                "--model",
                tiny_checkpoint,
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


def test_say_splits_text_too_long_for_one_utterance_as_say_stream_does(tiny_checkpoint, tmp_path):
    text = " ".join(f"Sentence {i} is here, it keeps going." for i in range(16))  # ~620 tokens: over 512
    plain, streamed = tmp_path / "plain.wav", tmp_path / "streamed.wav"
    common = ("--model", tiny_checkpoint, "--seed", 2, "--max-frames", 5, "--device", "cpu")
    result = run("say", text, "-o", plain, *common)
    assert result.exit_code == 0, result.output
    assert "split into sentences" in result.output
    pieces = int(re.search(r"in (\d+) piece\(s\)", result.output).group(1))
    assert pieces >= 2
    assert run("say", text, "-o", streamed, "--stream", *common).exit_code == 0
    a, _ = sf.read(plain, dtype="float32")
    b, _ = sf.read(streamed, dtype="float32")
    assert a.shape == b.shape and a.shape[0] > pieces * 0.25 * 44100
    assert np.array_equal(a, b)


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
    assert result.exit_code == 2 and "eos on the first frame" in result.output
    assert out.read_bytes() == b"keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.wav"]  # no empty partial file either


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


def test_parity_command_passes_on_the_oracle(oracle_dir):
    result = run("parity", "--model", oracle_dir, "--fixture", oracle_dir / "fixture.npz")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output
    assert re.search(r"encoder clone\[0\] +codes 110/110 equal", result.output)


def test_parity_against_other_weights_names_the_fixture_checkpoint(oracle_dir, tiny_checkpoint):
    result = run("parity", "--model", tiny_checkpoint, "--fixture", oracle_dir / "fixture.npz", "--dtype", "fp32")
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


@pytest.mark.parametrize(
    "case, args, needle",
    [
        ("empty", ["say", "", "-o", "{tmp}/o.wav"], "empty"),
        ("punctuation", ["say", "?!...", "-o", "{tmp}/o.wav"], "no letters"),
        ("no folder", ["say", "Hi", "-o", "{tmp}/missing/o.wav"], "does not exist"),
        ("bad extension", ["say", "Hi", "-o", "{tmp}/o.txt"], ".wav"),
        ("missing model", ["say", "Hi", "-o", "{tmp}/o.wav", "--model", "{tmp}/nowhere"], "no checkpoint"),
        ("device", ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "tpu"], "device"),
        ("dtype", ["say", "Hi", "-o", "{tmp}/o.wav", "--dtype", "fp8"], "dtype"),
        ("cuda absent", ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "cuda"], "CUDA"),
        (
            "graphs on cpu",
            ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "cpu", "--cuda-graphs"],
            "CUDA graphs need a CUDA device, not cpu",
        ),
        ("wrong type", ["say", "Hi", "-o", "{tmp}/o.wav", "--model", "{wrong}"], "arktts"),
        ("frames", ["say", "Hi", "-o", "{tmp}/o.wav", "--max-frames", "100000"], "frames"),
        ("temperature", ["say", "Hi", "-o", "{tmp}/o.wav", "--temperature", "0"], "temperature"),
    ],
)
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


@pytest.mark.parametrize(
    "args, needle",
    [
        (["say", "Hi", "-o", "{tmp}/o.wav", "--stream", "--chunk-frames", "0"], "--chunk-frames must be >= 1"),
        (
            ["say", "Hi", "-o", "{tmp}/o.wav", "--stream", "--chunk-frames", "4", "--first-chunk-frames", "5"],
            "--first-chunk-frames 1 to --chunk-frames",
        ),
        (["say", "Hi", "-o", "{tmp}/o.wav", "--chunk-frames", "0"], "--chunk-frames must be >= 1"),  # long text streams
        (["serve", "--port", "99999"], "--port must be 1 to 65535"),
        (["say", "Hi", "-o", "{tmp}/o.wav", "--assets", "{tmp}"], "add backend='coreai' (--backend coreai)"),
        (["say", "Hi", "-o", "{tmp}/o.wav", "--backend", "coreai"], "give assets=DIR (--assets)"),
        (["serve", "--max-frames", "0"], "must be >= 1"),
        (["bench", "--cuda-graphs"], "add --device cuda (not cpu)"),
        (["parity", "--fixture", "{tmp}/f.npz", "--tolerance", "-1"], "--tolerance must be a number > 0"),
        (["bench", "--precision", "int3"], "unknown dtype or precision 'int3': use one of fp32, bf16"),
        (["bench", "--codec-dtype", "fp8"], "unknown dtype 'fp8'"),
        (["bench", "--device", "tpu"], "device"),
        (["bench", "--json", "{tmp}/missing/b.json"], "missing does not exist"),
        (["serve", "--port", "{busy}"], "pick another --port"),
        (["serve", "--host", "999.1.1.1"], "give --host an address of this machine"),
    ],
)
def test_options_are_checked_before_loading(args, needle, tmp_path):
    import socket

    with socket.socket() as busy:  # a port something already listens on
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = [a.format(tmp=tmp_path, busy=busy.getsockname()[1]) for a in args]
        result = run(*args, "--model", tmp_path / "no-such-checkpoint")  # the checks come before the model's
    assert result.exit_code == 2 and needle in result.output, result.output


def test_an_interrupted_stream_leaves_an_existing_file_alone(tiny_checkpoint, tmp_path, monkeypatch):
    """say --stream writes into a partial file and renames it at the end: a run that fails midway leaves the old
    file as it was; a finished one replaces it, readable by others (not the temp file's owner-only mode)."""
    import os

    import soundfile as sf

    from audio8_coreai.engine.stream import SpeechStream

    out = tmp_path / "keep.wav"
    sf.write(out, np.zeros(4410, dtype=np.float32), 44100)
    before = out.read_bytes()
    real_iter = SpeechStream.__iter__

    def interrupted(self):
        for i, chunk in enumerate(real_iter(self)):
            if i == 2:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(SpeechStream, "__iter__", interrupted)
    args = [
        "say",
        "Hello there, this is a test.",
        "-o",
        out,
        "--model",
        tiny_checkpoint,
        "--seed",
        1,
        "--stream",
        "--chunk-frames",
        2,
        "--max-frames",
        30,
        "--device",
        "cpu",
    ]
    result = run(*args)
    assert result.exit_code == 130
    assert out.read_bytes() == before
    assert sf.info(tmp_path / ".keep.partial.wav").frames > 0  # what was made, kept aside
    assert f"the audio made so far is in {tmp_path / '.keep.partial.wav'}" in " ".join(result.output.split())
    monkeypatch.setattr(SpeechStream, "__iter__", real_iter)
    assert run(*args).exit_code == 0
    assert sf.info(out).frames > 4410 and not (tmp_path / ".keep.partial.wav").exists()
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_error_line_is_one_line_and_not_markup(tmp_path):
    """A long path in an error is printed whole on one line, and brackets in it are text, not rich markup."""
    missing = tmp_path / ("a-long-folder-name-" * 6) / "[bold]ckpt"
    result = run("say", "Hi", "-o", tmp_path / "o.wav", "--model", missing)
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert str(missing) in lines[0]


# ---------------------------------------------------------------------------------------------------
# Voices


def test_voice_add_list_show_rm_and_say_by_name_equals_say_inline(tiny_checkpoint, tmp_path):
    import clips

    voices = tmp_path / "my voices"
    clip = clips.write(tmp_path / "clips dir" / "bob é.wav", clips.sweep(8000, 0.75), 8000)
    result = run(
        "voice",
        "add",
        "Bob 1",
        "--audio",
        clip,
        "--text",
        "Hi, I am Bob.",
        "--model",
        tiny_checkpoint,
        "--voices",
        voices,
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # rich wraps at 80 columns
    assert "warning:" in said and "sampled at 8000 Hz" in said
    assert "17 frames" in said and (voices / "Bob 1.npz").is_file()
    listed = run("voice", "list", "--voices", voices)
    assert listed.exit_code == 0 and "Bob 1" in listed.output and "Hi, I am Bob." in listed.output
    shown = run("voice", "show", "Bob 1", "--voices", voices, "--json")
    data = json.loads(shown.output)
    assert (data["sample_rate"], data["frames"], data["transcript"]) == (8000, 17, "Hi, I am Bob.")
    assert np.array(data["codes"]).shape == (10, 17)

    paths = [tmp_path / "by_name.wav", tmp_path / "inline.wav"]
    common = ["--model", tiny_checkpoint, "--seed", 3, "--max-frames", 8, "--device", "cpu"]
    by_name = run("say", "Nice to meet you.", "-o", paths[0], "--voice", "Bob 1", "--voices", voices, *common)
    assert by_name.exit_code == 0, by_name.output
    assert "voice 'Bob 1'" in " ".join(by_name.output.split())
    inline = run(
        "say", "Nice to meet you.", "-o", paths[1], "--ref-audio", clip, "--ref-text", "Hi, I am Bob.", *common
    )
    assert inline.exit_code == 0, inline.output
    a, _ = sf.read(paths[0], dtype="float32")
    b, _ = sf.read(paths[1], dtype="float32")
    assert len(a) > 0 and np.array_equal(a, b)

    assert run("voice", "rm", "Bob 1", "--voices", voices).exit_code == 0
    assert "no voices" in run("voice", "list", "--voices", voices).output


@pytest.mark.parametrize(
    "case, args, needle",
    [
        ("bad name", ["voice", "add", "../up", "--audio", "{clip}", "--text", "Hi."], "bad voice name"),
        ("too short", ["voice", "add", "x", "--audio", "{short}", "--text", "Hi."], "0.30 s"),
        ("not audio", ["voice", "add", "x", "--audio", "{text_file}", "--text", "Hi."], "cannot read reference audio"),
        ("no clip", ["voice", "add", "x", "--audio", "{tmp}/none.wav", "--text", "Hi."], "does not exist"),
        ("empty transcript", ["voice", "add", "x", "--audio", "{clip}", "--text", " "], "reference text is empty"),
        ("taken", ["voice", "add", "taken", "--audio", "{clip}", "--text", "Hi."], "already exists"),
        ("unknown voice", ["say", "Hi", "-o", "{tmp}/o.wav", "--voice", "nobody"], "no voice named 'nobody'"),
        ("half inline", ["say", "Hi", "-o", "{tmp}/o.wav", "--ref-audio", "{clip}"], "needs both"),
        (
            "both",
            ["say", "Hi", "-o", "{tmp}/o.wav", "--voice", "taken", "--ref-audio", "{clip}", "--ref-text", "Hi."],
            "not both",
        ),
        ("show unknown", ["voice", "show", "nobody"], "no voice named"),
        ("rm unknown", ["voice", "rm", "nobody"], "no voice named"),
    ],
)
def test_voice_mistakes_are_one_clear_line(case, args, needle, tmp_path):
    import clips
    from audio8_coreai.voices import Voice, VoiceStore

    voices = tmp_path / "voices"
    VoiceStore(voices).save(Voice(np.zeros((10, 3), np.int64), "Hi.", 44100, 1.0, "0" * 64, "2026", "taken"))
    fill = {
        "clip": clips.write(tmp_path / "c.wav", clips.sweep(16000, 1.0), 16000),
        "short": clips.write(tmp_path / "s.wav", clips.sweep(16000, 0.3), 16000),
        "text_file": tmp_path / "notes.wav",
        "tmp": tmp_path,
    }
    (tmp_path / "notes.wav").write_text("not a sound")
    # No --model: every mistake here is caught before a model would load (the default is a hub id).
    result = run(*[a.format(**fill) for a in args], "--voices", voices)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and needle in " ".join(result.output.split())  # rich wraps at 80 columns
    assert VoiceStore(voices).names() == ["taken"] and not (tmp_path / "o.wav").exists()


@pytest.mark.parametrize(
    "args, needle", [(["-h"], "say"), (["say", "-h"], "--output"), (["voice", "add", "-h"], "--audio")]
)
def test_short_help_flag(args, needle):
    result = run(*args)
    assert result.exit_code == 0 and needle in result.output


def test_the_cap_warning_of_split_text_suggests_a_frame_cap_the_context_takes(never_eos_checkpoint, tmp_path):
    """Split (streamed) text stopped at --max-frames: the warning names the most --max-frames every piece's context
    takes, and the API takes exactly that much and refuses one more."""
    from audio8_coreai import TTS
    from audio8_coreai.errors import EngineError

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


def test_output_is_not_wrapped_when_not_a_terminal(tiny_checkpoint, tmp_path):
    out = tmp_path / ("a-long-folder-name-" * 4) / "speech.wav"  # the summary line runs past 80 columns
    out.parent.mkdir()
    result = run("say", "Hello there.", "-o", out, "--model", tiny_checkpoint, "--device", "cpu", "--max-frames", 2)
    assert result.exit_code == 0, result.output
    summary = next(line for line in result.output.splitlines() if line.startswith(str(out)))
    assert len(summary) > 80 and "RTF" in summary and "seed" in summary, result.output


def test_the_folder_the_missing_checkpoint_message_describes_speaks(tiny_checkpoint, tmp_path):
    """The message lists what a folder must hold (the tokenizer included: TTS.load needs it), and a folder of just
    those files speaks."""
    result = run("say", "Hi.", "-o", tmp_path / "x.wav", "--model", tmp_path / "nowhere")
    said = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "config.json, model.safetensors, codec.pth (or codec.safetensors) and tokenizer.json" in said, said
    assert "tokenizer.json, tokenizer_config.json and generation_config.json are used when present" not in said
    folder = tmp_path / "minimal"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "codec.pth", "tokenizer.json"):
        shutil.copy(tiny_checkpoint / name, folder / name)
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
