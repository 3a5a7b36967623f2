"""Streaming RTF with the codec in a process of its own against the codec in this process, side by side.

    python benchmarks/bench_codec_process.py [--model DIR] [--precision fp16w] [--threads N] [--frames 48]
                                             [--runs 2] [--json out.json]

Two models are loaded from the same checkpoint (the random 0.6b one by default): one with ``codec_process=True``
(the codec decoder in a child process on one thread, the default on 2+ CPUs) and one with ``codec_process=False``.
Each round streams the same 26-word sentence (``--frames`` frames: the random model never stops) in four ways,
taking turns so load changes hit them alike: **process** (the default: chunks overlapped with the frames through
the pipe, the CPUs split between frames and codec), **crowded** (the same with frames on every thread, as before
the split), **inline** (the in-process codec between frames: frames + codec per frame) and **thread** (the
in-process codec on a thread beside the frames, the earlier opt-in ``codec_thread``). Printed per way, median of
``--runs`` rounds after a warm-up round: the stream's wall time per frame after its first chunk and the RTF that
makes (steady), the whole stream's RTF (prefill and first chunk included), the frame loop's and the codec's own
seconds, and this process's CPU use (CPU s / wall s; the codec process's CPU is not counted). ``--threads`` sets
torch's threads here (default: torch's own, every CPU): prefills run on them; the codec process takes half (at
least one), the frames the rest. The load average is printed before and after: the ratios of one run hold, the
absolute figures move with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from audio8_coreai import TTS
from audio8_coreai.backends.torch.threads import CallThreads
from audio8_coreai.measure.args import count
from audio8_coreai.measure.bench import SENTENCE, ensure_checkpoint
from audio8_coreai.settings import DEFAULTS

FRAME_S = 2048 / 44100


def stream_once(tts: TTS, frames: int, overlap: bool | None) -> dict:
    cpu0, t0 = time.process_time(), time.perf_counter()
    stream = tts.stream(SENTENCE, seed=0, max_frames=frames, chunk_frames=16, overlap_codec=overlap)
    marks = [time.perf_counter() - t0 for _ in stream]
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    steady = (marks[-1] - marks[0]) / max(1, stream.frames - stream.first_chunk_frames)
    return {
        "steady_rtf": steady / FRAME_S,
        "rtf": wall / (stream.frames * FRAME_S),
        "ttfa_s": stream.first_audio_s,
        "frames_s": stream.frames_s,
        "codec_s": stream.codec_s,
        "cpu_use": cpu / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint))
    ap.add_argument("--precision", default="fp16w")
    ap.add_argument("--threads", type=count, help="torch threads in this process (default: torch's own)")
    ap.add_argument("--frames", type=count, default=48)
    ap.add_argument("--runs", type=count, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    if args.threads:
        torch.set_num_threads(args.threads)
    model = ensure_checkpoint(args.model)
    apart = TTS.load(model, device="cpu", precision=args.precision, codec_process=True)
    local = TTS.load(model, device="cpu", precision=args.precision, codec_process=False)
    # frames on every thread beside the busy codec process (before frames left it one CPU), for the comparison
    split = apart.backend.threads
    crowded = CallThreads(split.total, split.total, split.codec)
    ways = {
        "process": (apart, None, apart.backend.threads),
        "crowded": (apart, None, crowded),
        "inline": (local, False, local.backend.threads),
        "thread": (local, True, local.backend.threads),
    }
    rounds: dict[str, list[dict]] = {name: [] for name in ways}
    for r in range(args.runs + 1):
        for name, (tts, overlap, threads) in ways.items():
            tts.backend.threads = threads
            result = stream_once(tts, args.frames, overlap)
            if r:  # the first round warms up
                rounds[name].append(result)
    table = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rounds.items()}
    print(f"{args.frames} frames, {args.precision}, {args.runs} runs (median); threads: {split}")
    print(f"{'way':8} {'steady RTF':>10} {'RTF':>6} {'TTFA s':>7} {'frames s':>9} {'codec s':>8} {'CPU use':>8}")
    for name, t in table.items():
        print(
            f"{name:8} {t['steady_rtf']:10.2f} {t['rtf']:6.2f} {t['ttfa_s']:7.2f} {t['frames_s']:9.1f} "
            f"{t['codec_s']:8.1f} {t['cpu_use']:8.2f}"
        )
    for name in ("crowded", "inline", "thread"):
        print(f"process vs {name}: steady RTF x{table[name]['steady_rtf'] / table['process']['steady_rtf']:.2f}")
    load = os.getloadavg()
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*load))
    apart.close()
    if args.json:
        meta = vars(args) | {"model": str(args.model), "json": str(args.json)}
        args.json.write_text(json.dumps({"args": meta, "table": table, "load": load}))


if __name__ == "__main__":
    main()
