"""Frames with the weights in 4 KiB pages, then in 2 MiB huge pages, in one process (issue 27: weights read at the
bandwidth).

    python benchmarks/bench_huge_pages.py [--model DIR] [--runs 3] [--frames 40]

The model loads with the backend's own collapse held off; the frame (the default precision, one torch thread, the
codec not overlapped so frames run alone) is timed over ``--runs`` streams of ``--frames`` frames, then
:func:`audio8_coreai.backends.torch.memory.back_with_huge_pages` runs (its seconds, the bytes it collapsed, RSS
before and after) and the frame is timed again. Also printed: the read bandwidth of one thread (``torch.sum`` over
1 GiB) and the load average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

import audio8_coreai.backends.torch.backend as torch_backend
from audio8_coreai import TTS
from audio8_coreai.backends.torch.memory import back_with_huge_pages
from audio8_coreai.measure.args import count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.settings import DEFAULTS

TEXT = "The quarterly report shows that revenue grew by twelve percent while costs stayed flat."


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def frame_ms(tts: TTS, runs: int, frames: int) -> list[float]:
    out = []
    for _ in range(runs):
        stream = tts.stream(TEXT, seed=0, max_frames=frames, overlap_codec=False)
        for _ in stream:
            pass
        out.append(1e3 * stream.frames_s / stream.frames)
    return out


def read_gbps() -> float:
    x = torch.ones(2**28, dtype=torch.float32)  # 1 GiB
    x.sum()
    best = min(_timed(x.sum) for _ in range(5))
    return x.numel() * 4 / best / 1e9


def _timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint))
    ap.add_argument("--runs", type=count, default=3)
    ap.add_argument("--frames", type=count, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    held = torch_backend.DEFAULTS.torch.model_copy(update={"huge_pages_min_bytes": 2**62})
    held = torch_backend.DEFAULTS.model_copy(update={"torch": held})
    torch_backend.DEFAULTS = held  # this load backs nothing by huge pages itself
    tts = TTS.load(ensure_checkpoint(args.model), device="cpu")
    print(f"{tts.backend.description}; one thread reads {read_gbps():.1f} GB/s; load {os.getloadavg()[0]:.2f}")
    frame_ms(tts, 1, 8)  # warm-up
    before, rss_before = frame_ms(tts, args.runs, args.frames), rss_mb()
    t0 = time.perf_counter()
    collapsed = back_with_huge_pages()
    took = time.perf_counter() - t0
    after = frame_ms(tts, args.runs, args.frames)
    print(f"4 KiB pages: frame {statistics.median(before):.1f} ms (runs {[round(m, 1) for m in before]})")
    print(
        f"huge pages:  {collapsed / 2**20:.0f} MB collapsed in {took:.2f} s, RSS {rss_before:.0f} -> "
        f"{rss_mb():.0f} MB; "
        f"frame {statistics.median(after):.1f} ms (runs {[round(m, 1) for m in after]}); "
        f"{statistics.median(before) / statistics.median(after):.3f}x; load {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
