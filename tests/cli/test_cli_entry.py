"""How the command is run: ``python -m audio8_coreai`` is the ``audio8`` command, signals included."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.cli_support import run


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux's /proc/PID/status SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


def test_python_dash_m_runs_the_command(tiny_checkpoint, tmp_path):
    """``python -m audio8_coreai`` is the ``audio8`` command (where the script is not on PATH), SIGTERM's unwinding
    included."""
    args = ["prompt", "Hi", "--model", str(tiny_checkpoint), "--json"]
    done = subprocess.run([sys.executable, "-m", "audio8_coreai", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(run(*args).output)

    say = [sys.executable, "-m", "audio8_coreai", "say", "-", "-o", str(tmp_path / "x.wav"), "--model", "nowhere"]
    waiting = subprocess.Popen(say, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # reads stdin
    deadline = time.monotonic() + 60
    while not _catches_sigterm(waiting.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    waiting.send_signal(signal.SIGTERM)
    assert waiting.communicate(timeout=60)[1] == "terminated\n" and waiting.returncode == -signal.SIGTERM
