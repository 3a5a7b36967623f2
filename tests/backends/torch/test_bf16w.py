"""bfloat16-weight linears (backends/torch/bf16w.py): the Triton kernel computes the fp32 product of the stored bf16
weights, and a model with them draws what fp32 draws. Run under Triton's interpreter on the CPU (as CI does) and
natively on CUDA."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from audio8_coreai.config import SamplingParams
from audio8_coreai.model.frame import Frame, FrameInputs
from audio8_coreai.model.layers import FeedForward

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # Triton's interpreter runs the kernel; read when triton is imported and its kernels made
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = pytest.importorskip("triton", reason="the bf16w kernel needs triton (the test extra on Linux x86_64)")


def _bf16(*shape, gen) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).bfloat16()


@pytest.mark.parametrize("m, n, k", [(1, 96, 64), (3, 70, 200), (20, 130, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_kernel_is_the_fp32_product_of_the_stored_weights(m, n, k, bias):
    """Rows below and past one tile, outputs and inputs not multiples of the tiles: the fp64 product of the bf16
    weights to fp32 rounding, rows alone as together."""
    from audio8_coreai.backends.torch.bf16w import bf16w_linear

    gen = torch.Generator().manual_seed(m + n + k)
    x = torch.randn(m, k, generator=gen).to(DEVICE)
    w = _bf16(n, k, gen=gen).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DEVICE) if bias else None
    got = bf16w_linear(x, w, b)
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert ((got.double() - want).abs().max() / want.abs().max()).item() < 1e-6
    alone = torch.cat([bf16w_linear(x[i : i + 1], w, b) for i in range(m)])
    torch.testing.assert_close(alone, got, rtol=0, atol=1e-5)


def test_feed_forward_is_swiglu_with_w1_and_w3_as_one_product():
    from audio8_coreai.backends.torch.bf16w import Bf16wFeedForward

    torch.manual_seed(1)
    ff = FeedForward(64, 128)
    for lin in (ff.w1, ff.w2, ff.w3):
        lin.weight.data = lin.weight.data.bfloat16().float()
    x = torch.randn(2, 3, 64)
    fused = Bf16wFeedForward(ff).to(DEVICE)
    assert fused.w13.dtype == torch.bfloat16 and fused.w13.shape == (256, 64) and fused.weights == 3 * 64 * 128
    want = ff(x)
    got = fused(x.to(DEVICE)).cpu()
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-6


@torch.inference_mode()
def test_a_bf16w_model_draws_what_fp32_draws(bf16_tiny_checkpoint):
    """The tiny checkpoint stored in bf16: with every block linear and head on the kernel (weights kept bf16,
    activations fp32) a prefill and a frame give the fp32 model's logits to 1e-5 and its draws."""
    from audio8_coreai.backends.torch.quantize import apply_precision
    from audio8_coreai.checkpoint import load_checkpoint
    from audio8_coreai.model.dualar import DualAR
    from audio8_coreai.precision import resolve_precision

    ckpt = load_checkpoint(bf16_tiny_checkpoint)
    cfg = ckpt.config
    ref = DualAR.from_state_dict(cfg, ckpt.model_state_dict(), torch.float32, DEVICE)
    low = DualAR.from_state_dict(cfg, ckpt.model_state_dict(), torch.bfloat16, DEVICE)
    apply_precision(low, resolve_precision("bf16w", "torch-cuda"))
    assert low.slow.layers[0].attention.wqkv.weight.dtype == torch.bfloat16
    assert low.slow.norm.weight.dtype == torch.float32
    gen = np.random.default_rng(0)
    prompt = torch.as_tensor(gen.integers(0, cfg.codebook_size, (1, cfg.num_codebooks + 1, 9)), device=DEVICE)
    prompt[:, 0] = torch.as_tensor(gen.integers(cfg.semantic_begin_id, cfg.semantic_end_id, 9), device=DEVICE)
    params = SamplingParams(temperature=0.8, top_k=30, top_p=0.9)
    outs = []
    for model in (ref, low):
        frame, (k, v) = Frame(model), model.new_kv_cache()
        logits, hidden = frame.prefill(prompt, 0, k, v)
        c = cfg.num_codebooks
        inputs = FrameInputs(
            noise_slow=torch.rand(1, 2, cfg.num_semantic + 1, generator=torch.Generator().manual_seed(2)).to(DEVICE),
            window=torch.full((1, cfg.ras_window_size), -1, dtype=torch.long, device=DEVICE),
            noise_fast=torch.rand(1, c - 1, cfg.codebook_size, generator=torch.Generator().manual_seed(3)).to(DEVICE),
            forced=torch.zeros(1, 1 + c, dtype=torch.long, device=DEVICE),
            use_forced=torch.zeros(1, device=DEVICE),
        )
        outs.append((logits, frame.sample(params, logits[:, -1], hidden[:, -1], inputs)))
    (ref_logits, want), (low_logits, got) = outs
    torch.testing.assert_close(low_logits, ref_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.fast_logits, want.fast_logits, rtol=0, atol=1e-5)
    assert int(got.semantic) == int(want.semantic) and torch.equal(got.codes, want.codes)
