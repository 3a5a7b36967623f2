"""How the command is run: ``python -m audio8_coreai`` is the ``audio8`` command, signals included."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.cli_support import run
from tests.server.wyoming_support import free_port


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux's /proc/PID/status SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signum - 1) & 1)


def test_python_dash_m_runs_the_command(tiny_checkpoint, tmp_path):
    """``python -m audio8_coreai`` is the ``audio8`` command (where the script is not on PATH), SIGTERM's unwinding
    included."""
    args = ["prompt", "Hi", "--model", str(tiny_checkpoint), "--json"]
    done = subprocess.run([sys.executable, "-m", "audio8_coreai", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(run(*args).output)

    waiting = _waiting_say(tmp_path)
    waiting.send_signal(signal.SIGTERM)
    assert waiting.communicate(timeout=60)[1] == "terminated\n" and waiting.returncode == -signal.SIGTERM


def _hang_up_as(action: signal.Handlers):
    """A child's SIGHUP disposition set to ``action`` before it runs (a test run under nohup passes SIG_IGN on)."""
    return lambda: signal.signal(signal.SIGHUP, action)


def _waiting_say(tmp_path: Path, hang_up: bool = True) -> subprocess.Popen:
    """``audio8 say -`` waiting on its stdin, its handler of SIGTERM in place, and of SIGHUP if ``hang_up`` (else
    started with SIGHUP ignored, as under nohup)."""
    say = [sys.executable, "-m", "audio8_coreai", "say", "-", "-o", str(tmp_path / "x.wav"), "--model", "nowhere"]
    start = _hang_up_as(signal.SIG_DFL if hang_up else signal.SIG_IGN)
    waiting = subprocess.Popen(say, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=start)
    deadline = time.monotonic() + 60
    signals = (signal.SIGTERM, signal.SIGHUP) if hang_up else (signal.SIGTERM,)
    while not all(_catches(waiting.pid, s) for s in signals) and time.monotonic() < deadline:
        time.sleep(0.05)
    return waiting


def test_a_hang_up_unwinds_as_a_termination_unless_ignored(tmp_path):
    """A SIGHUP (the terminal closed) unwinds the command as a SIGTERM does (what it held cleaned up), says so and
    ends the process by it; under ``nohup`` (SIGHUP ignored) the command runs on."""
    waiting = _waiting_say(tmp_path)
    waiting.send_signal(signal.SIGHUP)
    assert waiting.communicate(timeout=60)[1] == "hung up\n" and waiting.returncode == -signal.SIGHUP

    ignoring = _waiting_say(tmp_path, hang_up=False)
    ignoring.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert ignoring.poll() is None  # still waiting on its stdin
    ignoring.send_signal(signal.SIGTERM)
    assert ignoring.communicate(timeout=60)[1] == "terminated\n" and ignoring.returncode == -signal.SIGTERM


def test_serve_shuts_down_gracefully_on_a_hang_up(tiny_checkpoint, tmp_path):
    port = free_port()
    args = ["serve", "--model", str(tiny_checkpoint), "--voices", str(tmp_path), "--port", str(port)]
    command = [sys.executable, "-m", "audio8_coreai", *args]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, preexec_fn=_hang_up_as(signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        server.send_signal(signal.SIGHUP)
        said = server.communicate(timeout=60)[1]
    finally:
        server.kill()
    assert server.returncode == -signal.SIGHUP, said[-2000:]
    assert "Shutting down" in said and said.rstrip().endswith("hung up") and "Traceback" not in said


def test_a_text_beginning_with_a_dash_is_refused_with_its_fix(tiny_checkpoint, tmp_path):
    """'-5 degrees' reads as an option to click ("No such option: -5"): the command says to put -- before it, and
    with -- the text is spoken; a value of an option (--seed -5) and a mistyped option are not taken for text."""
    out = tmp_path / "x.wav"
    for text in ("-5 degrees outside", "-5", "- a list item"):
        result = run("say", text, "-o", out, "--model", tiny_checkpoint)
        assert result.exit_code == 2 and not out.exists()
        said = " ".join(result.output.split())
        fix = f"put -- before it, after any options (audio8 say -- {text!r})"
        assert said == f"error: the text {text!r} begins with '-', which marks an option: {fix}"
    assert "seed must be >= 0, got -5" in run("say", "--seed", "-5", "Hi.", "--model", tiny_checkpoint).output
    assert "No such option: --sede" in run("say", "--sede", "1", "Hi.", "--model", tiny_checkpoint).output
    assert run("prompt", "-3 apples", "--model", tiny_checkpoint).exit_code == 2
    result = run("prompt", "--model", tiny_checkpoint, "--json", "--", "-3 apples")
    ids, spoken = json.loads(result.output)["prompt"][0], [3 + b for b in b"-3 apples"]  # the tiny tokenizer: 3 + byte
    assert result.exit_code == 0 and any(ids[i : i + len(spoken)] == spoken for i in range(len(ids)))


def test_an_interruption_before_the_command_runs_is_said(monkeypatch, capsys, tmp_path):
    """A Ctrl-C (or SIGTERM, SIGHUP: raised so too) while the options are parsed, before a command's own handling,
    which typer ends silently with 130: the entry point says 'interrupted'."""
    import importlib

    import audio8_coreai.cli as cli

    cli_app = importlib.import_module("audio8_coreai.cli.app")  # the module (the package's app is the Typer)

    def parsing(self, ctx, args):  # the signal's handler (listen_for_interrupts) as it runs mid-parse
        cli_app._HEARD.append(signal.SIGINT)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_app, "_HEARD", [])
    monkeypatch.setattr(cli_app, "_SAID", [])
    monkeypatch.setattr(cli_app.TextCommand, "parse_args", parsing)
    monkeypatch.setattr(sys, "argv", ["audio8", "say", "Hi.", "-o", str(tmp_path / "x.wav")])
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == 130 and capsys.readouterr().err == "interrupted\n"
