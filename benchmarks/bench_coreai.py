"""Core AI assets: conversion time and peak memory, asset sizes, runtime calls per frame, and ms per frame of
the Core AI backend beside the torch backend (CPU, fp32) on the same checkpoint and inputs; then the codec
stream: runtime calls per pushed chunk, frames decoded per frame of audio and ms per chunk (first and last).

    python benchmarks/bench_coreai.py --model DIR [--precision fp32|fp16|int8-fp16] [--context N] [--frames 8]
                                      [--codec-frames 64] [--chunk-frames 16]
    python benchmarks/bench_coreai.py --model DIR --assets ASSETS_DIR      # time existing assets only

The codec stream is ``--codec-frames`` random frames pushed ``--chunk-frames`` at a time into a fresh
``codec_stream`` of each backend (``--codec-frames 0`` skips it); the Core AI decoder asset decodes every frame
once with one runtime call per chunk of up to its push, the cost of a chunk not growing with the utterance; the
torch stream is the same incremental decoder in PyTorch. Both are checked against each other (max |diff|).

Conversion runs in a child process, so its peak resident memory is its own (``ru_maxrss`` of the child).
Frames are timed through the backends' public calls on a fixed 40-column prompt and seeded noise, past eos
if the model draws it, so both backends run the same number of steps. On Linux the Core AI backend is the
coreai.runtime CPU interpreter: it proves assets right, it is not the speed of an Apple device.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from audio8_coreai.backends.coreai import CoreAIBackend, read_manifest
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.config import SamplingParams
from audio8_coreai.engine.loop import Utterance, frame_steps
from audio8_coreai.engine.noise import noise_source
from audio8_coreai.measure.args import count, count_or_zero
from audio8_coreai.model.frame import PREFILL_WIDTH
from audio8_coreai.precision import names
from audio8_coreai.settings import DEFAULTS

PROMPT_COLUMNS = 40  # two prefill windows


def convert_in_child(model: str, out: Path, precision: str, context: int | None) -> tuple[float, float]:
    """Convert in a child process; returns (wall seconds, the child's peak RSS in GB)."""
    code = (
        "import sys; from audio8_coreai.backends.coreai import convert; "
        "convert(sys.argv[1], sys.argv[2], sys.argv[3], None if sys.argv[4] == '-' else int(sys.argv[4]), "
        "progress=False)"
    )
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code, model, str(out), precision, "-" if context is None else str(context)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6


def time_frames(backend, ckpt, frames: int) -> tuple[float, list[float], int]:
    """(prefill seconds, seconds per frame of the engine's loop, runtime calls made or -1) for a fixed prompt and
    seed; the loop stops early if the model draws eos."""
    cfg = ckpt.config
    params = SamplingParams.from_configs(cfg, ckpt.generation)
    prompt = np.zeros((1 + cfg.num_codebooks, PROMPT_COLUMNS), np.int64)
    prompt[0] = cfg.semantic_begin_id + np.arange(PROMPT_COLUMNS) % cfg.num_semantic
    calls = backend.calls if isinstance(backend, CoreAIBackend) else None
    t0 = time.perf_counter()
    backend.prefill(prompt)
    prefill_s = time.perf_counter() - t0
    times = []
    t0 = time.perf_counter()
    for _ in frame_steps(backend, Utterance(cfg, PROMPT_COLUMNS, frames, noise_source(cfg, 0)), params):
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
    return prefill_s, times, (backend.calls - calls) if calls is not None else -1


def time_codec(backend, ckpt, frames: int, chunk: int) -> tuple[np.ndarray, list[float], int, int]:
    """(audio float32, seconds per pushed chunk, runtime calls made or -1, frames the calls computed or -1) for
    ``frames`` seeded random frames pushed ``chunk`` at a time into a fresh ``codec_stream``."""
    cc = ckpt.codec_config
    codes = np.random.default_rng(0).integers(0, cc.residual_codebook_size, size=(cc.num_codebooks, frames))
    calls = backend.calls if isinstance(backend, CoreAIBackend) else None
    stream, pieces, times = backend.codec_stream(), [], []
    for start in range(0, frames, chunk):
        t0 = time.perf_counter()
        pieces.append(stream.push(codes[:, start : start + chunk]))
        times.append(time.perf_counter() - t0)
    if calls is None:
        return np.concatenate(pieces), times, -1, -1
    return np.concatenate(pieces), times, backend.calls - calls, stream.decoded


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="checkpoint folder")
    ap.add_argument("--assets", help="existing asset folder (skips conversion)")
    ap.add_argument("--precision", default="fp32", choices=names("coreai"))
    ap.add_argument("--context", type=count, default=None)
    ap.add_argument("--frames", type=count, default=8)
    ap.add_argument("--codec-frames", type=count_or_zero, default=64, help="frames of the codec stream (0: skip it)")
    ap.add_argument("--chunk-frames", type=count, default=DEFAULTS.speech.chunk_frames, help="frames per pushed chunk")
    args = ap.parse_args()
    ckpt = load_checkpoint(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        assets = Path(args.assets) if args.assets else Path(tmp) / "assets"
        if not args.assets:
            wall, peak = convert_in_child(args.model, assets, args.precision, args.context)
            print(f"conversion ({args.precision}): {wall:.1f} s, peak RSS {peak:.2f} GB")
        for part in sorted(assets.glob("*.aimodel")):
            size = sum(f.stat().st_size for f in part.rglob("*") if f.is_file())
            print(f"asset {part.name}: {size / 1e6:.1f} MB")
        t0 = time.perf_counter()
        coreai = CoreAIBackend(ckpt, assets)
        print(
            f"load dualar.aimodel (on Linux: compiled for the interpreter on every load): "
            f"{time.perf_counter() - t0:.1f} s"
        )
        backends = (TorchBackend(ckpt, "cpu", "fp32"), coreai)
        for backend in backends:
            prefill_s, times, calls = time_frames(backend, ckpt, args.frames)
            windows = -(-PROMPT_COLUMNS // PREFILL_WIDTH)
            per_frame = f", runtime calls per frame {(calls - windows) / len(times):.2f}" if calls >= 0 else ""
            print(
                f"{backend.description}: prefill of {PROMPT_COLUMNS} columns {prefill_s * 1e3:.0f} ms, frame "
                f"median {np.median(times[1:]) * 1e3:.1f} ms (first_frame {times[0] * 1e3:.1f} ms){per_frame}"
            )
        if args.codec_frames:
            pushes = read_manifest(assets / "codec_decoder.aimodel")["pushes"]
            audio = []
            for backend in backends:
                wav, times, calls, decoded = time_codec(backend, ckpt, args.codec_frames, args.chunk_frames)
                audio.append(wav)
                chunks = len(times)
                # What the codec computed per frame of audio: padding included; a re-decoding stream would be > 1.
                runtime = (
                    f"runtime calls per chunk {calls / chunks:.2f}, frames decoded per frame of audio "
                    f"{decoded / args.codec_frames:.2f} (pushes {pushes})"
                    if calls >= 0
                    else "incremental decoder: frames decoded per frame of audio 1.00"
                )
                print(
                    f"{backend.description}: codec stream of {args.codec_frames} frames in {chunks} chunks of "
                    f"{args.chunk_frames}: first chunk {times[0] * 1e3:.0f} ms, last {times[-1] * 1e3:.0f} ms, "
                    f"median {np.median(times) * 1e3:.0f} ms; {runtime}"
                )
            print(f"codec stream max |coreai - torch| {np.abs(audio[1] - audio[0]).max():.2e}")
        coreai.close()


if __name__ == "__main__":
    main()
