"""Speed and memory of the torch backend on a random-weight Audio8-TTS-Preview-0.6b checkpoint.

A thin wrapper of ``audio8 bench`` (the harness is ``audio8_coreai.measure.bench``; its docstring defines every
figure). Same options, e.g.:

    python benchmarks/bench_torch.py --precision fp32 --precision int8 --threads 1 --threads 2 --baseline \
        --frames 32 --runs 3 --json out.json
"""

from __future__ import annotations

import sys

from audio8_coreai.cli import app

if __name__ == "__main__":
    sys.argv = ["audio8", "bench", *sys.argv[1:]]
    app()
