"""The fused CUDA kernels (backends/torch/fused.py, fused_draws.py) compute the unfused maths: RoPE and the KV write
bit for bit, the add bit for bit, the norm and SiLU to fp32 rounding, the sampler's draws equal; a model with them
installed replays the oracle, holds nothing a capture refuses, and leaves no unfused op of its seams. Run under
Triton's interpreter on the CPU (as CI does) and natively on CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.cudagraphs import GraphedFrame, GraphedRows
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.errors import BackendError
from audio8_coreai.measure.parity import run_parity
from audio8_coreai.model.layers import (
    Attention,
    FeedForward,
    IndexKV,
    RMSNorm,
    RowSlotsKV,
    SpanKV,
    rope_rotation,
    rope_table,
)
from tests.backends.torch.capture_support import SETTINGS, RefuseUncapturable, capture_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # Triton's interpreter runs the kernels; read when triton is imported and its kernels made
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="the fused kernels need triton (the test extra on Linux x86_64)")
# after the interpreter is chosen
from audio8_coreai.backends.torch.fused import FusedFeedForward, add_rms_norm, install_fused, rope_kv, swiglu  # noqa: E402
from audio8_coreai.backends.torch.fused_draws import fused_draws  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16]


def assert_bits(got: torch.Tensor, want: torch.Tensor) -> None:
    """``got`` (on the kernels' device) has ``want``'s bits; bfloat16 under the interpreter within one bfloat16
    step instead, as it truncates fp32 to bfloat16 where a GPU rounds to nearest even (triton's
    ``runtime/interpreter.py``)."""
    got = got.cpu()
    if DEVICE == "cuda" or got.dtype != torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm_is_the_add_then_the_norm(dtype, with_delta):
    """Rows of a width that is no power of two, the delta a strided view (the fast AR's last row): the add's exact
    bits, the norm to a rounding of the model dtype."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 96, generator=gen).to(dtype)[:, -1:]  # [3, 1, 96], rows 4 * 96 apart
    delta = torch.randn(3, 4, 96, generator=gen).to(dtype)[:, -1:] if with_delta else None
    norm = RMSNorm(96, 1e-6).to(dtype)
    norm.weight.data = torch.randn(96, generator=gen).to(dtype)
    want_h, want = norm.add(x, delta)
    h, got = add_rms_norm(x.to(DEVICE), None if delta is None else delta.to(DEVICE), norm.weight.to(DEVICE), 1e-6)
    assert h.shape == got.shape == (3, 1, 96) and got.dtype == dtype
    assert_bits(h, want_h)
    ulp = torch.finfo(dtype).eps * (1 if DEVICE == "cuda" else 2)  # the interpreter truncates to bf16
    torch.testing.assert_close(got.cpu(), want, rtol=2 * ulp, atol=2 * ulp * want.abs().max().item())


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_is_silu_of_the_gate_times_the_up(dtype):
    gen = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(5, 2 * 1100, generator=gen) * 4).to(dtype)  # two column blocks, the second ragged
    got = swiglu(gate_up.to(DEVICE)).cpu()
    want = F.silu(gate_up[:, :1100]) * gate_up[:, 1100:]
    assert got.shape == (5, 1100) and got.dtype == dtype
    ulp = torch.finfo(dtype).eps * (1 if DEVICE == "cuda" else 2)  # the interpreter truncates to bf16
    torch.testing.assert_close(got, want, rtol=2 * ulp, atol=2 * ulp)


def _steps(batch: int, width: int):
    """The KV steps a frame takes, each with its slots: the fast AR's first pass (rows 0 and 1 from slot 0,
    causal), an eager slow step (one slice), a graph-mode slow step (an index) and batched rows (a slot a row)."""
    mask = torch.ones(batch, 1, width, 12, dtype=torch.bool)
    if width == 2:
        yield "span-causal", SpanKV(0, 2, causal=True)
    else:
        yield "span", SpanKV(5, 6)
        yield "index", IndexKV(torch.tensor([7]), mask[:1])
        yield "row-slots", RowSlotsKV(torch.tensor([3, 11, 0])[:batch], mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, width", [(1, 2), (1, 1), (3, 1)])
def test_rope_kv_is_the_projection_rotated_and_written_bit_for_bit(dtype, batch, width):
    """q, the key and value caches written: equal to :meth:`Attention.qkv` and the KV step's own write, bit for bit,
    fp32 and bf16, the caches a strided view of a larger state's rows (a bucket of the batched graphs)."""
    torch.manual_seed(batch + width)
    att = Attention(64, 4, 2, 16, qkv_bias=True, o_bias=False).to(dtype)
    x = torch.randn(batch, width, 64).to(dtype)
    table = rope_table(32, 16, 10000.0)
    positions = torch.tensor([[3, 4], [9, 10], [1, 2]])[:batch, :width]
    rotation = rope_rotation(table[positions] if batch > 1 else table[5 : 5 + width].unsqueeze(0))
    for name, kv in _steps(batch, width):
        state = torch.randn(2, 4, 2, 12, 16).to(dtype)  # [layers, rows, n_kv, L, D]; layer 1, rows [0, batch)
        k_want, v_want = state[1:2, :batch].clone(), state[1:2, :batch].clone()
        q, k, v = att.qkv(x, rotation)
        kv.attend(att, q, k, v, k_want, v_want)
        k_got, v_got = state.clone(), state.clone()
        kc, vc = k_got[1:2, :batch].to(DEVICE), v_got[1:2, :batch].to(DEVICE)
        slots = kv.slot_table(batch, width)
        slots = slots.to(DEVICE) if isinstance(slots, torch.Tensor) else slots
        # the projection (a product, not the kernel under test) is the reference's own: a GPU's fp32 product sums in
        # another order than the CPU's, which the first H200 run saw as q 1 ulp apart
        projection = att.wqkv(x).to(DEVICE)
        got = rope_kv(projection, [r.to(DEVICE) for r in rotation], slots, kc, vc, 4, 2, 16)
        assert got.shape == (batch, 4, width, 16), name
        assert_bits(got, q)
        assert_bits(kc, k_want)
        assert_bits(vc, v_want)


def test_fused_feed_forward_stacks_w1_and_w3():
    torch.manual_seed(2)
    ff = FeedForward(64, 128)
    fused = FusedFeedForward(ff)
    assert fused.w13.shape == (256, 64) and fused.weights == 3 * 64 * 128 and fused.input_dtype == torch.float32
    x = torch.randn(2, 3, 64)
    want = ff(x)
    got = fused.to(DEVICE)(x.to(DEVICE)).cpu()
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-6


def _prepared(x: torch.Tensor, top_k: int):
    """The candidates the graph frame's sampler draws over (a stable sort), on the kernels' device."""
    from audio8_coreai.sampling import CANDIDATES

    x = x.to(DEVICE)
    vals, cand = CANDIDATES["sorted"](x, min(top_k, x.shape[-1]))
    return x, vals, cand


@pytest.mark.parametrize("n, top_k", [(1024, 30), (4097, 50), (20, 50)])
def test_fused_draws_are_the_samplers_draws(n, top_k):
    """64 rows, two races of their own top-p and temperature (the semantic id's normal and RAS draws): the index
    the torch ops draw, every row, including a top-k wider than the row."""
    from audio8_coreai.sampling import draws

    gen = torch.Generator().manual_seed(n)
    x, vals, cand = _prepared(torch.randn(64, n, generator=gen) * 3, top_k)
    u = torch.rand(64, 2, n, generator=gen).clamp(min=1e-6).to(DEVICE)
    races = [(u[:, 0], 0.8, 0.7), (u[:, 1], 0.95, 1.5)]
    want, got = draws(x, vals, cand, races), fused_draws(x, vals, cand, races)
    assert [g.shape for g in got] == [(64,), (64,)] and got[0].dtype == torch.int64
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w.cpu())


def test_fused_draws_keep_the_tie_rules():
    """Equal scores and equal uniforms: every race value equal, the lowest index wins; a tiny top-p keeps rank 0
    alone, the lowest index of the best scores; a temperature under the clamp is clamped."""
    x = torch.zeros(2, 50)
    x[1, [7, 30]] = 5.0  # row 1: two best scores, index 7 first
    x, vals, cand = _prepared(x, 20)
    u = torch.full((2, 50), 0.5, device=DEVICE)
    got = fused_draws(x, vals, cand, [(u, 1.0, 1.0), (u, 1e-9, 1.0), (u, 1.0, 1e-12)])
    assert [g.cpu().tolist() for g in got] == [[0, 7], [0, 7], [0, 7]]


def _fused_backend(oracle_dir, mode: str, fused: bool = True) -> TorchBackend:
    """An fp32 backend with the fused kernels (``fused``) or without: on CUDA as the product makes it (graph mode
    captured), on the CPU with them installed by hand (it runs them only under the interpreter, so the backend
    option is CUDA's)."""
    ckpt = load_checkpoint(oracle_dir)
    if DEVICE == "cuda":
        return TorchBackend(ckpt, DEVICE, "fp32", frame_mode=mode, fused_kernels=fused)
    backend = TorchBackend(ckpt, "cpu", "fp32", frame_mode=mode, codec_process=False)
    if fused:
        install_fused(backend.model)
    return backend


def test_a_fused_model_passes_the_oracle(oracle_dir):
    """Every draw the publisher drew, its logits and free runs, through the fused seams as CUDA runs them: prefill
    windows eagerly (slices), frames in graph mode (an index), the recorded batch (an index over its rows). The
    eager frames' slices are the prefill's (and :func:`test_rope_kv_is_the_projection_rotated_and_written_bit_for_bit`
    checks every kind of slot)."""
    report = run_parity(_fused_backend(oracle_dir, "graph"), oracle_dir / "fixture.npz")
    assert report.passed, report.totals()
    assert report.totals()["semantic_draws"][1] > 0


class Kernels(TorchDispatchMode):
    """The kernels a call issues: the dispatcher's ops that run one (views and allocations do not), and the Triton
    launches (``launches``, counted by :func:`counted_launches`)."""

    FREE = {"empty", "empty_strided", "empty_like"}

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.launches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in self.FREE:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return len(self.names) + self.launches


@pytest.fixture
def counted_launches(monkeypatch):
    """Triton launches counted into the active :class:`Kernels`; under the interpreter, its own host copies of the
    arguments kept out of the count (a GPU launch makes none)."""
    from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode

    def counting(launch):
        def run(*args, **kwargs):
            mode = _get_current_dispatch_mode()
            if isinstance(mode, Kernels):
                mode.launches += 1
            with _disable_current_modes():
                return launch(*args, **kwargs)

        return run

    if DEVICE == "cpu":
        from triton.runtime.interpreter import GridExecutor

        monkeypatch.setattr(GridExecutor, "__call__", counting(GridExecutor.__call__))
    else:
        from triton.runtime.jit import JITFunction

        monkeypatch.setattr(JITFunction, "run", counting(JITFunction.run))


def test_the_fused_graph_frame_issues_fewer_kernels_and_none_of_the_seams_ops(oracle_dir, counted_launches):
    """The graph frame's blocks with the kernels installed: no norm, flip (RoPE), index_copy_ (KV write), silu or
    SDPA left, four launches a block (two add + norm, RoPE + KV write, SwiGLU) and its attention's (two a slow block:
    its context's key blocks, then their join; one a fast block, whose keys fit one), one for each final norm and one
    a draw (the semantic id's two, a codebook's one), and at least 8 kernels a block fewer than the unfused frame's;
    the draws leave no softmax, cumulative sum or log."""
    kernels = {}
    for fused in (False, True):
        backend = _fused_backend(oracle_dir, "eager", fused)
        k, v = backend.model.new_kv_cache()
        graphed = GraphedFrame(backend.model, k, v, capture=False)
        inputs = capture_inputs(backend.cfg, 1, torch.tensor([5]), forced=False, device=DEVICE)
        with torch.inference_mode(), RefuseUncapturable(), Kernels() as mode:
            graphed(SETTINGS["sampled"], inputs)
        kernels[fused] = mode
    cfg = backend.cfg
    passes = cfg.num_codebooks - 1  # the fast AR's passes a frame: rows 0 and 1 in one, then one a row
    blocks, norms = cfg.n_layer + passes * cfg.n_fast_layer, 1 + passes
    draws = 2 + passes
    assert not {"rms_norm", "flip", "index_copy_", "silu", "softmax", "cumsum", "log"} & set(kernels[True].names)
    assert not [name for name in kernels[True].names if "scaled_dot_product" in name]
    assert any("scaled_dot_product" in name for name in kernels[False].names)
    attention = 2 * cfg.n_layer + passes * cfg.n_fast_layer
    assert kernels[False].launches == 0 and kernels[True].launches == 4 * blocks + attention + norms + draws
    assert kernels[False].total - kernels[True].total >= 8 * blocks, (kernels[False].total, kernels[True].total)


def test_fused_batched_rows_are_the_unfused_rows(oracle_dir):
    """The batched graphs' frame (:class:`GraphedRows`: each row at its own slot, a frame 0 blended in, padding) with
    the kernels installed: nothing a capture refuses, and the unfused rows' logits, hidden and KV state to fp32
    rounding, row by row."""
    cfg = load_checkpoint(oracle_dir).config
    rows = [(2, 7, False), (0, 9, False), (3, 0, True)]  # (KV row, slot, frame 0); row 1 padding
    inputs = capture_inputs(cfg, 3, torch.tensor([slot for _, slot, _ in rows]), forced=False)
    gen = torch.Generator().manual_seed(4)
    prefilled = {3: (torch.rand(cfg.num_semantic + 1, generator=gen), torch.rand(cfg.dim, generator=gen))}
    results = {}
    for fused in (False, True):
        backend = _fused_backend(oracle_dir, "eager", fused)
        k, v = backend.model.new_kv_cache(batch=4)
        k.copy_(torch.randn(k.shape, generator=torch.Generator().manual_seed(5)))
        v.copy_(torch.randn(v.shape, generator=torch.Generator().manual_seed(6)))
        graphed = GraphedRows(backend.model, k, v, (1, 2, 4), capture=False)
        calls = [
            (
                row,
                StepInputs(
                    None if first else inputs.column[i, :, 0].numpy(),
                    slot,
                    inputs.noise_slow[i].numpy(),
                    inputs.window[i].numpy(),
                    inputs.noise_fast[i].numpy(),
                ),
            )
            for i, (row, slot, first) in enumerate(rows)
        ]
        graphed.stage(calls, {r: (lg.to(DEVICE), h.to(DEVICE)) for r, (lg, h) in prefilled.items()})
        with torch.inference_mode(), RefuseUncapturable():
            out, _ = graphed.replay(SETTINGS["sampled"], 4)
        results[fused] = (out.logits.cpu(), out.hidden.cpu(), k.cpu(), v.cpu())
    for got, want in zip(results[True], results[False]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(DEVICE == "cuda", reason="on CUDA the option is the product's")
def test_fused_kernels_are_cuda_only(oracle_dir):
    with pytest.raises(BackendError, match="fused kernels are CUDA kernels.*AUDIO8_TORCH__FUSED_KERNELS"):
        TorchBackend(load_checkpoint(oracle_dir), "cpu", "fp32", fused_kernels=True, codec_process=False)
    backend = TorchBackend(load_checkpoint(oracle_dir), "cpu", "fp32", codec_process=False)
    assert not backend.fused and "fused" not in backend.description
