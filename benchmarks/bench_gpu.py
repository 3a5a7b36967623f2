"""GPU speed, one part a run: the frame as a CUDA graph against eager, the batched graphs per bucket, real-time
streams per GPU.

    python benchmarks/bench_gpu.py single|batched|streams [--model DIR] [--device cuda] [--precision bf16 ...]
                                   [--batch 1 --batch 8 ...] [--streams 32 --streams 64 ...] [--frames 32]
                                   [--runs 3] [--rounds 3] [--codec-dtype tf32 ...] [--json out.json]

The checkpoint loaded as an eager backend and a graph-mode one (``cuda_graphs`` False / True), then the part:

1. **single**: at each ``--precision`` (default fp32 and bf16), batch-1 ms per frame, eager against graphed (and,
   on CUDA, graphed without the fused kernels, with how many of its codes the fused frames draw too):
   :func:`audio8_coreai.engine.loop.generate` for ``--frames`` frames (the random checkpoint never draws eos),
   its frame-loop time over its frames; the first run of each is the warm-up (the graph's capture). Target on an
   H200: <= 4 ms per frame graphed.
2. **batched**: :meth:`BatchEngine.step` (one frame for every row) at each ``--batch`` B, eager rows against the
   bucketed graphs (:class:`audio8_coreai.backends.torch.cudagraphs.GraphedRows`); ms per step, ms per frame per
   stream, and the streams the frame loop alone keeps real-time: B x 46.4 ms / ms per step.
3. **streams**: B streams of the same sentence in lock-step, 16-frame chunks: 16 batched steps, then the chunk's
   codes of all B streams decoded in **one** codec call (:meth:`CodecRows.run`, the batched server's codec: every
   stream's state stacked, on its own CUDA stream). ``rtf`` = wall time per chunk over its audio (16 x 46.4 ms),
   sequential (decode, then the next chunk's frames) and overlapped (the decode in a thread while the next
   chunk's frames run), at each ``--codec-dtype`` (the codec's form: ``tf32`` its convolutions in TF32). The largest
   B with RTF <= 1 is the real-time streams per GPU with the codec included.
   Target on an H200: >= 100.

batched and streams run at each ``--precision`` in turn (default bf16 on CUDA, fp32 on the CPU), each row naming its
own; ``--graphed-only`` leaves batched's eager rows out; streams keep the graph-mode backend alone. The JSON
(``--json``) is written after every measurement, ``"complete": true`` once the part ends; the last line printed is
the part's summary. ``--device cpu`` runs the same code (the graph-mode forms uncaptured): a check of the script,
not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from bench_batch import SENTENCE, fill  # the same sentence and filled engine as the CPU batch bench

from audio8_coreai import TTS
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.codec_rows import CodecRows, Push
from audio8_coreai.backends.torch.cudagraphs import StepTimes
from audio8_coreai.engine.batch import BatchEngine
from audio8_coreai.engine.loop import generate
from audio8_coreai.engine.noise import NoiseAhead
from audio8_coreai.measure.args import check_device, count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.settings import DEFAULTS

CHUNK = 16  # frames per streamed chunk (DEFAULTS.speech.chunk_frames)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def single(runs_of: dict[str, TTS], frames: int, runs: int) -> dict:
    """Batch-1 ms per frame of each named TTS (eager, graphed and, on CUDA, graphed without the fused kernels), runs
    taking turns (the first of each a warm-up); and how many of the fused frames' codes the unfused ones draw too
    (the same seed: rounding apart, the same maths)."""
    eager = runs_of["eager"]
    prompt, params = eager.prompts.plain(SENTENCE), eager.sampling()
    times: dict[str, list[float]] = {name: [] for name in runs_of}
    codes = {}
    for _ in range(runs + 1):
        for name, tts in runs_of.items():
            gen = generate(tts.backend, prompt, params, seed=0, max_frames=frames)
            times[name].append(1e3 * gen.frames_s / gen.codes.shape[1])
            codes[name] = gen.codes
    out = {f"{name}_ms_per_frame": statistics.median(t[1:]) for name, t in times.items()}
    out["speedup"] = out["eager_ms_per_frame"] / out["graphed_ms_per_frame"]
    if "graphed_unfused" in codes:
        fused, unfused = codes["graphed"], codes["graphed_unfused"]
        n = min(fused.shape[1], unfused.shape[1])
        out["fused_speedup"] = out["graphed_unfused_ms_per_frame"] / out["graphed_ms_per_frame"]
        out["fused_codes_equal"] = [int((fused[:, :n] == unfused[:, :n]).sum()), int(fused[:, :n].size)]
    return out


@contextmanager
def noise_waits() -> Iterator[list[float]]:
    """Seconds the frame loop spent in :meth:`NoiseAhead.next_frame` (waiting for a stream's noise drawn ahead, or
    drawing it), summed into the yielded list's one entry while the block runs (the method wrapped, then restored)."""
    waited = [0.0]
    original = NoiseAhead.next_frame

    def timed(self: NoiseAhead) -> tuple[np.ndarray, np.ndarray]:
        t0 = time.perf_counter()
        try:
            return original(self)
        finally:
            waited[0] += time.perf_counter() - t0

    NoiseAhead.next_frame = timed
    try:
        yield waited
    finally:
        NoiseAhead.next_frame = original


def batched(
    loaded: dict[str, TTS], sizes: list[int], frames: int, runs: int, frame_s: float, rows: list[dict], save
) -> None:
    """ms per batched step at each size, for each of ``loaded``'s eager rows and bucketed graphs (after one warm-up
    step each): a row per size appended to ``rows``, ``save()`` called after each. The graphs' split adds ``step``,
    the whole step, ``engine``, what it spends outside the frame call (the streams' noise waited for, their
    results recorded), and ``noise_wait``, the part of it spent getting the streams' noise (:func:`noise_waits`)."""
    for b in sizes:
        out = {"batch": b, "precision": loaded["graphed"].backend.precision}
        for name, tts in loaded.items():
            engine = fill(tts, b)
            engine.step()  # warm-up: the bucket's graph captured
            dev = tts.backend.device
            samples = []
            for _ in range(runs):
                sync(dev)
                t0 = time.perf_counter()
                for _ in range(frames):
                    engine.step()
                sync(dev)
                samples.append(1e3 * (time.perf_counter() - t0) / frames)
            ms = statistics.median(samples)
            if engine.batch.graphed is not None:  # one more pass, each step waited for: where its time goes
                engine.batch.times = StepTimes()
                t0 = time.perf_counter()
                with noise_waits() as waited:
                    for _ in range(frames):
                        engine.step()
                split = engine.batch.times.ms()
                split["step"] = 1e3 * (time.perf_counter() - t0) / frames
                split["engine"] = split["step"] - split["host"] - split["replay"] - split["results"]
                split["noise_wait"] = 1e3 * waited[0] / frames  # part of engine
                out[f"{name}_ms_split"] = split
            out[f"{name}_ms_per_step"] = ms
            out[f"{name}_ms_per_frame_per_stream"] = ms / b
            out[f"{name}_streams_model"] = b * 1e3 * frame_s / ms
            del engine
            release(dev)
        if "eager" in loaded:
            out["speedup"] = out["eager_ms_per_step"] / out["graphed_ms_per_step"]
        rows.append(out)
        print(json.dumps(out), flush=True)
        save()


def chunk_codes(engine: BatchEngine) -> np.ndarray:
    """CHUNK batched steps; the codes of every row, int64 [B, C, CHUNK]."""
    rows = len(engine.items)
    steps = [[res.codes for _, res in engine.step()] for _ in range(CHUNK)]
    if any(len(step) != rows for step in steps):
        raise SystemExit("a stream drew eos: time streams on a checkpoint that never does (the random 0.6b one)")
    return np.stack([np.stack(row, -1) for row in zip(*steps)])


def streams(tts: TTS, sizes: list[int], rounds: int, frame_s: float, rows: list[dict], save) -> None:
    """RTF of B lock-step streams with one batched codec call per chunk (the batched server's
    :class:`CodecRows`, on its own CUDA stream), sequential and overlapped: a row per size appended to ``rows``,
    ``save()`` called after each."""
    backend: TorchBackend = tts.backend
    dev = backend.device
    codec = CodecRows(backend.decoder, tf32=backend.codec_tf32)
    with ThreadPoolExecutor(1) as pool:
        for b in sizes:
            engine, decoding = fill(tts, b), [codec.stream() for _ in range(b)]

            def decode(codes: np.ndarray, decoding=decoding) -> list[np.ndarray]:
                return codec.run([Push(s, codes[i : i + 1]) for i, s in enumerate(decoding)])

            decode(chunk_codes(engine))  # warm-up: the bucket's graph, the codec's first push

            t0 = time.perf_counter()
            for _ in range(rounds):
                decode(chunk_codes(engine))
            sequential = (time.perf_counter() - t0) / rounds
            t0 = time.perf_counter()
            pending = pool.submit(decode, chunk_codes(engine))
            for _ in range(rounds - 1):
                codes = chunk_codes(engine)  # the next chunk's frames while the last chunk decodes
                pending.result()
                pending = pool.submit(decode, codes)
            pending.result()
            overlapped = (time.perf_counter() - t0) / rounds
            audio_s = CHUNK * frame_s
            out = {
                "streams": b,
                "precision": backend.precision,
                "rtf_sequential": sequential / audio_s,
                "rtf_overlapped": overlapped / audio_s,
            }
            rows.append(out)
            print(json.dumps(out), flush=True)
            save()
            del engine, decoding
            release(dev)
    codec.close()


def release(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def load(
    model: Path,
    device: str,
    precision: str,
    unfused: bool = False,
    codec_dtype: str | None = DEFAULTS.torch.codec_dtype,
) -> dict[str, TTS]:
    """The eager TTS and the graph-mode one (captured on CUDA, their uncaptured form elsewhere: what the CPU tests
    prove), both with the fused kernels as ``DEFAULTS.torch.fused_kernels`` says (on CUDA by default;
    ``AUDIO8_TORCH__FUSED_KERNELS=false`` turns them off) and the codec at ``codec_dtype``; with ``unfused``, where
    they are on, a graph-mode one without them too."""
    eager = TTS.load(
        model, device=device, precision=precision, codec_dtype=codec_dtype, cuda_graphs=False, codec_process=False
    )
    out = {"eager": eager}
    for name, fused in (("graphed", DEFAULTS.torch.fused_kernels), ("graphed_unfused", False)):
        if name == "graphed" or (unfused and eager.backend.device.type == "cuda" and eager.backend.fused):
            backend = TorchBackend(
                eager.checkpoint,
                device,
                precision,
                codec_dtype,
                frame_mode="graph",
                codec_process=False,
                fused_kernels=fused,
            )
            out[name] = TTS(eager.checkpoint, backend, eager.prompts)
    return out


def summary(part: str, report: dict) -> str:
    """The part's one-line result."""
    if part == "single":
        runs = [
            f"{p} eager {r['eager_ms_per_frame']:.2f} graphed {r['graphed_ms_per_frame']:.2f}"
            + (f" unfused {r['graphed_unfused_ms_per_frame']:.2f}" if "graphed_unfused_ms_per_frame" in r else "")
            for p, r in report["single"].items()
        ]
        return f"single (ms/frame, batch 1): {'; '.join(runs)}"
    if part == "batched":
        rows = [
            f"{r['precision']} B={r['batch']} "
            + (f"{r['eager_ms_per_step']:.2f}/" if "eager_ms_per_step" in r else "")
            + f"{r['graphed_ms_per_step']:.2f}"
            for r in report[part]
        ]
        return f"batched (ms/step, [eager/]graphed): {', '.join(rows)}"
    rows = [
        f"{r['precision']} {r['streams']}: {r['rtf_sequential']:.2f}/{r['rtf_overlapped']:.2f}" for r in report[part]
    ]
    realtime = [f"{p} {n['sequential']}/{n['overlapped']}" for p, n in report["realtime_streams"].items()]
    return (
        f"streams (RTF sequential/overlapped): {', '.join(rows)}; real-time streams (sequential/overlapped) "
        f"{', '.join(realtime)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=["single", "batched", "streams"])
    ap.add_argument(
        "--model",
        type=Path,
        default=Path(DEFAULTS.bench.checkpoint),
        help="checkpoint folder (the default one: random 0.6b, made when absent)",
    )
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (checks the script; times mean nothing there)")
    ap.add_argument(
        "--precision",
        action="append",
        help="torch precision, repeatable: each in turn (default: single fp32 and bf16; batched and streams bf16 on "
        "CUDA, fp32 on the CPU)",
    )
    ap.add_argument("--graphed-only", action="store_true", help="batched: the graphs alone, no eager rows")
    ap.add_argument("--batch", action="append", type=count, help="batched step sizes (default 1 8 32 128)")
    ap.add_argument("--streams", action="append", type=count, help="stream counts (default 8 32 128)")
    ap.add_argument("--frames", type=count, default=32, help="frames per timed run (single and batched)")
    ap.add_argument("--runs", type=count, default=3, help="timed runs (single and batched; medians)")
    ap.add_argument("--rounds", type=count, default=3, help="timed 16-frame chunks per stream count")
    ap.add_argument(
        "--codec-dtype",
        action="append",
        help="streams: the codec's form, repeatable (fp32, bf16, tf32: each in turn; default the settings')",
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    check_device(ap, args.device)
    cuda = args.device.startswith("cuda")
    precisions = args.precision or (["fp32", "bf16"] if args.part == "single" else ["bf16" if cuda else "fp32"])
    model = ensure_checkpoint(args.model)
    meta = {
        "device": torch.cuda.get_device_name(args.device) if cuda else "cpu",
        "torch": torch.__version__,
        "precision": precisions,
        "load_average": os.getloadavg()[0],
    }
    print(json.dumps(meta), flush=True)
    report: dict = {"meta": meta, "complete": False}

    def save() -> None:  # after every measurement: a run cut short by a time limit keeps what it measured
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")

    save()
    if args.part == "single":
        report["single"] = {}
        for precision in precisions:
            loaded = load(model, args.device, precision, unfused=True)
            frame = single(loaded, args.frames, args.runs)
            report["single"][precision] = {**{k: t.backend.description for k, t in loaded.items()}, **frame}
            print(json.dumps({precision: report["single"][precision]}), flush=True)
            save()
            del loaded
            release(torch.device(args.device))
    elif args.part == "batched":
        report["batched"] = []
        for precision in precisions:
            loaded = load(model, args.device, precision)
            if args.graphed_only:
                del loaded["eager"]
            meta[precision] = {name: t.backend.description for name, t in loaded.items()}
            frame_s = loaded["graphed"].checkpoint.codec_config.frame_length / loaded["graphed"].sample_rate
            batched(loaded, args.batch or [1, 8, 32, 128], args.frames, args.runs, frame_s, report["batched"], save)
            del loaded
            release(torch.device(args.device))
    else:
        report["streams"], report["realtime_streams"] = [], {}
        for precision in precisions:
            for codec_dtype in args.codec_dtype or [DEFAULTS.torch.codec_dtype]:
                graphed = load(model, args.device, precision, codec_dtype=codec_dtype)["graphed"]  # graphed alone
                release(graphed.backend.device)
                name = precision if codec_dtype is None else f"{precision} codec {codec_dtype}"
                meta[name] = graphed.backend.description
                frame_s = graphed.checkpoint.codec_config.frame_length / graphed.sample_rate
                first = len(report["streams"])
                streams(graphed, sorted(args.streams or [8, 32, 128]), args.rounds, frame_s, report["streams"], save)
                rows = report["streams"][first:]
                for r in rows:
                    r["precision"] = name
                report["realtime_streams"][name] = {
                    mode: max((r["streams"] for r in rows if r[f"rtf_{mode}"] <= 1.0), default=0)
                    for mode in ("sequential", "overlapped")
                }
                del graphed
                release(torch.device(args.device))
    report["complete"] = True
    save()
    print(summary(args.part, report), flush=True)


if __name__ == "__main__":
    main()
