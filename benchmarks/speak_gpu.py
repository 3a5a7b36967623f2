"""The package as a user runs it on a GPU, end to end through the public API: ``TTS.load`` with its defaults (the
device's precision, frames as CUDA graphs, the fused kernels), one streamed sentence, then the server's continuous
batching (:meth:`TTS.batched`: one frame thread, N request threads, the rows' batched codec) with N concurrent
requests, each streamed as the HTTP server streams every request.

    python benchmarks/speak_gpu.py [--model DIR] [--device cuda] [--precision P ...] [--concurrent 8 ...]
                                   [--frames 64] [--json out.json]

Per precision (default: the device's own): ``load_s``; the streamed sentence's TTFA (first chunk in hand), its
RTF (wall time over audio) and the chunks' sizes; then, for each ``--concurrent`` N, N threads each streaming
the sentence (seeds 0..N-1, ``--frames`` frames each: the random checkpoint never draws eos) through one
``batched(N)``: wall time, audio made, the aggregate real-time factor (audio seconds a wall second) and whether
every request's audio is there and finite. ``--device cpu`` runs the same code as a script check.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from bench_batch import SENTENCE

from audio8_coreai import TTS
from audio8_coreai.measure.args import check_device, count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.settings import DEFAULTS


def streamed(tts: TTS, frames: int) -> dict:
    """One sentence streamed (seed 0, ``frames`` frames): TTFA, RTF, chunk sizes in frames."""
    t0 = time.perf_counter()
    first, sizes, audio = None, [], []
    for chunk in tts.stream(SENTENCE, seed=0, max_frames=frames):
        first = first or time.perf_counter() - t0
        audio.append(chunk)
        sizes.append(len(chunk) // tts.checkpoint.codec_config.frame_length)
    wall = time.perf_counter() - t0
    samples = np.concatenate(audio)
    return {
        "ttfa_s": first,
        "rtf": wall / (len(samples) / tts.sample_rate),
        "chunks": sizes,
        "finite": bool(np.isfinite(samples).all()),
    }


def concurrent(tts: TTS, n: int, frames: int) -> dict:
    """``n`` requests at once through one :meth:`TTS.batched` (the HTTP server's path without HTTP)."""
    server, workers = tts.batched(n)
    try:

        def one(i: int) -> np.ndarray:
            return np.concatenate(list(workers[i].stream(SENTENCE, seed=i, max_frames=frames)))

        with ThreadPoolExecutor(n) as pool:
            t0 = time.perf_counter()
            audio = list(pool.map(one, range(n)))
            wall = time.perf_counter() - t0
    finally:
        server.close()
    seconds = sum(len(a) for a in audio) / tts.sample_rate
    return {
        "requests": n,
        "wall_s": wall,
        "audio_s": seconds,
        "realtime_x": seconds / wall,
        "all_finite": all(len(a) > 0 and np.isfinite(a).all() for a in audio),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint), help="checkpoint folder")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", action="append", help="torch precision, repeatable (default: the device's)")
    ap.add_argument("--concurrent", action="append", type=count, help="concurrent requests (default 8 and 32)")
    ap.add_argument("--frames", type=count, default=64, help="frames per request")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    check_device(ap, args.device)
    model = ensure_checkpoint(args.model)
    report: dict = {"meta": {"device": args.device, "load_average": os.getloadavg()[0]}, "runs": []}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")

    for precision in args.precision or [None]:
        t0 = time.perf_counter()
        tts = TTS.load(model, device=args.device, precision=precision)
        run: dict = {"backend": tts.backend.description, "load_s": time.perf_counter() - t0}
        report["runs"].append(run)
        tts.synthesize("Hello.", seed=0, max_frames=8)  # warm-up: the graph captured
        run["stream"] = streamed(tts, args.frames)
        print(json.dumps(run), flush=True)
        save()
        run["concurrent"] = []
        for n in args.concurrent or [8, 32]:
            run["concurrent"].append(concurrent(tts, n, args.frames))
            print(json.dumps(run["concurrent"][-1]), flush=True)
            save()
        tts.close()
    report["complete"] = True
    save()
    rows = [
        f"{r['backend']}: TTFA {r['stream']['ttfa_s']:.2f} s, RTF {r['stream']['rtf']:.2f}; "
        + ", ".join(f"{c['requests']} at once {c['realtime_x']:.1f}x real time" for c in r["concurrent"])
        for r in report["runs"]
    ]
    print("speak: " + "; ".join(rows), flush=True)


if __name__ == "__main__":
    main()
