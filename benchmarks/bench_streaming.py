"""Streaming figures on the random 0.6b checkpoint: exactness and cost of the incremental codec, and TTFA.

    python benchmarks/bench_streaming.py [--model DIR] [--device cpu] [--threads 1] [--chunk-frames 16]
                                         [--first-chunk-frames 1 ...] [--chunks 4] [--runs 2] [--frames 48]
                                         [--voice-seconds 10] [--json out.json]

**Codec** (random codes, the 0.6b codec: 8-layer window-128 post transformer): the utterance is decoded whole
(the reference), then chunk by chunk with ``StreamingDecoder`` (per-layer keys/values and conv tails kept), and,
as the way it is done without kept state, by re-decoding a 160-frame window (128 frames of context) for each
chunk. Printed: max |diff| to the whole decode of each (the incremental one must be <= 1e-5 at fp32; the window
re-decode is not exact on this codec, whose stacked layers see ~1000 frames back), and the median ms per chunk
of each, measured on the chunks after the first 160 frames (where a window re-decode is full size).

**TTFA** (time to first audio): ``TTS.stream`` of a 26-word sentence (the prompt's columns are printed), from
the call to its first chunk, for each ``--first-chunk-frames`` (default 1, 2, 4, 8 and ``--chunk-frames``, the
last being a stream without a shorter first chunk), taking turns within each round so load changes hit them
alike; median of ``--runs`` rounds after a warm-up round, split into prefill, the first chunk's frames and its
decode (the decode's ms per frame shows what a short chunk costs). With ``--voice-seconds S``, TTFA in a voice
cloned from S seconds of a synthetic clip: its first request (the prompt's head, reference included, computed)
and the median of ``--runs`` more (the head kept by the torch backend). Then the steady state of one whole stream of
``--frames`` frames (the random checkpoint never emits eos): ms per frame (model + codec) after the first chunk,
and its RTF. ``--threads`` sets torch's threads (and so ONNX Runtime's) before the model loads. The load average
is printed before and after: other processes on the machine inflate every time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from audio8_coreai import TTS
from audio8_coreai.measure.args import count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.model.codec import StreamingDecoder
from audio8_coreai.settings import DEFAULTS

SENTENCE = (
    "The quarterly report shows that revenue grew by twelve percent while costs stayed flat, so the board "
    "approved the new hiring plan for the engineering team."
)
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
            pieces.append(stream.push(codes[..., start : start + chunk]))
            if start >= WINDOW:
                inc_ms.append(1e3 * (time.perf_counter() - t0))
        inc_diff = float((torch.cat(pieces, dim=-1) - whole).abs().max())
        win_ms, win_diff = [], 0.0
        for start in range(WINDOW, frames, chunk):
            t0 = time.perf_counter()
            wav = decoder(codes[..., start + chunk - WINDOW : start + chunk])[..., -chunk * hop :]
            win_ms.append(1e3 * (time.perf_counter() - t0))
            win_diff = max(win_diff, float((wav - whole[..., start * hop : (start + chunk) * hop]).abs().max()))
    return {
        "frames": frames,
        "chunk_frames": chunk,
        "whole_decode_s": whole_s,
        "incremental_max_diff": inc_diff,
        "incremental_ms_per_chunk": statistics.median(inc_ms),
        "window_redecode_max_diff": win_diff,
        "window_redecode_ms_per_chunk": statistics.median(win_ms),
    }


def bench_ttfa(tts: TTS, firsts: list[int], chunk: int, runs: int) -> list[dict]:
    """Median TTFA and its split per first-chunk size, the sizes taking turns within each round."""
    marks: dict[int, list[tuple[float, float, float, float]]] = {f: [] for f in firsts}
    for run in range(runs + 1):
        for first in firsts:
            t0 = time.perf_counter()
            stream = tts.stream(SENTENCE, seed=run, chunk_frames=chunk, first_chunk_frames=first)
            chunks = iter(stream)
            next(chunks)
            ttfa = time.perf_counter() - t0
            chunks.close()
            if run:  # the first round warms up
                marks[first].append((ttfa, stream.prefill_s, stream.frames_s, stream.codec_s))
    rows = []
    for first, m in marks.items():
        ttfa, prefill, frames, codec = (statistics.median(x) for x in zip(*m))
        rows.append(
            {
                "first_chunk_frames": first,
                "ttfa_s": ttfa,
                "prefill_s": prefill,
                "frames_s": frames,
                "codec_s": codec,
                "codec_ms_per_frame": 1e3 * codec / first,
            }
        )
    return rows


def bench_voice_ttfa(tts: TTS, seconds: float, runs: int) -> dict:
    """TTFA of the sentence in a voice cloned from ``seconds`` of a synthetic clip (noise bursts): its first
    request, which computes the prompt's head (reference included), then the median of ``runs`` more, which
    find the head kept. The clip is encoded once, before any timing."""
    import tempfile

    import soundfile as sf

    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * 44100)) / 44100
    clip = (0.3 * rng.standard_normal(t.shape) * (np.sin(2 * np.pi * 3 * t) > 0)).astype(np.float32)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "clip.wav"
        sf.write(path, clip, 44100)
        voice = tts.voice_from_clip(path, "A synthetic reference clip.")
    marks = []
    for run in range(runs + 1):
        t0 = time.perf_counter()
        stream = tts.stream(SENTENCE, seed=run, voice=voice)
        chunks = iter(stream)
        next(chunks)
        marks.append((time.perf_counter() - t0, stream.prefill_s))
        chunks.close()
    kept = [statistics.median(x) for x in zip(*marks[1:])]
    return {
        "voice_seconds": seconds,
        "prompt_columns": int(tts.prompts.clone(SENTENCE, voice.transcript, voice.codes).shape[1]),
        "first_ttfa_s": marks[0][0],
        "first_prefill_s": marks[0][1],
        "kept_ttfa_s": kept[0],
        "kept_prefill_s": kept[1],
    }


def bench_steady(tts: TTS, chunk: int, frames: int) -> dict:
    """ms per frame (model + codec) of one stream after its first chunk, and the RTF that makes."""
    t0 = time.perf_counter()
    stream = tts.stream(SENTENCE, seed=0, max_frames=frames, chunk_frames=chunk)
    marks = [time.perf_counter() - t0 for _ in stream]
    ms = 1e3 * (marks[-1] - marks[0]) / max(1, stream.frames - stream.first_chunk_frames)
    return {
        "chunk_frames": chunk,
        "first_chunk_frames": stream.first_chunk_frames,
        "frames": stream.frames,
        "steady_ms_per_frame": ms,
        "steady_rtf": ms / (1e3 * 2048 / 44100),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=count, default=1, help="torch (and ONNX Runtime) threads.")
    ap.add_argument("--chunk-frames", type=count, default=DEFAULTS.speech.chunk_frames)
    ap.add_argument(
        "--first-chunk-frames",
        type=count,
        action="append",
        help="First-chunk sizes to time (repeatable; default 1, 2, 4, 8 and --chunk-frames).",
    )
    ap.add_argument("--chunks", type=count, default=4, help="Codec chunks timed after the first 160 frames.")
    ap.add_argument("--runs", type=count, default=2)
    ap.add_argument(
        "--frames", type=count, default=48, help="Frames of the steady-state stream (the random model never stops)."
    )
    ap.add_argument(
        "--voice-seconds",
        type=float,
        default=0.0,
        help="Also time TTFA in a voice cloned from a clip this long (its first request, then with its "
        "prompt head kept); 0: skip.",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    firsts = args.first_chunk_frames or sorted({1, 2, 4, 8, args.chunk_frames})
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")

    torch.set_num_threads(args.threads)
    tts = TTS.load(ensure_checkpoint(args.model), device=args.device)
    codec = bench_codec(tts.backend.decoder, args.chunk_frames, args.chunks)
    runs_on = f"{str(tts.backend.codec_dtype).removeprefix('torch.')} on {tts.backend.device}"
    print(f"codec ({runs_on}), {args.chunk_frames}-frame chunks, {torch.get_num_threads()} threads:")
    print(
        f"  incremental      {codec['incremental_ms_per_chunk']:9.0f} ms/chunk  max|diff| "
        f"{codec['incremental_max_diff']:.1e}"
    )
    print(
        f"  160-window redo  {codec['window_redecode_ms_per_chunk']:9.0f} ms/chunk  max|diff| "
        f"{codec['window_redecode_max_diff']:.1e}"
    )
    print(f"  -> {codec['window_redecode_ms_per_chunk'] / codec['incremental_ms_per_chunk']:.1f}x cheaper")
    columns = tts.prompts.plain(SENTENCE).shape[1]
    ttfa = bench_ttfa(tts, firsts, args.chunk_frames, args.runs)
    print(f"TTFA, then {args.chunk_frames}-frame chunks ({columns}-column prompt; median of {args.runs}):")
    print("  first chunk   TTFA s   prefill s   frames s   decode s   decode ms/frame")
    for r in ttfa:
        print(
            f"  {r['first_chunk_frames']:5d} frames {r['ttfa_s']:8.2f} {r['prefill_s']:11.2f} {r['frames_s']:10.2f} "
            f"{r['codec_s']:10.2f} {r['codec_ms_per_frame']:17.0f}"
        )
    voice = bench_voice_ttfa(tts, args.voice_seconds, args.runs) if args.voice_seconds else None
    if voice:
        print(
            f"TTFA in a voice from a {args.voice_seconds:g} s clip ({voice['prompt_columns']}-column prompt): first "
            f"request {voice['first_ttfa_s']:.2f} s (prefill {voice['first_prefill_s']:.2f} s), with its head kept "
            f"{voice['kept_ttfa_s']:.2f} s (prefill {voice['kept_prefill_s']:.2f} s)"
        )
    steady = bench_steady(tts, args.chunk_frames, args.frames)
    print(f"steady state: {steady['steady_ms_per_frame']:.0f} ms/frame with decode (RTF {steady['steady_rtf']:.2f})")
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "codec": codec,
                    "ttfa": ttfa,
                    "voice": voice,
                    "steady": steady,
                    "threads": args.threads,
                    "prompt_columns": columns,
                    "load_average": [load_before, load_after],
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
