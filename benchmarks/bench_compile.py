"""The CPU frame with its blocks compiled by ``torch.compile`` (inductor's C++) against the eager frame, side by side
in one process (issue 27 item 3: fewer operator calls a frame; does compiling them away buy time?).

    python benchmarks/bench_compile.py [--model DIR] [--rounds 6] [--frames 4]

fp16w (the CPU default), one thread. Three forms of the same blocks, taking turns round by round: ``eager``; ``graph
breaks`` (``torch.compile`` of each block as it is: dynamo breaks the graph at every FBGEMM fp16 product, whose
prepacked weight is an opaque object); ``one graph`` (the fp16 product wrapped as a custom op taking a handle, so each
block is one compiled graph). Prints ms per frame (median) of each, the operator calls of an eager frame and the
compile time. A measurement, not a product path: the wrapper lives here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from audio8_coreai import TTS
from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.torch.fp16 import Fp16FeedForward, Fp16Linear
from audio8_coreai.measure.args import count
from audio8_coreai.measure.bench import ensure_checkpoint
from audio8_coreai.measure.bench.parts import count_ops
from audio8_coreai.model.layers import Block
from audio8_coreai.settings import DEFAULTS

PACKED: list = []  # the prepacked weights, by handle
HANDLES: dict[int, int] = {}  # id of a prepacked weight -> its handle (made once: a compiled graph holds it)


@torch.library.custom_op("audio8_bench::fp16_linear", mutates_args=())
def fp16_linear(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic_fp16(x, PACKED[handle])


@fp16_linear.register_fake
def _(x: torch.Tensor, handle: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


def handle(packed) -> int:
    if id(packed) not in HANDLES:
        HANDLES[id(packed)] = len(PACKED)
        PACKED.append(packed)
    return HANDLES[id(packed)]


def traceable(model, on: bool) -> None:
    """Every fp16 product of ``model`` through :func:`fp16_linear` (the same FBGEMM call), or back to its own
    forward."""
    for m in model.modules():
        if not isinstance(m, (Fp16Linear, Fp16FeedForward)):
            continue
        if not on:
            m.__dict__.pop("forward", None)
        elif isinstance(m, Fp16Linear):
            h = handle(m._packed)
            m.forward = lambda x, h=h, n=m.out_features: fp16_linear(x, h, n)
        else:
            h13, h2, hidden, dim = handle(m._w13), handle(m._w2), m.hidden, m.in_features

            def ff(x, h13=h13, h2=h2, hidden=hidden, dim=dim):
                gate, up = fp16_linear(x, h13, 2 * hidden).split(hidden, dim=-1)
                return fp16_linear(F.silu(gate) * up, h2, dim)

            m.forward = ff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path(DEFAULTS.bench.checkpoint))
    ap.add_argument("--rounds", type=count, default=6)
    ap.add_argument("--frames", type=count, default=4, help="frames per timed sample")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64
    tts = TTS.load(ensure_checkpoint(args.model), precision="fp16w", codec_process=False)
    b, cfg, params = tts.backend, tts.config, tts.sampling()
    prompt = tts.prompts.plain("Hello there, this is a test of the compiled frame.")
    b.prefill(prompt)
    rng = np.random.default_rng(0)

    def step(pos: int) -> StepInputs:
        column = np.zeros(cfg.num_codebooks + 1, dtype=np.int64)
        column[0] = cfg.semantic_begin_id
        noise_slow = rng.uniform(1e-6, 1.0, (2, cfg.num_semantic + 1)).astype(np.float32)
        noise_fast = rng.uniform(1e-6, 1.0, (cfg.num_codebooks - 1, cfg.codebook_size)).astype(np.float32)
        return StepInputs(column, pos, noise_slow, np.full(cfg.ras_window_size, -1, dtype=np.int64), noise_fast)

    pos = prompt.shape[1]
    blocks = [m for m in b.model.modules() if isinstance(m, Block)]
    forms = {"eager": [m.forward for m in blocks]}
    ops = count_ops(lambda: b.frame(params, step(pos)))

    def use(name: str) -> None:
        traceable(b.model, name == "one graph")
        for m, f in zip(blocks, forms[name]):
            m.forward = f

    compile_s = {}
    for name in ("graph breaks", "one graph"):
        forms[name] = [torch.compile(f) for f in forms["eager"]]
        use(name)
        t0 = time.perf_counter()
        for i in range(3):  # the slot takes a new value each frame: the third compiles its dynamic form
            b.frame(params, step(pos + i))
        compile_s[name] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(args.rounds):
        for name in forms:
            use(name)
            t0 = time.perf_counter()
            for i in range(args.frames):
                b.frame(params, step(pos + 3 + i))
            times[name].append(1e3 * (time.perf_counter() - t0) / args.frames)
    print(f"eager frame: {ops} operator calls; load average {os.getloadavg()[0]:.2f}")
    for name, t in times.items():
        extra = f" (compiled in {compile_s[name]:.0f} s)" if name in compile_s else ""
        print(f"{name:13s} {statistics.median(t):7.1f} ms/frame{extra}")


if __name__ == "__main__":
    main()
