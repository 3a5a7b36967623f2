"""kill -9 during voice registration and deletion: the voice store is always whole afterwards.

    python benchmarks/kill_test.py [--rounds 25] [--voices DIR] [--seed 0]

Each round starts a writer process on one voices folder that saves (new, or replacing) and removes voices
of a few names as fast as it can, through :class:`audio8_coreai.voices.VoiceStore` (what ``POST`` and
``DELETE /v1/voices`` and ``audio8 voice add/rm`` call once a clip is encoded), and kills it with SIGKILL at a
random moment 20-600 ms after its first write. Then the folder is opened as a server would (its start sweeps
stale temporary files) and every listed voice is loaded: it must read cleanly and hold the codes of the one
version its meta names (no mix of two writes, no half file). Temporary files left by the killed write are
counted; they are never listed. Exits 1 if any round finds a damaged or mixed voice.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from audio8_coreai.measure.args import count, count_or_zero

NAMES = ("ann", "bob", "cy", "dee")
WRITER = r"""
import random, sys
import numpy as np
from audio8_coreai.voices import Voice, VoiceStore, now_utc
from audio8_coreai.errors import VoiceError

store, rng = VoiceStore(sys.argv[1]), random.Random(int(sys.argv[2]))
names, version = sys.argv[3].split(","), 0
print("ready", flush=True)
while True:
    name, version = rng.choice(names), version + 1
    if rng.random() < 0.3:
        try:
            store.remove(name)
        except VoiceError:
            pass
        continue
    frames = 40 + version % 200  # a different size per version: a mixed file would not match
    codes = np.full((10, frames), version % 1000, np.int64)
    voice = Voice(codes, f"version {version}", 44100, frames / 21.5, "f" * 64, now_utc(), name=name)
    try:
        store.save(voice, replace=True)
    except VoiceError:
        pass
"""


def check_store(folder: Path) -> tuple[int, list[str]]:
    """(voices read whole, problems) for the store in ``folder``, opened as a server opens it."""
    from audio8_coreai.voices import VoiceStore

    store, problems, whole = VoiceStore(folder), [], 0
    for name in store.names():
        try:
            voice = store.load(name)
        except Exception as e:  # a damaged file is exactly what this looks for
            problems.append(f"{name}: {type(e).__name__}: {e}")
            continue
        version = int(voice.transcript.removeprefix("version "))
        expected = np.full((10, 40 + version % 200), version % 1000)
        if not np.array_equal(voice.codes, expected):
            problems.append(f"{name}: codes do not match its version {version}")
        else:
            whole += 1
    return whole, problems


def one_round(folder: Path, seed: int, rng: random.Random) -> tuple[int, int, list[str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(folder), str(seed), ",".join(NAMES)], stdout=subprocess.PIPE, env=env
    )
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    time.sleep(rng.uniform(0.02, 0.6))
    child.send_signal(signal.SIGKILL)
    child.wait()
    temps = len(list(folder.glob(".*.tmp")))
    whole, problems = check_store(folder)
    return whole, temps, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=count, default=25)
    ap.add_argument("--voices", type=Path, help="The voices folder (default: a new temporary one).")
    ap.add_argument("--seed", type=count_or_zero, default=0)
    args = ap.parse_args()
    folder = args.voices or Path(tempfile.mkdtemp(prefix="audio8-kill-"))
    rng, bad = random.Random(args.seed), 0
    for i in range(args.rounds):
        whole, temps, problems = one_round(folder, args.seed * 1000 + i, rng)
        bad += bool(problems)
        print(f"round {i + 1:2d}: {whole} voices whole, {temps} temporary file(s) left, {len(problems)} problems")
        for p in problems:
            print(f"          {p}")
    print(f"{args.rounds} rounds, {bad} with a damaged or mixed voice ({folder})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
