"""The `audio8` command on bad input (one clear line), interrupted streams, the voice commands, help."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from tests.cli.cli_support import run


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
        ("bad extension", ["say", "Hi", "-o", "{tmp}/o.txt"], "o.txt: use a .wav, .flac or .ogg file name"),
        ("no extension", ["say", "Hi", "-o", "/dev/full"], "cannot write /dev/full: use a .wav"),
        ("missing model", ["say", "Hi", "-o", "{tmp}/o.wav", "--model", "{tmp}/nowhere"], "no checkpoint"),
        ("device", ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "tpu"], "device"),
        ("precision", ["say", "Hi", "-o", "{tmp}/o.wav", "--precision", "fp8"], "precision"),
        ("cuda absent", ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "cuda"], "CUDA"),
        (
            "graphs on cpu",
            ["say", "Hi", "-o", "{tmp}/o.wav", "--device", "cpu", "--cuda-graphs"],
            "CUDA graphs need a CUDA device, not cpu",
        ),
        ("wrong type", ["say", "Hi", "-o", "{tmp}/o.wav", "--model", "{wrong}"], "arktts"),
        ("frames", ["say", "Hi", "-o", "{tmp}/o.wav", "--max-frames", "100000"], "frames"),
        ("temperature", ["say", "Hi", "-o", "{tmp}/o.wav", "--temperature", "0"], "temperature"),
        (
            "huge seed",
            ["say", "Hi", "-o", "{tmp}/o.wav", "--seed", str(2**64)],
            "seed must be at most 9007199254740991",
        ),
        ("name too long", ["say", "Hi", "-o", "{tmp}/" + "a" * 300 + ".wav"], "use a shorter file name"),
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
        (["say", "Hi", "-o", "{tmp}/o.wav", "--stream", "--chunk-frames", "0"], "got 0 and the default"),
        (
            ["say", "Hi", "-o", "{tmp}/o.wav", "--stream", "--chunk-frames", "4", "--first-chunk-frames", "5"],
            "--first-chunk-frames 1 to --chunk-frames",
        ),
        (["say", "Hi", "-o", "{tmp}/o.wav", "--chunk-frames", "0"], "--chunk-frames must be >= 1"),  # long text streams
        (["serve", "--port", "99999"], "--port must be 1 to 65535"),
        (["serve", "--max-upload-mb", "0.0000001"], "--max-upload-mb must be over 0 (a byte at least)"),
        (["serve", "--replicas", "-5"], "--replicas: Ray Serve options: add --ray"),
        (["serve", "--autoscale", "1:2", "--address", "auto"], "--address, --autoscale: Ray Serve options"),
        (["say", "Hi", "-o", "{tmp}/o.wav", "--assets", "{tmp}"], "add backend='coreai' (--backend coreai)"),
        (["say", "Hi", "-o", "{tmp}/o.wav", "--backend", "coreai"], "give assets=DIR (--assets)"),
        (["serve", "--max-frames", "0"], "must be >= 1"),
        (["serve", "--cors-origin", "https://app.example.com/"], "--cors-origin holds 'https://app.example.com/'"),
        (["parity", "--fixture", "{tmp}/f.npz", "--backend", "coreai", "--assets", "{tmp}"], "fixture not found"),
        (["bench", "--cuda-graphs"], "add --device cuda (not cpu)"),
        (["parity", "--fixture", "{tmp}/f.npz", "--tolerance", "-1"], "--tolerance must be a finite number > 0"),
        (
            ["parity", "--fixture", "{tmp}/f.npz", "--tolerance", "inf"],
            "--tolerance must be a finite number > 0, got inf",
        ),
        (["bench", "--precision", "int3"], "unknown precision 'int3': use one of fp32, bf16"),
        (["bench", "--codec-dtype", "fp8"], "unknown codec dtype 'fp8': use fp32, bf16 or tf32"),
        (["bench", "--device", "tpu"], "device"),
        (["bench", "--json", "{tmp}/missing/b.json"], "missing does not exist"),
        (["bench", "--json", "{tmp}"], "is a folder: give a file name such as"),
        (["bench", "--json", "/etc/hostname/b.json"], "/etc/hostname is a file, not a folder: write elsewhere"),
        (["bench", "--threads", "100000"], "--threads 100000: this process may run on"),
        (["bench", "--json", "/proc/b.json"], "--json /proc/b.json cannot be written"),  # root may, /proc refuses
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


def test_an_interrupted_stream_leaves_an_existing_file_alone(never_eos_long_checkpoint, tmp_path, monkeypatch):
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
        never_eos_long_checkpoint,
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
    said = " ".join(result.output.split())
    assert f"keep.wav is left as it was; the audio made so far is in {tmp_path / '.keep.partial.wav'}" in said
    out.unlink()  # no file before: none is left "as it was"
    assert "keep.wav was not written; the audio made so far" in " ".join(run(*args).output.split())
    monkeypatch.setattr(SpeechStream, "__iter__", real_iter)
    assert run(*args).exit_code == 0
    assert sf.info(out).frames > 4410 and not (tmp_path / ".keep.partial.wav").exists()
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_say_stream_over_a_file_size_limit_removes_its_partial_file_and_names_the_output(
    never_eos_checkpoint, tmp_path
):
    """``say --stream`` in a process whose files may not grow past 64 KB (RLIMIT_FSIZE; SIGXFSZ ignored, so a
    write past it fails with EFBIG, as a full disk fails one with ENOSPC) through libsndfile's real writes: one
    error line naming the user's file and the cause, the old file as it was, no partial file left."""
    import resource

    out = tmp_path / "keep.wav"
    sf.write(out, np.zeros(4410, dtype=np.float32), 44100)
    before = out.read_bytes()

    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # ignored across exec: the write fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))

    args = ["say", "Hello.", "-o", out, "--model", never_eos_checkpoint, "--device", "cpu", "--seed", 1]
    args += ["--stream", "--chunk-frames", 4, "--max-frames", 50, "--no-codec-process"]  # 50 frames: 400 KB
    code = "from audio8_coreai.cli import app; app()"
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        preexec_fn=limited,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "500"},
    )
    said = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert f"error: cannot write {out}: System error. (the disk or a quota is full, a file size limit" in said
    assert "partial" not in said and "Traceback" not in said
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["keep.wav"]


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


def test_voice_list_and_show_escape_what_a_terminal_would_run(tmp_path):
    """A stored voice's transcript and source are anyone's text (an older file, an HTTP client's upload before text
    cleaning dropped controls): shown as escapes, an ESC sequence never reaches the operator's terminal."""
    from audio8_coreai.voices import Voice, VoiceStore

    text = "hi \x1b]0;pwned\x07\x1b[2J there \u202eevil"
    codes = np.zeros((10, 3), np.int64)
    VoiceStore(tmp_path).save(Voice(codes, text, 44100, 1.0, "f" * 64, "2026-01-01", "esc", "/clips/\x1b[31m.wav"))
    listed = run("voice", "list", "--voices", tmp_path).output
    shown = run("voice", "show", "esc", "--voices", tmp_path).output
    for output in (listed, shown):
        assert "\x1b" not in output and "\u202e" not in output and "\x07" not in output
    assert "hi \\x1b]0;pwned\\x07\\x1b[2J there \\u202eevil" in shown and "/clips/\\x1b[31m.wav" in shown


def test_voice_add_list_show_rm_and_say_by_name_equals_say_inline(never_eos_long_checkpoint, tmp_path):
    from tests import clips

    voices = tmp_path / "my voices"
    clip = clips.write(tmp_path / "clips dir" / "bob é.wav", clips.sweep(8000, 0.75), 8000)
    result = run(
        "voice",
        "add",
        "Bob 1",
        "--audio",
        clip,
        "--transcript",  # --text's other name, as the HTTP API's form field
        "Hi, I am Bob [the first].",
        "--model",
        never_eos_long_checkpoint,
        "--voices",
        voices,
        "--device",
        "cpu",
    )
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # rich wraps at 80 columns
    assert "warning:" in said and "sampled at 8000 Hz" in said
    assert "17 frames" in said and (voices / "Bob 1.npz").is_file()
    listed = run("voice", "list", "--voices", voices)  # brackets are text, not rich markup
    assert listed.exit_code == 0 and "Bob 1" in listed.output and "Hi, I am Bob [the first]." in listed.output
    assert "transcript    Hi, I am Bob [the first]." in run("voice", "show", "Bob 1", "--voices", voices).output
    shown = run("voice", "show", "Bob 1", "--voices", voices, "--json")
    data = json.loads(shown.output)
    assert shown.output.count("\n") == 1  # one line: indented, each code took one
    assert (data["sample_rate"], data["frames"], data["transcript"]) == (8000, 17, "Hi, I am Bob [the first].")
    assert np.array(data["codes"]).shape == (10, 17)

    paths = [tmp_path / "by_name.wav", tmp_path / "inline.wav"]
    common = ["--model", never_eos_long_checkpoint, "--seed", 3, "--max-frames", 8, "--device", "cpu"]
    by_name = run("say", "Nice to meet you.", "-o", paths[0], "--voice", "Bob 1", "--voices", voices, *common)
    assert by_name.exit_code == 0, by_name.output
    assert "voice 'Bob 1'" in " ".join(by_name.output.split())
    inline = run(
        "say",
        "Nice to meet you.",
        "-o",
        paths[1],
        "--ref-audio",
        clip,
        "--ref-text",
        "Hi, I am Bob [the first].",
        *common,
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
        (
            "empty transcript",
            ["voice", "add", "x", "--audio", "{clip}", "--text", " "],
            "reference text is empty (or only whitespace and control characters): give what the clip says",
        ),
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
    from audio8_coreai.voices import Voice, VoiceStore
    from tests import clips

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


def test_more_workers_than_memory_holds_is_refused_after_one_load(tiny_checkpoint):
    """serve --workers N loads one instance, then refuses N of them when N x its checkpoint's bytes are more than
    the machine's memory (naming how many fit and --batch), instead of loading until the OOM killer comes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run("serve", "--model", tiny_checkpoint, "--port", port, "--workers", 10**9)
    assert result.exit_code == 2, result.output
    assert "--workers 1000000000" in result.output and "lower --workers (at most" in result.output
    assert "--batch N" in result.output


def test_a_voices_folder_that_is_a_file_is_refused(tmp_path):
    """It listed no voices, silently (a server started on it served none)."""
    (tmp_path / "file").write_text("x")
    result = run("voice", "list", "--voices", tmp_path / "file")
    assert result.exit_code == 2 and "isafile." in "".join(c for c in result.output if not c.isspace() and c != "│")


def test_a_voice_named_as_wyomings_own_voice_is_stored_with_a_warning(tiny_checkpoint, tmp_path):
    from tests import clips

    clip = clips.write(tmp_path / "c.wav", clips.sweep(16000, 1.0), 16000)
    args = ("voice", "add", "audio8", "--audio", clip, "--text", "Hi.", "--model", tiny_checkpoint)
    result = run(*args, "--voices", tmp_path / "v")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "lists the model's own voice as 'audio8' (wyoming.voice), so a voice of that name cannot be picked" in said
    assert (tmp_path / "v" / "audio8.npz").is_file()
    other = run(
        "voice",
        "add",
        "Audio8",
        "--audio",
        clip,
        "--text",
        "Hi.",
        "--model",
        tiny_checkpoint,
        "--voices",
        tmp_path / "w",
    )
    assert other.exit_code == 0 and "wyoming.voice" not in other.output  # Wyoming lists "Audio8" as a voice
