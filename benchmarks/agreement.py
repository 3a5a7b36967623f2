"""Teacher-forced draw agreement of torch precisions against the CPU's fp32 on the random 0.6b checkpoint.

Records the CPU fp32 free run of the prompts in ``audio8_coreai.measure.agreement.PROMPTS`` (``--frames`` each,
seed 0; cached in ``--cache`` keyed by checkpoint, frames and seed), then replays it teacher-forced at each
``--precision`` on ``--device`` (the CPU, or CUDA with its default CUDA graphs: is a GPU's fp32 the CPU's?) and
prints semantic and codebook draw agreement against the bars (98.5 % / 97.5 %; exact, 100 %, is fp32's goal).

    python benchmarks/agreement.py --precision int8 --precision int8-int16 [--model DIR] [--device cpu]
                                   [--frames 128] [--prompts 4] [--threads 1] [--json out.json]

The JSON: ``{"meta", "results": [Agreement.to_json() per precision], "complete"}``, written after each precision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from audio8_coreai.backends.torch import resolve_device
from audio8_coreai.errors import Audio8Error
from audio8_coreai.measure.agreement import (
    PROMPTS,
    Agreement,
    add_agreement,
    load_recordings,
    record_reference,
    save_recordings,
)
from audio8_coreai.measure.args import count, count_or_zero
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.precision import resolve_precision, runtime_of
from audio8_coreai.settings import DEFAULTS


def main() -> None:
    """The script: its errors (a checkpoint, a precision, a device, an output it cannot use) in one line."""
    try:
        measure()
    except Audio8Error as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


def measure() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint), help="a checkpoint folder")
    ap.add_argument("--precision", action="append", default=None)
    ap.add_argument("--device", default="cpu", help="where the precisions replay (the recording is the CPU's)")
    ap.add_argument("--frames", type=count, default=128)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1), metavar="N")
    ap.add_argument("--seed", type=count_or_zero, default=0)
    ap.add_argument("--threads", type=count, default=1)
    ap.add_argument("--cache", type=Path, default=Path("~/.cache/audio8-coreai"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    args.precision = args.precision or ["int8", "int8-int16"]
    runtime = runtime_of("torch", resolve_device(args.device).type)
    for name in args.precision:  # before minutes of recording
        resolve_precision(name, runtime)
    if args.json is not None and not args.json.resolve().parent.is_dir():
        ap.error(f"argument --json: {args.json.resolve().parent} is no folder: give a file in an existing folder")
    torch.set_num_threads(args.threads)
    from audio8_coreai.tts import TTS

    ckpt = ensure_checkpoint(args.model, lambda m: print(m, file=sys.stderr))
    from audio8_coreai.checkpoint import load_checkpoint

    args.cache.expanduser().mkdir(parents=True, exist_ok=True)
    weights = load_checkpoint(ckpt).fingerprint()[:12]  # not the folder's name: two folders may share it
    cache = (
        args.cache.expanduser() / f"agreement-{ckpt.name}-{weights}-{args.prompts}x{args.frames}-seed{args.seed}.npz"
    )
    ref = None
    if cache.is_file():
        recs, meta = load_recordings(cache)
        print(f"fp32 recording from {cache}", file=sys.stderr)
    else:
        ref = TTS.load(ckpt, device="cpu", precision="fp32", codec_process=False)
        params = ref.sampling()
        t0 = time.perf_counter()
        recs = [
            record_reference(ref.backend, ref.prompts.plain(text), params, args.seed + i, args.frames)
            for i, text in enumerate(PROMPTS[: args.prompts])
        ]
        meta = {"checkpoint": str(ckpt), "frames": args.frames, "seed": args.seed}
        save_recordings(cache, recs, meta)
        print(f"recorded fp32 in {time.perf_counter() - t0:.0f} s -> {cache}", file=sys.stderr)
        del ref
    results, failed = [], []
    report = {"meta": {**meta, "device": args.device}, "results": results, "complete": False}
    for prec in args.precision:
        tts = TTS.load(ckpt, device=args.device, precision=prec, codec_process=False)
        params = tts.sampling()
        agree = Agreement(tts.backend.description, "torch cpu fp32")
        t0 = time.perf_counter()
        for rec in recs:
            add_agreement(tts.backend, rec, params, agree)
        print(agree.line() + f"  [{time.perf_counter() - t0:.0f} s]")
        results.append(agree.to_json())
        if not agree.passed:
            failed.append(prec)
        del tts
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
    report["complete"] = True
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    rates = [
        f"{r['backend']} {r['semantic'][0]}/{r['semantic'][1]} {r['codebook'][0]}/{r['codebook'][1]}" for r in results
    ]
    print(f"agreement vs torch cpu fp32 (semantic, codebook draws): {'; '.join(rates)}")
    if failed:  # a CI check: exit 1 when a precision is below the bars
        sys.exit(f"below the bars: {', '.join(failed)}")


if __name__ == "__main__":
    main()
