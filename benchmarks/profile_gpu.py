"""Where a graphed frame's time goes on a GPU: the kernels the profiler sees, grouped and ranked, the time the GPU
sits idle between them, and the host's busiest calls; a stream's frames (batch 1) or the batched engine's steps.

    python benchmarks/profile_gpu.py [--model DIR] [--device cuda] [--precision fp32 --precision bf16] [--frames 16]
                                     [--batch 1 --batch 128] [--eager] [--top 25] [--json out.json]

At each ``--precision``: the graph-mode TTS (as ``bench_gpu.py single`` loads it; the fused kernels as the settings
say). At ``--batch`` 1 it generates a warm-up (the capture), then ``--frames`` frames of
:func:`audio8_coreai.engine.loop.generate` under :mod:`torch.profiler` from its second frame on; at B > 1,
``--frames`` steps of B rows of :class:`audio8_coreai.engine.batch.BatchEngine` after two warm-up steps (profile
``"<precision> B=<B>"``); with ``--eager``, batch 1's frames of the eager TTS too (``--no-cuda-graphs``: profile
``"<precision> eager"``, where the host's calls are the frame). Per frame (step): wall ms (under the profiler),
kernels and their summed ms, the GPU's busy ms (the union of kernel and copy intervals) and idle ms between them
(gaps over 20 us counted, the kernel before the largest named), the kernels by group (products, attention, Triton,
sort/scan, copies, other) and the ``--top`` kernels by time; the host's ``--top`` calls by self time. Whether a
frame is the GPU's kernels or its idle time, and which kernels (benchmarks/README.md has what it found). ``--device
cpu`` runs the same code (host calls only): a check of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import torch
from bench_batch import SENTENCE, fill
from bench_gpu import load, release
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from audio8_coreai.engine.loop import generate
from audio8_coreai.measure.args import check_device, count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.settings import DEFAULTS

GROUPS = (  # first match wins: a kernel's group by its name
    ("copy", re.compile(r"^(Memcpy|Memset)|copy_kernel|CatArrayBatched", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|efficient", re.I)),
    ("triton", re.compile(r"^triton", re.I)),
    ("products", re.compile(r"gemm|gemv|cublas|cutlass|xmma|sm\d+_|splitK|dot_kernel", re.I)),
    ("sort/scan", re.compile(r"sort|radix|scan|topk|cub::", re.I)),
)
GAP_US = 20.0


def group_of(name: str) -> str:
    return next((g for g, pattern in GROUPS if pattern.search(name)), "other")


def frame_profile(tts, frames: int, top: int) -> dict:
    """Batch 1: one warm-up generate, then ``frames`` frames profiled (from the second on)."""
    prompt, params = tts.prompts.plain(SENTENCE), tts.sampling()
    generate(tts.backend, prompt, params, seed=0, max_frames=4)  # the capture
    prof, began = profiler(tts), []

    def start(t: int) -> None:  # after the prefill and the first frame: the steady frames alone
        if t == 1:
            sync(tts)
            prof.start()
            began.append(time.perf_counter())

    gen = generate(tts.backend, prompt, params, seed=0, max_frames=frames + 1, on_frame=start)
    sync(tts)
    wall = time.perf_counter() - began[0]
    prof.stop()
    return summary(prof, wall, gen.codes.shape[1] - 1, top)


def rows_profile(tts, batch: int, frames: int, top: int) -> dict:
    """``batch`` rows of the batched engine (:func:`bench_batch.fill`: admitted and stepped once, the bucket's graph
    captured), one more step, then ``frames`` steps profiled (a frame of every row each)."""
    engine = fill(tts, batch)
    engine.step()
    prof = profiler(tts)
    sync(tts)
    prof.start()
    began = time.perf_counter()
    for _ in range(frames):
        engine.step()
    sync(tts)
    wall = time.perf_counter() - began
    prof.stop()
    return summary(prof, wall, frames, top)


def profiler(tts) -> profile:
    cuda = tts.backend.device.type == "cuda"
    return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))


def sync(tts) -> None:
    if tts.backend.device.type == "cuda":
        torch.cuda.synchronize(tts.backend.device)


def summary(prof: profile, wall: float, n: int, top: int) -> dict:
    """The per-frame (per-step) figures the module docstring names, of ``n`` frames profiled in ``wall`` seconds."""
    device_events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in device_events)
    by_name: dict[str, list[float]] = {}
    groups: dict[str, float] = {}
    for start, end, name in spans:
        by_name.setdefault(name, []).append(end - start)
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + (end - start)
    busy = idle = 0.0
    gaps: list[tuple[float, str]] = []
    if spans:
        cur_start, cur_end, last = spans[0][0], spans[0][1], spans[0][2]
        for start, end, name in spans[1:]:
            if start > cur_end:
                busy += cur_end - cur_start
                gaps.append((start - cur_end, last))
                cur_start = start
            if end >= cur_end:
                cur_end, last = end, name
        busy += cur_end - cur_start
        idle = sum(g for g, _ in gaps)
    big = sorted((g for g in gaps if g[0] > GAP_US), reverse=True)
    kernels = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    host = sorted((a for a in prof.key_averages() if a.self_cpu_time_total > 0), key=lambda a: -a.self_cpu_time_total)[
        :top
    ]
    return {
        "frames": n,
        "wall_ms_per_frame": 1e3 * wall / n,
        "kernels_per_frame": len(spans) / n,
        "kernel_ms_per_frame": sum(e - s for s, e, _ in spans) / 1e3 / n,
        "gpu_busy_ms_per_frame": busy / 1e3 / n,
        "gpu_idle_ms_per_frame": idle / 1e3 / n,
        f"gaps_over_{GAP_US:.0f}us_per_frame": len(big) / n,
        "largest_gaps_us_after": [[round(g, 1), name[:100]] for g, name in big[:8]],
        "groups_ms_per_frame": {g: round(t / 1e3 / n, 4) for g, t in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": name[:140], "per_frame": len(t) / n, "us_per_frame": sum(t) / n, "us_each": sum(t) / len(t)}
            for name, t in kernels
        ],
        "top_host": [
            {"name": a.key[:100], "per_frame": a.count / n, "self_us_per_frame": a.self_cpu_time_total / n}
            for a in host
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint), help="checkpoint folder")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (checks the script)")
    ap.add_argument("--precision", action="append", help="torch precision, repeatable (default fp32 and bf16)")
    ap.add_argument("--frames", type=count, default=16, help="frames (batched: steps) profiled")
    ap.add_argument(
        "--batch",
        action="append",
        type=count,
        help="rows: 1 (the default) a stream's frames, more the batched engine's steps",
    )
    ap.add_argument("--eager", action="store_true", help="also batch 1's frames without CUDA graphs")
    ap.add_argument("--top", type=count, default=25, help="kernels and host calls listed")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    check_device(ap, args.device)
    model = ensure_checkpoint(args.model)
    report: dict = {"meta": {"device": args.device, "load_average": os.getloadavg()[0]}, "profiles": {}}
    for precision in args.precision or ["fp32", "bf16"]:
        loaded = load(model, args.device, precision)
        graphed, eager = loaded["graphed"], loaded["eager"]
        runs = [(precision if b == 1 else f"{precision} B={b}", graphed, b) for b in args.batch or [1]]
        for name, tts, batch in runs + ([(f"{precision} eager", eager, 1)] if args.eager else []):
            measured = (
                frame_profile(tts, args.frames, args.top)
                if batch == 1
                else rows_profile(tts, batch, args.frames, args.top)
            )
            result = {"backend": tts.backend.description, "batch": batch, **measured}
            report["profiles"][name] = result
            print(json.dumps({name: {k: v for k, v in result.items() if not k.startswith("top_")}}), flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=2) + "\n")
        del graphed, eager, loaded
        release(torch.device(args.device))
    report["complete"] = True
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    rows = [
        f"{p} wall {r['wall_ms_per_frame']:.2f} kernels {r['kernel_ms_per_frame']:.2f} idle "
        f"{r['gpu_idle_ms_per_frame']:.2f} ms ({r['kernels_per_frame']:.0f} kernels)"
        for p, r in report["profiles"].items()
    ]
    print("profile (a frame or step): " + "; ".join(rows), flush=True)


if __name__ == "__main__":
    main()
