"""The pieces of a frame, timed alone: the slow step, the fast AR's rows, the sampler, and the weight-streaming
floor of a precision."""

from __future__ import annotations

from collections.abc import Callable

from .config import FAST_PASSES, median_ms


def linear_modules(module) -> list:
    """Every linear under ``module``: ``nn.Linear`` or a low-precision kernel (:class:`...backends.torch.kernels.
    LinearKernel`, a whole feed-forward for the feed-forward kernels)."""
    from torch import nn

    from ...backends.torch.kernels import LinearKernel

    return [m for m in module.modules() if isinstance(m, (nn.Linear, LinearKernel))]


def _input_dtype(m):
    """The dtype a linear takes: float32 for a kernel, its weight's dtype for ``nn.Linear``."""
    from torch import nn

    return m.weight.dtype if isinstance(m, nn.Linear) else m.input_dtype


def _weights(m) -> int:
    """Weights one call of a linear reads."""
    from torch import nn

    return m.in_features * m.out_features if isinstance(m, nn.Linear) else m.weights


def _weight_bytes(m) -> float:
    """Bytes one call of a linear reads: its weights in their stored form."""
    from torch import nn

    return _weights(m) * (m.weight.element_size() if isinstance(m, nn.Linear) else m.bytes_per_weight)


READ_GIB = 1  # the buffer the read bandwidth is measured on: larger than the caches of the CPUs measured here
_READ = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
x = torch.ones({n}, dtype=torch.float32)
x.sum()
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    x.sum()
    best = min(best, time.perf_counter() - t0)
print(x.numel() * 4 / best / 1e9)
"""


def read_bandwidth_gbps(threads: int) -> float:
    """The CPU's read bandwidth on ``threads`` threads, GB/s (1e9 bytes): the best of 5 ``torch.sum`` over a
    READ_GIB GiB float32 buffer, in a process of its own (the buffer stays out of this one's peak RSS). Raises
    RuntimeError when that process fails."""
    import subprocess
    import sys

    code = _READ.format(n=READ_GIB * 2**28)
    done = subprocess.run([sys.executable, "-c", code, str(max(1, threads))], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the read-bandwidth process failed: {done.stderr.strip()[-300:]}")
    return float(done.stdout)


def weight_floor(backend, runs: int, passes: int = FAST_PASSES) -> dict:
    """The weight-streaming floor of ``backend``'s precision: each linear called once at batch 1 (slow AR once,
    fast AR ``passes`` times in a row), nothing else. Returns ms, and the weights and their bytes read per frame."""
    import torch

    model = backend.model
    slow, fast = linear_modules(model.slow), linear_modules(model.fast)
    dev = backend.device

    def calls(mods):
        xs = [torch.randn(1, 1, m.in_features, device=dev).to(_input_dtype(m)) for m in mods]
        return list(zip(mods, xs))

    slow_calls, fast_calls = calls(slow), calls(fast)

    @torch.inference_mode()
    def run_slow():
        for m, x in slow_calls:
            m(x)
        _sync(dev)

    @torch.inference_mode()
    def run_fast():
        for _ in range(passes):
            for m, x in fast_calls:
                m(x)
        _sync(dev)

    slow_ms, _ = median_ms(run_slow, runs)
    fast_ms, _ = median_ms(run_fast, runs)
    n_slow = sum(_weights(m) for m in slow)
    n_fast = sum(_weights(m) for m in fast)
    bytes_slow = sum(_weight_bytes(m) for m in slow)
    bytes_fast = sum(_weight_bytes(m) for m in fast)
    return {
        "floor_ms": slow_ms + fast_ms,
        "floor_slow_ms": slow_ms,
        "floor_fast_ms": fast_ms,
        "fast_passes": passes,
        "weights_per_frame_m": (n_slow + passes * n_fast) / 1e6,
        "weight_gb_per_frame": (bytes_slow + passes * bytes_fast) / 1e9,
    }


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def frame_parts(backend, params, pos: int) -> dict[str, Callable[[], object]]:
    """Callables for the parts of the torch backend's frame at slot ``pos``: ``slow`` (the slow step on one
    column, writing that slot), ``fast`` (the fast AR's rows, each fed code 0: no sampling), ``sampler`` (every
    draw of a frame on fixed logits)."""
    import torch

    from ...sampling import sample_semantic, sample_top_k_top_p

    frame, cfg, dev = backend.frame_maths, backend.cfg, backend.device
    col = torch.zeros(1, cfg.num_codebooks + 1, 1, dtype=torch.long, device=dev)
    col[0, 0] = cfg.semantic_begin_id
    hidden = torch.randn(1, cfg.dim, device=dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    logits = torch.randn(1, cfg.num_semantic + 1, device=dev) * 3
    fast_logits = torch.randn(1, cfg.codebook_size, device=dev) * 3
    noise = torch.rand(1, 2, cfg.num_semantic + 1, device=dev).clamp(min=1e-6)
    noise_fast = torch.rand(1, cfg.codebook_size, device=dev).clamp(min=1e-6)
    window = torch.full((1, cfg.ras_window_size), -1, dtype=torch.long, device=dev)

    @torch.inference_mode()
    def slow():
        frame.slow_step(col, pos, backend.k_cache, backend.v_cache)
        _sync(dev)

    @torch.inference_mode()
    def fast():
        frame.fast_rows(hidden, zero, lambda row, lg: zero)
        _sync(dev)

    @torch.inference_mode()
    def sampler():
        sample_semantic(logits, noise, window, params, cfg.semantic_begin_id, cfg.eos_token_id, candidates="eager")
        for _ in range(cfg.num_codebooks - 1):
            p = params
            sample_top_k_top_p(fast_logits, noise_fast, p.top_k, p.top_p, p.temperature, candidates="eager")
        _sync(dev)

    return {"slow": slow, "fast": fast, "sampler": sampler}


def count_ops(fn: Callable[[], object]) -> int:
    """The PyTorch operator calls (aten ops, as the dispatcher sees them: each a kernel launch on a GPU, a dispatch
    on a CPU) one call of ``fn`` makes, after a first call not counted (a first call may allocate buffers)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    fn()
    with Count() as mode:
        fn()
    return mode.ops


def frame_ops(backend, params, pos: int) -> dict[str, int]:
    """Operator calls (:func:`count_ops`) of one whole frame of ``backend`` at slot ``pos`` (``ops_per_frame``: the
    slow step on a column, every draw, the host edge) and of each of :func:`frame_parts` (``slow_ops``,
    ``fast_ops``, ``sampler_ops``). A CUDA-graphed frame replays its kernels in one call the dispatcher does not
    see: its ``ops_per_frame`` counts only what the host issues around the replay."""
    import numpy as np

    from ...backends.base import StepInputs

    cfg, rng = backend.cfg, np.random.default_rng(0)
    column = np.zeros(cfg.num_codebooks + 1, dtype=np.int64)
    column[0] = cfg.semantic_begin_id
    step = StepInputs(
        column,
        pos,
        rng.uniform(1e-6, 1.0, (2, cfg.num_semantic + 1)).astype(np.float32),
        np.full(cfg.ras_window_size, -1, dtype=np.int64),
        rng.uniform(1e-6, 1.0, (cfg.num_codebooks - 1, cfg.codebook_size)).astype(np.float32),
    )
    counts = {f"{name}_ops": count_ops(fn) for name, fn in frame_parts(backend, params, pos).items()}
    return {"ops_per_frame": count_ops(lambda: backend.frame(params, step)), **counts}
