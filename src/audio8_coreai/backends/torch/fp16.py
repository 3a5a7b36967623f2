"""Float16-weight linears for the torch backend on CPU: FBGEMM's fp16 GEMM (``quantized::linear_dynamic_fp16``),
weights stored as float16 (2 bytes each, prepacked once), activations and accumulation in float32.

A bf16 weight converts to float16 exactly unless its magnitude is under 2^-14 (float16's subnormals keep fewer
mantissa bits, down to 2^-24) or over 65504 (refused at load: :mod:`.quantize`): on a bf16 checkpoint the products
are those of the stored weights but for such tiny values, so the draws are the fp32 run's (docs/speed.md,
Precisions, has the agreement counts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .kernels import LinearKernel


def _pack(weight: Tensor, bias: Tensor | None) -> Tensor:
    """FBGEMM's prepacked float16 form of ``weight`` [N, K] (any float dtype) and an fp32 ``bias`` [N]."""
    b = None if bias is None else bias.detach().to("cpu", torch.float32)
    return torch.ops.quantized.linear_prepack_fp16(weight.detach().to("cpu", torch.float32), b)


class Fp16Linear(LinearKernel):
    """``nn.Linear`` with float16 weights: float32 [..., in_features] -> float32 [..., out_features]."""

    bytes_per_weight = 2.0

    def __init__(self, linear: nn.Linear):
        super().__init__(linear.in_features, linear.out_features)
        self._packed = _pack(linear.weight, linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)


class Fp16FeedForward(LinearKernel):
    """The SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` with float16 weights; ``w1`` and ``w3`` run as one
    product (one pass over the input, one call). ``weights`` counts all three matrices."""

    bytes_per_weight = 2.0

    def __init__(self, ff: nn.Module):
        dim, hidden = ff.w1.in_features, ff.w1.out_features
        super().__init__(dim, dim)
        self.hidden = hidden
        self._w13 = _pack(torch.cat([ff.w1.weight.detach(), ff.w3.weight.detach()]), None)
        self._w2 = _pack(ff.w2.weight, None)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = torch.ops.quantized.linear_dynamic_fp16(x, self._w13).split(self.hidden, dim=-1)
        return torch.ops.quantized.linear_dynamic_fp16(F.silu(gate) * up, self._w2)

    @property
    def weights(self) -> int:
        return 3 * self.in_features * self.hidden
