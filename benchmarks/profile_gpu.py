"""Where a batch-1 graphed frame's time goes on a GPU: the kernels the profiler sees, grouped and ranked, the time the
GPU sits idle between them, and the host's busiest calls.

    python benchmarks/profile_gpu.py [--model DIR] [--device cuda] [--precision fp32 --precision bf16] [--frames 16]
                                     [--top 25] [--json out.json]

At each ``--precision``: the graph-mode TTS (as ``bench_gpu.py single`` loads it; the fused kernels as the settings
say) generates a warm-up (the capture), then ``--frames`` frames of :func:`audio8_coreai.engine.loop.generate` under
:mod:`torch.profiler` from its second frame on. Per frame: wall ms (under the profiler), kernels and their summed ms,
the GPU's busy ms (the union of kernel and copy intervals) and idle ms between them (gaps over 20 us counted, the
kernel before the largest named), the kernels by group (products, attention, Triton, sort/scan, copies, other) and
the ``--top`` kernels by time; the host's ``--top`` calls by self time. The batch-1 frame takes 10.3 ms fp32 on an
H200 against about 0.6 ms of weight reads (benchmarks/README.md): this says whether the rest is kernels or idle GPU.
``--device cpu`` runs the same code (host calls only): a check of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import torch
from bench_batch import SENTENCE
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
    """One warm-up generate, then ``frames`` frames profiled: the per-frame figures the module docstring names."""
    prompt, params = tts.prompts.plain(SENTENCE), tts.sampling()
    generate(tts.backend, prompt, params, seed=0, max_frames=4)  # the capture
    cuda = tts.backend.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof, began = profile(activities=activities), []

    def start(t: int) -> None:  # after the prefill and the first frame: the steady frames alone
        if t == 1:
            if cuda:
                torch.cuda.synchronize(tts.backend.device)
            prof.start()
            began.append(time.perf_counter())

    gen = generate(tts.backend, prompt, params, seed=0, max_frames=frames + 1, on_frame=start)
    if cuda:
        torch.cuda.synchronize(tts.backend.device)
    wall = time.perf_counter() - began[0]
    prof.stop()
    n = gen.codes.shape[1] - 1
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
    ap.add_argument("--frames", type=count, default=16, help="frames profiled")
    ap.add_argument("--top", type=count, default=25, help="kernels and host calls listed")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    check_device(ap, args.device)
    model = ensure_checkpoint(args.model)
    report: dict = {"meta": {"device": args.device, "load_average": os.getloadavg()[0]}, "profiles": {}}
    for precision in args.precision or ["fp32", "bf16"]:
        graphed = load(model, args.device, precision)["graphed"]
        result = {"backend": graphed.backend.description, **frame_profile(graphed, args.frames, args.top)}
        report["profiles"][precision] = result
        print(json.dumps({precision: {k: v for k, v in result.items() if not k.startswith("top_")}}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        del graphed
        release(torch.device(args.device))
    report["complete"] = True
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    rows = [
        f"{p} wall {r['wall_ms_per_frame']:.2f} kernels {r['kernel_ms_per_frame']:.2f} idle "
        f"{r['gpu_idle_ms_per_frame']:.2f} ms ({r['kernels_per_frame']:.0f} kernels)"
        for p, r in report["profiles"].items()
    ]
    print("profile (a frame): " + "; ".join(rows), flush=True)


if __name__ == "__main__":
    main()
