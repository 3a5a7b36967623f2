"""Batching: how many real-time streams one machine serves when utterances share each frame call.

    python benchmarks/bench_batch.py [--model DIR] [--precision int16 --precision fp32] [--batch 1 --batch 2 ...]
                                     [--device cpu|cuda] [--threads 1] [--frames 16] [--runs 3] [--json out.json]

For each precision, a :class:`audio8_coreai.engine.batch.BatchEngine` on the random 0.6b checkpoint is filled with
``B`` utterances of the same 26-word sentence (seeds 0..B-1, so their rows are at equal positions and draw
different codes); after a warm-up step, ``--frames`` steps are timed, median of ``--runs`` rounds, batch sizes
taking turns round by round so machine load hits them alike. Printed per batch size:

- **ms/step**: one :meth:`BatchEngine.step` (a frame for every row: slow AR, fast AR, sampler, host work);
- **ms/frame/stream**: ms/step over B; **vs B=1**: throughput (frames per second) over B=1's;
- **streams (model)**: real-time streams the frame loop alone sustains: B x 46.4 ms / ms/step;
- **streams (with codec)**: the same with each stream's codec on the same cores, the codec's ms per frame of
  audio measured once per run (exact incremental stream, 32-frame chunks): 46.4 / (ms/step / B + codec ms).

The random checkpoint never emits eos, so every row runs all steps.
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
from audio8_coreai.engine.batch import BatchEngine
from audio8_coreai.measure.args import count
from audio8_coreai.measure.bench import STREAM_CHUNK, ensure_checkpoint, measure_codec
from audio8_coreai.settings import DEFAULTS

SENTENCE = (
    "The quarterly report shows that revenue grew by twelve percent while costs stayed flat, so the board "
    "approved the new hiring plan for the engineering team."
)


def fill(tts: TTS, batch: int) -> BatchEngine:
    """An engine with ``batch`` rows of the sentence, admitted (prefill + frame 0) and stepped once (warm-up)."""
    prompt = tts.prompts.plain(SENTENCE)
    engine = BatchEngine(tts.backend, tts.sampling(), batch)
    for seed in range(batch):
        engine.admit(prompt, tts.config.max_seq_len - prompt.shape[1], seed=seed)
    engine.step()
    return engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        type=Path,
        default=Path(DEFAULTS.bench.checkpoint),
        help="0.6b checkpoint folder (the default one is made once, random weights, when absent)",
    )
    ap.add_argument("--precision", action="append", help="torch precision (repeatable; default int16)")
    ap.add_argument(
        "--batch", action="append", type=count, help="batch sizes (repeatable; default 1 2 4 8; on a GPU: 1 8 32 128)"
    )
    ap.add_argument("--device", default="cpu", help="cpu or cuda (then use --precision fp32 or bf16)")
    ap.add_argument("--threads", type=count, default=1)
    ap.add_argument("--frames", type=count, default=16, help="timed steps per round")
    ap.add_argument("--runs", type=count, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = ensure_checkpoint(args.model)
    sizes = args.batch or [1, 2, 4, 8]
    rows = []
    print(
        f"{args.device}, load average {os.getloadavg()[0]:.1f}, {args.threads} thread(s), {args.frames} steps x "
        f"{args.runs} runs"
    )
    for precision in args.precision or ["int16"]:
        tts = TTS.load(model, device=args.device, precision=precision)
        frame_s = tts.checkpoint.codec_config.frame_length / tts.sample_rate
        codec_ms = measure_codec(tts.backend, runs=2)["codec_ms_per_chunk"] / STREAM_CHUNK
        engines = {b: fill(tts, b) for b in sizes}
        steps: dict[int, list[float]] = {b: [] for b in sizes}
        for _ in range(args.runs):
            for b, engine in engines.items():
                t0 = time.perf_counter()
                for _ in range(args.frames):
                    engine.step()
                steps[b].append(1e3 * (time.perf_counter() - t0) / args.frames)
        base = statistics.median(steps[sizes[0]]) / sizes[0]
        for b in sizes:
            ms = statistics.median(steps[b])
            rows.append(
                {
                    "precision": precision,
                    "batch": b,
                    "ms_per_step": ms,
                    "ms_per_frame_per_stream": ms / b,
                    "throughput_vs_first": base / (ms / b),
                    "streams_model": b * 1e3 * frame_s / ms,
                    "codec_ms_per_frame": codec_ms,
                    "streams_with_codec": 1e3 * frame_s / (ms / b + codec_ms),
                }
            )
        del engines, tts
    print(
        f"{'precision':>9} {'B':>4} {'ms/step':>9} {'ms/frame/stream':>16} {f'vs B={sizes[0]}':>8} "
        f"{'streams (model)':>16} {'streams (+codec)':>17}"
    )
    for r in rows:
        print(
            f"{r['precision']:>9} {r['batch']:>4} {r['ms_per_step']:>9.1f} {r['ms_per_frame_per_stream']:>16.1f} "
            f"{r['throughput_vs_first']:>7.2f}x {r['streams_model']:>16.2f} {r['streams_with_codec']:>17.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_average": os.getloadavg()[0], "threads": args.threads, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
