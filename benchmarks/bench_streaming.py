"""Streaming figures on the random 0.6b checkpoint: exactness and cost of the incremental codec, and TTFA.

    python benchmarks/bench_streaming.py [--model DIR] [--device cpu] [--chunk-frames 16] [--chunks 4]
                                         [--runs 2] [--frames 48] [--json out.json]

**Codec** (random codes, the 0.6b codec: 8-layer window-128 post transformer): the utterance is decoded whole
(the reference), then chunk by chunk with ``StreamingDecoder`` (per-layer keys/values and conv tails kept), and,
as the way it is done without kept state, by re-decoding a 160-frame window (128 frames of context) for each
chunk. Printed: max |diff| to the whole decode of each (the incremental one must be <= 1e-5 at fp32; the window
re-decode is not exact on this codec, whose stacked layers see ~1000 frames back), and the median ms per chunk
of each, measured on the chunks after the first 160 frames (where a window re-decode is full size).

**TTFA** (time to first audio): ``TTS.stream`` of a 26-word sentence, from the call to the first chunk of
``--chunk-frames`` frames (prefill + those frames + their decode), median of ``--runs`` after a warm-up; also
the steady-state ms per frame (model + codec) and RTF of the stream. The random checkpoint never emits eos, so
every run stops at ``--frames``.
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
from audio8_coreai.bench import ensure_checkpoint
from audio8_coreai.model.codec import StreamingDecoder

SENTENCE = ("The quarterly report shows that revenue grew by twelve percent while costs stayed flat, so the board "
            "approved the new hiring plan for the engineering team.")
WINDOW, CONTEXT = 160, 128  # the window re-decode: 128 frames of context in a 160-frame call


def bench_codec(decoder, chunk: int, chunks: int) -> dict:
    frames = WINDOW + chunks * chunk
    codes = torch.randint(0, 1024, (1, 10, frames), generator=torch.Generator().manual_seed(0))
    hop = decoder.cfg.frame_length
    with torch.inference_mode():
        t0 = time.perf_counter()
        whole = decoder(codes)
        whole_s = time.perf_counter() - t0
        stream, pieces, inc_ms = StreamingDecoder(decoder), [], []
        for start in range(0, frames, chunk):
            t0 = time.perf_counter()
            pieces.append(stream.push(codes[..., start:start + chunk]))
            if start >= WINDOW:
                inc_ms.append(1e3 * (time.perf_counter() - t0))
        inc_diff = float((torch.cat(pieces, dim=-1) - whole).abs().max())
        win_ms, win_diff = [], 0.0
        for start in range(WINDOW, frames, chunk):
            t0 = time.perf_counter()
            wav = decoder(codes[..., start + chunk - WINDOW:start + chunk])[..., -chunk * hop:]
            win_ms.append(1e3 * (time.perf_counter() - t0))
            win_diff = max(win_diff, float((wav - whole[..., start * hop:(start + chunk) * hop]).abs().max()))
    return {"frames": frames, "chunk_frames": chunk, "whole_decode_s": whole_s,
            "incremental_max_diff": inc_diff, "incremental_ms_per_chunk": statistics.median(inc_ms),
            "window_redecode_max_diff": win_diff, "window_redecode_ms_per_chunk": statistics.median(win_ms)}


def bench_ttfa(tts: TTS, chunk: int, frames: int, runs: int) -> dict:
    ttfa, steady = [], []
    for run in range(runs + 1):
        t0 = time.perf_counter()
        stream = tts.stream(SENTENCE, seed=run, max_frames=frames, chunk_frames=chunk)
        marks = [time.perf_counter() - t0 for _ in stream]
        if run:  # the first run warms up
            ttfa.append(marks[0])
            steady.append(1e3 * (marks[-1] - marks[0]) / max(1, stream.frames - chunk))
    return {"chunk_frames": chunk, "frames": frames, "ttfa_s": statistics.median(ttfa),
            "steady_ms_per_frame": statistics.median(steady),
            "steady_rtf": statistics.median(steady) / (1e3 * 2048 / 44100)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path("~/.cache/audio8-coreai/bench-0.6b"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--chunk-frames", type=int, default=16)
    ap.add_argument("--chunks", type=int, default=4, help="Codec chunks timed after the first 160 frames.")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--frames", type=int, default=48, help="Frames per TTFA run (the random model never stops).")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    tts = TTS.load(ensure_checkpoint(args.model), device=args.device)
    codec = bench_codec(tts.backend.decoder, args.chunk_frames, args.chunks)
    print(f"codec, {args.chunk_frames}-frame chunks ({tts.backend.description}, {torch.get_num_threads()} threads):")
    print(f"  incremental      {codec['incremental_ms_per_chunk']:9.0f} ms/chunk  max|diff| "
          f"{codec['incremental_max_diff']:.1e}")
    print(f"  160-window redo  {codec['window_redecode_ms_per_chunk']:9.0f} ms/chunk  max|diff| "
          f"{codec['window_redecode_max_diff']:.1e}")
    print(f"  -> {codec['window_redecode_ms_per_chunk'] / codec['incremental_ms_per_chunk']:.1f}x cheaper")
    ttfa = bench_ttfa(tts, args.chunk_frames, args.frames, args.runs)
    print(f"TTFA {ttfa['ttfa_s']:.2f} s (first {args.chunk_frames}-frame chunk), then "
          f"{ttfa['steady_ms_per_frame']:.0f} ms/frame with decode (RTF {ttfa['steady_rtf']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"codec": codec, "ttfa": ttfa, "load_average": os.getloadavg()},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
