"""The batched codec on a GPU, three ways: fp32 as shipped (TF32 off), fp32 with cuDNN's TF32 convolutions, and a
bf16 decoder; time per stream-frame and the waveform's distance from fp32.

    python benchmarks/bench_codec_gpu.py [--model DIR] [--device cuda] [--streams 32 --streams 128] [--chunks 4]
                                         [--json out.json]

At 64+ streams the codec, not the frame, bounds the real-time streams of an H200 (benchmarks/README.md): this
measures what the other forms would give. For each ``--streams`` B: B fresh streams of seeded random codes
(``default_rng(0)``, codes below 1024; the graph clamps), ``--chunks`` 16-frame chunks each decoded for all B
streams in one :meth:`CodecRows.run` call (the batched server's codec), the first a warm-up. Per form: ms per chunk
call (median), ms per stream-frame, and against fp32's samples of the same chunks the max |diff| and the worst
chunk's cosine. The TF32 form is the shipped ``tf32`` codec (:class:`CodecRows` with ``tf32``: cuDNN's switch set
per call, :mod:`audio8_coreai.backends.torch.cudnn`). ``--device cpu`` runs the same code (the TF32 form is then
fp32): a check of the script.
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

from audio8_coreai.backends.torch.codec_rows import CodecRows, Push
from audio8_coreai.backends.torch.codec_worker import build_decoder
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.measure.args import check_device, count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.settings import DEFAULTS

CHUNK = 16  # frames a push (DEFAULTS.torch.decode_chunk_frames)
FORMS = ("fp32", "tf32", "bf16")


def decode(codec: CodecRows, codes: np.ndarray, device: torch.device) -> tuple[list[np.ndarray], list]:
    """``codes`` int64 [B, C, chunks * CHUNK] through B fresh streams a chunk at a time: each chunk's samples
    [B, CHUNK * 2048] and each call's seconds."""
    streams = [codec.stream() for _ in range(len(codes))]
    out, seconds = [], []
    for start in range(0, codes.shape[-1], CHUNK):
        piece = codes[..., start : start + CHUNK]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        wav = codec.run([Push(s, piece[i : i + 1]) for i, s in enumerate(streams)])
        seconds.append(time.perf_counter() - t0)
        out.append(np.concatenate(wav))
    return out, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint), help="checkpoint folder")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", action="append", type=count, help="streams a call (default 32 and 128)")
    ap.add_argument("--chunks", type=count, default=4, help="16-frame chunks a stream (the first a warm-up)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    check_device(ap, args.device)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # as the fp32 backend sets them; the tf32 codec turns the
    torch.backends.cudnn.allow_tf32 = False  # convolutions' switch on for its own calls
    ckpt = load_checkpoint(ensure_checkpoint(args.model))
    frames = max(args.chunks * CHUNK, 256)  # the batched codec needs its window and a push (CodecRows says)
    decoders = {dtype: build_decoder(ckpt, frames, dtype).to(device) for dtype in (torch.float32, torch.bfloat16)}
    codecs = {
        "fp32": CodecRows(decoders[torch.float32]),
        "tf32": CodecRows(decoders[torch.float32], tf32=True),  # the tf32 codec (codec_dtype="tf32")
        "bf16": CodecRows(decoders[torch.bfloat16]),
    }
    report: dict = {"meta": {"device": args.device, "load_average": os.getloadavg()[0]}, "rows": []}
    for b in args.streams or [32, 128]:
        codes = np.random.default_rng(0).integers(0, 1024, (b, ckpt.config.num_codebooks, args.chunks * CHUNK))
        reference = None
        for form in FORMS:
            wav, seconds = decode(codecs[form], codes, device)
            ms = 1e3 * statistics.median(seconds[1:] or seconds)
            row = {"streams": b, "form": form, "ms_per_call": ms, "ms_per_stream_frame": ms / (b * CHUNK)}
            if reference is None:
                reference = wav
            else:
                row["max_abs_diff"] = max(float(np.abs(w - r).max()) for w, r in zip(wav, reference))
                row["min_cosine"] = min(
                    float((w * r).sum() / (np.linalg.norm(w) * np.linalg.norm(r) + 1e-30))
                    for w, r in zip(wav, reference)
                )
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=2) + "\n")
    for codec in codecs.values():
        codec.close()
    report["complete"] = True
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    rows = [f"B={r['streams']} {r['form']} {r['ms_per_stream_frame']:.3f}" for r in report["rows"]]
    print("codec (ms a stream-frame): " + ", ".join(rows), flush=True)


if __name__ == "__main__":
    main()
