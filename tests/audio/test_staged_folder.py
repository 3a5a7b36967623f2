"""A staged folder (audio/files.py ``staged_folder``: conversions, checkpoints, gate reports) left behind by a process
killed outright is cleared by the next staging of the same folder; another live process's, another machine's and
another folder's are kept."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys

from audio8_coreai.audio.files import staged_folder
from audio8_coreai.checkpoint import make_checkpoint

KILLED = """
import sys, time
from pathlib import Path
from audio8_coreai.audio.files import staged_folder
with staged_folder(Path(sys.argv[1])) as tmp:
    (tmp / "weights.bin").write_bytes(b"x" * 4096)
    print("staged", flush=True)
    time.sleep(60)
"""


def _killed_mid_staging(out) -> list:
    """The staging folders a process left when it was killed with SIGKILL while it wrote into ``out``'s."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(out)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "staged"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return sorted(out.parent.glob(f".{out.name}.partial-*"))


def test_a_killed_stagings_folder_is_cleared_by_the_next(tmp_path):
    out = tmp_path / "tiny"
    left = _killed_mid_staging(out)
    assert len(left) == 1 and (left[0] / "weights.bin").stat().st_size == 4096
    host = platform.node()
    running = tmp_path / f".tiny.partial-{host}-{os.getpid()}-0123abcd"  # this process: alive
    elsewhere = tmp_path / ".tiny.partial-other-machine-1-0123abcd"  # a shared disk's other machine
    other = tmp_path / f".other.partial-{host}-{left[0].name.split('-')[-2]}-0123abcd"  # another folder's
    for kept in (running, elsewhere, other):
        kept.mkdir()
    make_checkpoint(out, "tiny", seed=1)
    assert (out / "config.json").is_file()
    assert not left[0].exists()
    assert running.is_dir() and elsewhere.is_dir() and other.is_dir()


def test_a_staging_names_its_machine_and_process(tmp_path):
    out = tmp_path / "report"
    with staged_folder(out) as tmp:
        host, pid = platform.node(), os.getpid()
        assert tmp.parent == tmp_path and tmp.name.startswith(f".report.partial-{host}-{pid}-")
        (tmp / "a").write_text("1")
    assert (out / "a").read_text() == "1" and not list(tmp_path.glob(".report.partial-*"))
