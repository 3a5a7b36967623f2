"""The codec's convolutional layers: Snake, causal conv and transposed conv, residual units, the SEANet encoder and
decoder blocks, ConvNeXt and the quantizer's resampling stacks (publisher's module names)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .transformer import WindowTransformer

RESIDUAL_DILATIONS = (1, 3, 9)  # the three residual units of every SEANet block
RESIDUAL_KERNEL = 7
CONVNEXT_KERNEL = 7
CONVNEXT_EXPANSION = 4  # ConvNeXt hidden width = 4 x latent
LAYER_NORM_EPS = 1e-6  # ConvNeXt LayerNorm
SNAKE_EPS = 1e-9  # Snake: x + sin^2(alpha x) / (alpha + 1e-9)
QUANTIZER_FACTORS = (2, 2)  # the quantizer's downsample / upsample stages (4x in all)
DEFAULT_MAX_FRAMES = 1024  # 47.6 s: covers 30-s voice clips and the publisher's 512-frame generate


class Snake(nn.Module):
    """Snake activation ``x + sin^2(alpha x) / (alpha + 1e-9)``, per-channel ``alpha`` ``[1, C, 1]``."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x + (self.alpha + SNAKE_EPS).reciprocal() * torch.sin(self.alpha * x).pow(2)


class CausalConv(nn.Module):
    """Conv1d padded on the left by ``K - stride`` (K the dilated kernel) and on the right just enough for
    ``ceil(L / stride)`` outputs: the publisher's causal convolution (zero padding)."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.left = (kernel - 1) * dilation + 1 - stride

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[-1]
        right = -length % self.stride
        return self.conv(F.pad(x, (self.left, right)))


class CausalConvTranspose(nn.Module):
    """ConvTranspose1d with ``K - stride`` samples cropped from the right: ``L -> L * stride`` outputs."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(c_in, c_out, kernel, stride=stride)
        self.crop = kernel - stride

    def forward(self, x: Tensor) -> Tensor:
        y = self.full(x)
        return y[..., : y.shape[-1] - self.crop]

    def full(self, x: Tensor) -> Tensor:
        """The uncropped ConvTranspose1d output: ``x`` [B, C_in, L] -> [B, C_out, (L - 1) * stride + K].

        A short input next to the weight (``16 L <= C_in``, kernel ``2 * stride``, as in the streaming decoder's
        first chunks) goes through one matrix product and an overlap-add instead: there oneDNN's transposed
        convolution spends most of a call laying out the weight (the first 1536x768x16 block: 110 ms for a
        2-step input against 7 ms, one thread; measured). Equal up to float rounding (relative 1e-6)."""
        c_in, c_out, kernel = self.conv.weight.shape
        stride, length = self.conv.stride[0], x.shape[-1]
        if kernel != 2 * stride or 16 * length > c_in:
            return self.conv(x)
        # Input step t adds its first ``stride`` outputs at t and its second ``stride`` at t + 1.
        parts = torch.matmul(x.transpose(1, 2), self.conv.weight.reshape(c_in, c_out * kernel))
        parts = parts.view(x.shape[0], length, c_out, 2, stride)
        y = x.new_zeros(x.shape[0], length + 1, c_out, stride)
        y[:, :length] = parts[..., 0, :]
        y[:, 1:] += parts[..., 1, :]
        y = y.permute(0, 2, 1, 3).reshape(x.shape[0], c_out, (length + 1) * stride)
        return y if self.conv.bias is None else y + self.conv.bias[:, None]


class ResidualUnit(nn.Module):
    """Snake -> conv k7 (dilation d) -> Snake -> conv k1, added to the input; shape-preserving."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake(channels),
            CausalConv(channels, channels, RESIDUAL_KERNEL, dilation=dilation),
            Snake(channels),
            CausalConv(channels, channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class EncoderBlock(nn.Module):
    """Three residual units at ``c_in``, Snake, strided conv to ``2 c_in``, optional window transformer."""

    def __init__(self, c_in: int, stride: int, n_layer: int, window: int, ffn: int, head_dim: int, max_positions: int):
        super().__init__()
        layers: list[nn.Module] = [ResidualUnit(c_in, d) for d in RESIDUAL_DILATIONS]
        layers += [Snake(c_in), CausalConv(c_in, 2 * c_in, 2 * stride, stride=stride)]
        if n_layer:
            layers.append(WindowTransformer(2 * c_in, n_layer, head_dim, ffn, window, max_positions))
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class DecoderBlock(nn.Module):
    """Snake, transposed conv ``c_in -> c_in / 2`` (x ``stride`` in time), three residual units."""

    def __init__(self, c_in: int, stride: int):
        super().__init__()
        c_out = c_in // 2
        self.block = nn.Sequential(
            Snake(c_in),
            CausalConvTranspose(c_in, c_out, 2 * stride, stride),
            *[ResidualUnit(c_out, d) for d in RESIDUAL_DILATIONS],
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class ConvNeXt(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm(1e-6) -> Linear 4x -> GELU (erf) -> Linear -> x gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, CONVNEXT_KERNEL, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.pwconv1 = nn.Linear(dim, CONVNEXT_EXPANSION * dim)
        self.pwconv2 = nn.Linear(CONVNEXT_EXPANSION * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.mix(x, self.dwconv(x))

    def mix(self, x: Tensor, h: Tensor) -> Tensor:
        """Everything after the depthwise conv (pointwise in time): ``x`` the block input and ``h`` its
        depthwise conv, both ``[B, C, L]``; the streaming decoder supplies ``h`` from its own conv state."""
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h.transpose(1, 2)))))
        return x + (self.gamma * h).transpose(1, 2)


def resample_stack(latent: int, transposed: bool) -> nn.Sequential:
    """The quantizer's 2 x [conv k2 s2 (no weight norm) -> ConvNeXt]: 4x down, or 4x up when transposed."""
    conv = CausalConvTranspose if transposed else CausalConv
    return nn.Sequential(
        *[nn.Sequential(conv(latent, latent, f, stride=f), ConvNeXt(latent)) for f in QUANTIZER_FACTORS]
    )
