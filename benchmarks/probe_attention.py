"""Which SDPA kernel runs the slow AR's one-query decode attention, and how fast each one is.

    python benchmarks/probe_attention.py [--device cuda] [--batch 1 --batch 128] [--dtype bf16 --dtype fp32]
                                         [--cache 2048] [--reps 50] [--json out.json]

The shapes of a decode step: q [B, 14, 1, 64] over a KV cache k, v [B, 2, L, 64] (2 KV heads) under a key mask
bool [B, 1, 1, L] (each row's own length, drawn at random), in two equal forms:

- **gqa**: ``scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)``;
- **fold**: the GQA folded into the query length: q viewed as [B, 2, 7, 64] (head h shares KV head h // 7, as
  ``enable_gqa`` pairs them), plain masked attention, no ``enable_gqa``; the output viewed back as [B, 14, 1, 64].

For each batch, dtype and form: the kernel SDPA picks by itself (``default``: the aten attention ops and, on CUDA,
the GPU kernels the profiler saw) and each :class:`torch.nn.attention.SDPBackend` alone under ``sdpa_kernel``:
whether it runs, ms per call (``--reps`` calls after a warm-up, device-synchronised) and max |out - ref|
against a float64 MATH reference of the same inputs. A row per (batch, dtype, form) is printed and saved as it
goes; the summary line names each form's default kernel. On the CPU it checks the script (times mean little).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from audio8_coreai.measure.args import check_device, count

HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64  # the slow AR's attention (0.6b)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
BACKENDS = [b for name, b in SDPBackend.__members__.items() if name not in ("ERROR", "OVERRIDEABLE")]


def gqa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def fold(q, k, v, mask):
    b = q.shape[0]
    out = F.scaled_dot_product_attention(q.view(b, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM), k, v, attn_mask=mask)
    return out.reshape(b, HEADS, 1, HEAD_DIM)  # [B, 2, 7, 64] -> [B, 14, 1, 64]


FORMS = {"gqa": gqa, "fold": fold}


def inputs(batch: int, cache: int, device: str, gen: torch.Generator):
    """q [B, 14, 1, 64], k, v [B, 2, L, 64] (float64) and mask bool [B, 1, 1, L], every row 1..L keys long."""
    q = torch.randn(batch, HEADS, 1, HEAD_DIM, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(batch, KV_HEADS, cache, HEAD_DIM, generator=gen, dtype=torch.float64) for _ in range(2))
    lengths = torch.randint(1, cache + 1, (batch, 1), generator=gen)
    mask = (torch.arange(cache) < lengths)[:, None, None, :]
    return [t.to(device) for t in (q, k, v, mask)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def time_ms(fn, device: str, reps: int) -> float:
    """ms per call: 3 warm-up calls, then 5 rounds of ``reps // 5`` calls queued between two synchronisations;
    the median round over its calls."""
    for _ in range(3):
        fn()
    per_round, samples = max(reps // 5, 1), []
    for _ in range(5):
        sync(device)
        t0 = time.perf_counter()
        for _ in range(per_round):
            fn()
        sync(device)
        samples.append(1e3 * (time.perf_counter() - t0) / per_round)
    return statistics.median(samples)


def chosen(fn, device: str) -> dict:
    """The aten attention ops (and on CUDA the GPU kernels, when the profiler can read them) one unrestricted call
    runs."""
    cuda = device.startswith("cuda")
    try:
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            fn()
            sync(device)
    except RuntimeError as e:  # no GPU activity on this machine (CUPTI): the aten ops still name the kernel
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        kernels = [f"not read: {str(e).strip()[:200]}"]
    else:
        kernels = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})[:8]
    ops = sorted({e.name for e in prof.events() if e.name.startswith("aten::_") and "attention" in e.name})
    return {"ops": ops, "kernels": kernels}


def probe(batch: int, dtype: str, form: str, cache: int, device: str, reps: int) -> dict:
    q, k, v, mask = inputs(batch, cache, device, torch.Generator().manual_seed(batch))
    with sdpa_kernel(SDPBackend.MATH):
        ref = gqa(q, k, v, mask)  # float64 MATH: the reference of every backend and form
    q, k, v = (t.to(DTYPES[dtype]) for t in (q, k, v))
    fn = FORMS[form]
    row = {
        "batch": batch,
        "dtype": dtype,
        "form": form,
        "cache": cache,
        "default": chosen(lambda: fn(q, k, v, mask), device),
    }
    row["default"]["ms"] = time_ms(lambda: fn(q, k, v, mask), device, reps)
    for backend in BACKENDS:
        with warnings.catch_warnings(record=True) as why, sdpa_kernel(backend):
            warnings.simplefilter("always")  # torch warns why each kernel it skips does not fit
            try:
                out = fn(q, k, v, mask)
                ms = time_ms(lambda: fn(q, k, v, mask), device, reps)
                row[backend.name] = {"ok": True, "ms": ms, "max_abs_diff": float((out.double() - ref).abs().max())}
            except RuntimeError as e:  # this backend does not take these inputs: torch's reasons
                reasons = [str(w.message).strip() for w in why] or [str(e).strip().splitlines()[0]]
                row[backend.name] = {"ok": False, "error": " | ".join(reasons)[:600]}
    return row


def short(op: str) -> str:
    """aten::_scaled_dot_product_efficient_attention -> efficient_attention."""
    return op.removeprefix("aten::_").removeprefix("scaled_dot_product_")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", action="append", type=count, help="batch sizes (default 1 128)")
    ap.add_argument("--dtype", action="append", choices=sorted(DTYPES), help="dtypes (default bf16 fp32)")
    ap.add_argument("--cache", type=count, default=2048, help="KV cache slots L")
    ap.add_argument("--reps", type=count, default=50)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    check_device(ap, args.device)
    report: dict = {"torch": torch.__version__, "device": args.device, "rows": [], "complete": False}
    if args.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name(args.device)
    for batch in args.batch or [1, 128]:
        for dtype in args.dtype or ["bf16", "fp32"]:
            for form in FORMS:
                row = probe(batch, dtype, form, args.cache, args.device, args.reps)
                report["rows"].append(row)
                print(json.dumps(row), flush=True)
                if args.json:
                    args.json.write_text(json.dumps(report, indent=2) + "\n")
    report["complete"] = True
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    picks = "; ".join(
        f"B={r['batch']} {r['dtype']} {r['form']}: {','.join(short(o) for o in r['default']['ops'])} "
        f"{r['default']['ms']:.3f} ms"
        for r in report["rows"]
    )
    print(f"attention: default kernel per shape: {picks}")


if __name__ == "__main__":
    main()
