"""Does a stream move at its slower half? Frames and codec alone, then overlapped, chunk by chunk (issue 27).

    python benchmarks/bench_overlap.py [--model DIR] [--frames 96] [--runs 2] [--chunk-frames 16]
                                       [--first-chunk-frames 1] [--json out.json]

One process, one loaded model (the backend's defaults: on a CPU with 2+ cores the codec in a process of its own),
the same sentence and seed each time, taking turns within each round so load changes hit both alike:

* **alone**: the stream with ``overlap_codec=False``: each chunk decoded before the next frame, so frames and codec
  never run at once; its ``frames_s`` and ``codec_s`` over its frames are each half's cost per frame alone;
* **overlapped**: the default stream, the codec decoding chunk k beside the frames of chunk k+1.

Printed per round and as medians: ms per frame of frames and codec (alone, and inside the overlapped stream),
the overlapped stream's wall ms per frame after its first chunk and its RTF (wall over the audio's seconds), and
the ratio **wall / max(frame, codec)**, both alone: 1.0 is a stream at its slower half. Then the overlapped
stream's timeline from the last round (:class:`audio8_coreai.engine.stream.ChunkTimes`): per chunk its frames,
when made, when its decode began and ended, when handed on, in seconds from the start. The random checkpoint never
emits eos, so each stream makes ``--frames`` frames. Load average, CPU flags and threads are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from audio8_coreai import TTS
from audio8_coreai.measure.args import count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.settings import DEFAULTS

SENTENCE = (
    "The quarterly report shows that revenue grew by twelve percent while costs stayed flat, so the board "
    "approved the new hiring plan for the engineering team."
)
FRAME_S = 2048 / 44100  # the audio of one frame


def run_stream(tts: TTS, args: argparse.Namespace, overlap: bool) -> dict:
    """One stream of the sentence, timed: its halves' seconds per frame, its wall per frame after its first chunk,
    its timeline."""
    stream = tts.stream(
        SENTENCE,
        seed=0,
        max_frames=args.frames,
        chunk_frames=args.chunk_frames,
        first_chunk_frames=args.first_chunk_frames,
        overlap_codec=overlap,
    )
    t0 = time.perf_counter()
    for _ in stream:
        pass
    wall = time.perf_counter() - t0
    first = stream.timeline[0]
    after_first = stream.frames - first.frames
    return {
        "frames": stream.frames,
        "frame_ms": 1e3 * stream.frames_s / stream.frames,
        "codec_ms": 1e3 * stream.codec_s / stream.frames,
        "wall_ms": 1e3 * (stream.timeline[-1].sent_s - first.sent_s) / max(1, after_first),
        "rtf": wall / (stream.frames * FRAME_S),
        "ttfa_s": stream.first_audio_s,
        "prefill_s": stream.prefill_s,
        "timeline": [vars(c) for c in stream.timeline],
    }


def cpu_flags() -> str:
    """The CPU's vector extensions, from /proc/cpuinfo (Linux)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    kept = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags.split()]
    return " ".join(kept) or "none of avx2/avx512"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint))
    ap.add_argument("--frames", type=count, default=96)
    ap.add_argument("--runs", type=count, default=2)
    ap.add_argument("--chunk-frames", type=count, default=None, help="Default: the package's.")
    ap.add_argument("--first-chunk-frames", type=count, default=None, help="Default: the package's.")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load_before = os.getloadavg()
    tts = TTS.load(ensure_checkpoint(args.model), device="cpu")
    backend = tts.backend
    print(
        f"{backend.description}; codec process: {backend.codec_process}; CPUs {os.cpu_count()}; "
        f"flags: {cpu_flags()}; load average {load_before[0]:.2f}"
    )
    if args.chunk_frames is None:
        args.chunk_frames = tts.stream(SENTENCE).chunk_frames
    rounds = []
    run_stream(tts, args, overlap=True)  # warm-up: kernels, the codec process
    for r in range(args.runs):
        alone = run_stream(tts, args, overlap=False)
        both = run_stream(tts, args, overlap=True)
        floor = max(alone["frame_ms"], alone["codec_ms"])
        rounds.append({"alone": alone, "overlapped": both, "ratio": both["wall_ms"] / floor})
        print(
            f"round {r}: alone frame {alone['frame_ms']:.0f} codec {alone['codec_ms']:.0f} ms/frame; overlapped "
            f"frame {both['frame_ms']:.0f} codec {both['codec_ms']:.0f}, wall {both['wall_ms']:.0f} ms/frame "
            f"(RTF {both['rtf']:.2f}, TTFA {both['ttfa_s']:.2f} s): wall / max(frame, codec) "
            f"{rounds[-1]['ratio']:.2f}"
        )

    def med(part: str, key: str) -> float:
        return statistics.median(r[part][key] for r in rounds)

    ratio = statistics.median(r["ratio"] for r in rounds)
    print(
        f"median of {args.runs}: alone frame {med('alone', 'frame_ms'):.0f} / codec {med('alone', 'codec_ms'):.0f} "
        f"ms/frame; overlapped wall {med('overlapped', 'wall_ms'):.0f} ms/frame, RTF {med('overlapped', 'rtf'):.2f}, "
        f"TTFA {med('overlapped', 'ttfa_s'):.2f} s; wall / max(frame, codec) {ratio:.2f}"
    )
    print("timeline of the last overlapped stream (s from its start):")
    print("  chunk frames    made  decode from    to    sent")
    for i, c in enumerate(rounds[-1]["overlapped"]["timeline"]):
        print(
            f"  {i:5d} {c['frames']:6d} {c['made_s']:7.2f} {c['decode_start_s']:12.2f} {c['decoded_s']:6.2f} "
            f"{c['sent_s']:7.2f}"
        )
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f}")
    if args.json:
        report = {"rounds": rounds, "ratio": ratio, "load_average": [load_before, load_after], "flags": cpu_flags()}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
