"""bfloat16-weight linears for the torch backend on CUDA: the weights read as the checkpoint stores them (2 bytes
each), the activations and every product and sum in float32. The GPU twin of the CPU's fp16w: a bf16 weight is
exactly an fp32 one, so this computes what fp32 computes on a bf16 checkpoint, reading half the bytes.

One Triton kernel, ``y[M, N] = x[M, K] @ w[N, K]^T (+ b)``, tiles of x (fp32) and w (bf16, widened in registers)
multiplied in IEEE fp32 (no TF32). Triton runs the same kernel on the CPU under ``TRITON_INTERPRET=1``, which is
how the tests prove it (tests/backends/torch/test_bf16w.py). Imported only for the bf16w precision (it needs
``triton``, which PyTorch's CUDA builds bring: :func:`..quantize.widened`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor, nn

from .fused import swiglu
from .kernels import LinearKernel

BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64  # tile sizes: a frame's rows are few (M = 1 .. a batch), weights many


@triton.jit
def _linear(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr,
            BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """y [M, N] fp32 = x [M, K] fp32 @ w [N, K] bf16 ^T (+ b [N] fp32), row-major and contiguous; one BM x BN tile
    of y a program. K is a constant (one compile per input width: a model has three), which also keeps the loop
    bound a Python int under the interpreter (it cannot read a runtime scalar as one with NumPy 2)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        in_k = rk[None, :] < K
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & in_k, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & in_k, other=0.0)
        acc += tl.dot(x, tl.trans(w.to(tl.float32)), input_precision="ieee")  # fp32 products, fp32 sums
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def bf16w_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x`` float32 [..., K] times ``weight`` bfloat16 [N, K] (contiguous), plus ``bias`` float32 [N] -> float32
    [..., N], every product and sum in fp32."""
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k).contiguous()
    m, n = x2.shape[0], weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    grid = (-(-m // BLOCK_M), -(-n // BLOCK_N))
    _linear[grid](
        x2,
        weight,
        y if bias is None else bias,
        y,
        m,
        n,
        K=k,
        HAS_BIAS=bias is not None,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=BLOCK_K,
    )
    return y.view(*lead, n)


def _stored(t: Tensor) -> Tensor:
    """A weight as bfloat16, contiguous (the stored tensor itself when it already is)."""
    return t.detach().to(torch.bfloat16).contiguous()


class Bf16wLinear(LinearKernel):
    """``nn.Linear`` with bfloat16 weights: float32 [..., in_features] -> float32 [..., out_features]."""

    bytes_per_weight = 2.0

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features)
        # buffers, not parameters: apply_precision brings parameters to fp32, these stay as stored
        self.register_buffer("weight", _stored(linear.weight))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: Tensor) -> Tensor:
        return bf16w_linear(x, self.weight, self.bias)


class Bf16wFeedForward(LinearKernel):
    """The SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` with bfloat16 weights; ``w1`` and ``w3`` run as one
    product (their rows stacked: one pass over the input, one launch). ``weights`` counts all three matrices."""

    bytes_per_weight = 2.0

    def __init__(self, ff: nn.Module):
        dim, hidden = ff.w1.in_features, ff.w1.out_features
        super().__init__(dim, dim)
        self.hidden = hidden
        self.register_buffer("w13", _stored(torch.cat([ff.w1.weight.detach(), ff.w3.weight.detach()])))
        self.register_buffer("w2", _stored(ff.w2.weight))

    def forward(self, x: Tensor) -> Tensor:
        return bf16w_linear(swiglu(bf16w_linear(x, self.w13)), self.w2)

    @property
    def weights(self) -> int:
        return 3 * self.in_features * self.hidden
