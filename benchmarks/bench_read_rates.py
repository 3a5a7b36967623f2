"""How fast the CPU frame's weight products read their weights, beside plain reads, on one thread (issue 27:
weights read at the bandwidth; why the fp16 kernel reads below ``torch.sum``'s rate).

    python benchmarks/bench_read_rates.py [--layers 12] [--rounds 7] [--compile]

Matrices of the 0.6b slow AR's shapes (896 wide, feed-forward 4864: the fused qkv and gate+up products, the output
and down ones), ``--layers`` layers' worth (12: 372 MB of fp16 weights, well past the caches), read in turn,
``--rounds`` rounds taking turns so load changes hit every row alike; the best and the median round in GB/s of the
bytes each row reads. Rows: ``torch.sum`` over a 1 GiB float32 buffer (what ``audio8 bench`` calls the read
bandwidth), ``torch.sum`` over the float16 weights, the frame's fp16w products (:class:`Fp16Linear`: FBGEMM's
float16 GEMM at batch 1, through ``quantized::linear_dynamic_fp16``), the same kernel through aten's deprecated
``fbgemm_linear_fp16_weight`` (bit-identical results, less work a call), MKL's fp32 products (fp32's frame: twice
the bytes), and with ``--compile`` a
``torch.compile``d fp16-weight product (inductor's C++; the first call compiles). Also printed: the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch
from torch import nn

from audio8_coreai.backends.torch.fp16 import Fp16Linear
from audio8_coreai.measure.args import count

DIM, FFN = 896, 4864
SHAPES = ((2 * DIM, DIM), (DIM, DIM), (2 * FFN, DIM), (DIM, FFN))  # (out, in) of qkv (approx.), wo, w13, w2


def _rows(layers: int, compiled: bool) -> dict[str, tuple[object, int]]:
    """Name -> (a call reading every matrix once, the bytes it reads)."""
    torch.manual_seed(0)
    linears = [nn.Linear(i, o, bias=False) for _ in range(layers) for o, i in SHAPES]
    halves = [lin.weight.detach().half() for lin in linears]
    fp16w = [Fp16Linear(lin) for lin in linears]
    inputs = {i: torch.randn(1, i) for i in (DIM, FFN)}
    with warnings.catch_warnings():  # aten's own FBGEMM fp16 ops are deprecated: the same kernel, called directly
        warnings.simplefilter("ignore", UserWarning)
        aten = [
            (
                inputs[lin.in_features],
                torch.fbgemm_pack_gemm_matrix_fp16(lin.weight.detach()),
                torch.zeros(lin.out_features),
            )
            for lin in linears
        ]
        torch.fbgemm_linear_fp16_weight(*aten[0])
    flat = torch.cat([h.flatten() for h in halves])
    fp32 = torch.ones(2**28)  # 1 GiB
    nbytes = flat.numel() * 2
    rows = {
        "torch.sum, fp32, 1 GiB": (fp32.sum, fp32.numel() * 4),
        "torch.sum, fp16 weights": (flat.sum, nbytes),
        "fp16w products (the frame's)": (lambda: [k(inputs[k.in_features]) for k in fp16w], nbytes),
        "fp16 products (aten's FBGEMM)": (lambda: [torch.fbgemm_linear_fp16_weight(*a) for a in aten], nbytes),
        "fp32 products (MKL)": (lambda: [lin(inputs[lin.in_features]) for lin in linears], 2 * nbytes),
    }
    if compiled:
        product = torch.compile(lambda x, w: (w.float() * x).sum(-1), dynamic=False)
        rows["fp16 product, torch.compile"] = (lambda: [product(inputs[h.shape[1]], h) for h in halves], nbytes)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=count, default=12)
    ap.add_argument("--rounds", type=count, default=7)
    ap.add_argument("--compile", action="store_true", help="add a torch.compile'd fp16-weight product")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = _rows(args.layers, args.compile)
    for call, _ in rows.values():
        call()  # warm-up (and the compile)
    times: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, (call, _) in rows.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    base = rows["torch.sum, fp32, 1 GiB"][1] / min(times["torch.sum, fp32, 1 GiB"])
    print(
        f"one thread, {args.layers} layers of the 0.6b's slow-AR shapes, {args.rounds} rounds; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for name, (_, nbytes) in rows.items():
        best, median = nbytes / min(times[name]) / 1e9, nbytes / statistics.median(times[name]) / 1e9
        print(f"{name:30s} best {best:5.1f} GB/s  median {median:5.1f} GB/s  ({best / base * 1e9:.0%} of the fp32 sum)")


if __name__ == "__main__":
    main()
