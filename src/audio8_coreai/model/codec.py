"""The DAC-style codec of Audio8-TTS (the publisher's ``ArkttsCodec``, SPEC.md sections 3.2, 8 and 10).

44.1 kHz mono audio <-> 10 codebooks per 2048-sample frame (1 semantic codebook, 9 residual ones).

* :class:`CodecDecoder`: codes ``[B, 10, T]`` -> waveform ``[B, 2048 T]``: sum of the codebook vectors
  projected to the latent (after clamping the codes), the window-128 ``post_module`` transformer, a 4x
  ConvNeXt upsample and the SEANet decoder (transposed convs 8, 8, 4, 2, tanh at the end).
* :class:`CodecEncoder`: audio ``[B, 1, N]`` -> codes ``[B, 10, N / 2048]``: the SEANet encoder (strides
  2, 4, 8, 8, a window-512 transformer in its last block), a 2x2 ConvNeXt downsample, the window-128
  ``pre_module`` transformer and residual vector quantisation by cosine similarity.

Every convolution is causal, so a prefix of frames decodes to the prefix of the audio. The modules hold
plain ``nn.Conv1d`` weights: the publisher's weight norm is folded when a checkpoint is loaded. Module
names mirror the publisher's key names (minus the weight-norm suffixes), so loading is a rename-free copy.
Shapes are static: the RoPE tables and window masks are precomputed buffers sized by ``max_frames`` (no trig
and no comparison chain in a traced graph, as the Core AI GPU delegate needs), so the modules can be traced
by ``torch.export``; export at a fixed bucket with ``max_frames`` equal to the bucket to embed no surplus.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import CodecConfig
from .layers import FeedForward, RMSNorm, apply_rope, rope_table

RMS_NORM_EPS = 1e-5  # codec transformer RMSNorm (SPEC.md section 10, item 3)
LAYER_NORM_EPS = 1e-6  # ConvNeXt LayerNorm
SNAKE_EPS = 1e-9  # Snake: x + sin^2(alpha x) / (alpha + 1e-9)
ROPE_BASE = 10000.0  # codec transformers (the LM uses 1e6)
RESIDUAL_DILATIONS = (1, 3, 9)  # the three residual units of every SEANet block
RESIDUAL_KERNEL = 7
CONVNEXT_KERNEL = 7
CONVNEXT_EXPANSION = 4  # ConvNeXt hidden width = 4 x latent
QUANTIZER_FACTORS = (2, 2)  # the quantizer's downsample / upsample stages (4x in all)
DEFAULT_MAX_FRAMES = 1024  # 47.6 s: covers 30-s voice clips and the publisher's 512-frame generate

_WN_PARAMETRIZED = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
_WN_LEGACY = (".weight_g", ".weight_v")


# ----------------------------------------------------------------------------------------------------
# Checkpoint layout


def codec_param_shapes(cfg: CodecConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the publisher's ``codec.pth`` with its shape, in the file's order.

    Names and shapes follow SPEC.md section 3.2: parametrized weight norm (``original0`` = g ``[dim0, 1, 1]``,
    ``original1`` = v) on the encoder/decoder convs, legacy weight norm (``weight_g``/``weight_v``) on the
    VQ projections, plain convs in the quantizer's down/upsample (ConvTranspose weights are
    ``[in, out, k]``). For ``CodecConfig()`` this is the 535-tensor list of ``param_shapes_0.6b.json``.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    latent = cfg.latent_dim

    def wn_conv(prefix: str, c_in: int, c_out: int, k: int, transposed: bool = False) -> None:
        dim0, dim1 = (c_in, c_out) if transposed else (c_out, c_in)
        shapes[f"{prefix}.conv.bias"] = (c_out,)
        shapes[f"{prefix}.conv.parametrizations.weight.original0"] = (dim0, 1, 1)
        shapes[f"{prefix}.conv.parametrizations.weight.original1"] = (dim0, dim1, k)

    def residual_unit(prefix: str, ch: int) -> None:
        shapes[f"{prefix}.block.0.alpha"] = (1, ch, 1)
        wn_conv(f"{prefix}.block.1", ch, ch, RESIDUAL_KERNEL)
        shapes[f"{prefix}.block.2.alpha"] = (1, ch, 1)
        wn_conv(f"{prefix}.block.3", ch, ch, 1)

    def transformer(prefix: str, dim: int, n_layer: int, ffn: int) -> None:
        for i in range(n_layer):
            p = f"{prefix}.layers.{i}"
            shapes[f"{p}.attention.wqkv.weight"] = (3 * dim, dim)
            shapes[f"{p}.attention.wo.weight"] = (dim, dim)
            shapes[f"{p}.feed_forward.w1.weight"] = (ffn, dim)
            shapes[f"{p}.feed_forward.w3.weight"] = (ffn, dim)
            shapes[f"{p}.feed_forward.w2.weight"] = (dim, ffn)
            shapes[f"{p}.ffn_norm.weight"] = (dim,)
            shapes[f"{p}.attention_norm.weight"] = (dim,)
            shapes[f"{p}.attention_layer_scale.gamma"] = (dim,)
            shapes[f"{p}.ffn_layer_scale.gamma"] = (dim,)
        shapes[f"{prefix}.norm.weight"] = (dim,)

    def convnext(prefix: str) -> None:
        hidden = CONVNEXT_EXPANSION * latent
        shapes[f"{prefix}.gamma"] = (latent,)
        shapes[f"{prefix}.dwconv.conv.weight"] = (latent, 1, CONVNEXT_KERNEL)
        shapes[f"{prefix}.dwconv.conv.bias"] = (latent,)
        shapes[f"{prefix}.norm.weight"] = (latent,)
        shapes[f"{prefix}.norm.bias"] = (latent,)
        shapes[f"{prefix}.pwconv1.weight"] = (hidden, latent)
        shapes[f"{prefix}.pwconv1.bias"] = (hidden,)
        shapes[f"{prefix}.pwconv2.weight"] = (latent, hidden)
        shapes[f"{prefix}.pwconv2.bias"] = (latent,)

    def vq(prefix: str, size: int) -> None:
        d = cfg.codebook_dim
        shapes[f"{prefix}.in_proj.bias"] = (d,)
        shapes[f"{prefix}.in_proj.weight_g"] = (d, 1, 1)
        shapes[f"{prefix}.in_proj.weight_v"] = (d, latent, 1)
        shapes[f"{prefix}.out_proj.bias"] = (latent,)
        shapes[f"{prefix}.out_proj.weight_g"] = (latent, 1, 1)
        shapes[f"{prefix}.out_proj.weight_v"] = (latent, d, 1)
        shapes[f"{prefix}.codebook.weight"] = (size, d)

    # Encoder: stem, one block per stride (channels double), Snake, k3 conv to the latent.
    ch = cfg.encoder_base_channels
    wn_conv("encoder.block.0", 1, ch, 7)
    for b, (stride, n_layer) in enumerate(zip(cfg.encoder_strides, cfg.encoder_transformer_layers), 1):
        p = f"encoder.block.{b}"
        for r in range(len(RESIDUAL_DILATIONS)):
            residual_unit(f"{p}.block.{r}", ch)
        shapes[f"{p}.block.3.alpha"] = (1, ch, 1)
        wn_conv(f"{p}.block.4", ch, 2 * ch, 2 * stride)
        ch *= 2
        if n_layer:
            transformer(f"{p}.block.5", ch, n_layer, cfg.encoder_transformer_intermediate_size)
    n = len(cfg.encoder_strides)
    shapes[f"encoder.block.{n + 1}.alpha"] = (1, ch, 1)
    wn_conv(f"encoder.block.{n + 2}", ch, latent, 3)

    # Quantizer.
    vq("quantizer.semantic_quantizer.quantizers.0", cfg.semantic_codebook_size)
    for i in range(cfg.residual_codebooks):
        vq(f"quantizer.quantizer.quantizers.{i}", cfg.residual_codebook_size)
    for kind in ("downsample", "upsample"):
        for i, factor in enumerate(QUANTIZER_FACTORS):
            shapes[f"quantizer.{kind}.{i}.0.conv.weight"] = (latent, latent, factor)
            shapes[f"quantizer.{kind}.{i}.0.conv.bias"] = (latent,)
            convnext(f"quantizer.{kind}.{i}.1")
    qt = cfg.quantizer_transformer
    transformer("quantizer.pre_module", latent, qt.n_layer, qt.intermediate_size)
    transformer("quantizer.post_module", latent, qt.n_layer, qt.intermediate_size)

    # Decoder: stem, one block per stride (channels halve), Snake, k7 conv to one channel.
    ch = cfg.decoder_channels
    wn_conv("decoder.model.0", latent, ch, 7)
    for b, stride in enumerate(cfg.decoder_strides, 1):
        p = f"decoder.model.{b}"
        shapes[f"{p}.block.0.alpha"] = (1, ch, 1)
        wn_conv(f"{p}.block.1", ch, ch // 2, 2 * stride, transposed=True)
        ch //= 2
        for r in range(len(RESIDUAL_DILATIONS)):
            residual_unit(f"{p}.block.{r + 2}", ch)
    n = len(cfg.decoder_strides)
    shapes[f"decoder.model.{n + 1}.alpha"] = (1, ch, 1)
    wn_conv(f"decoder.model.{n + 2}", ch, 1, 7)
    return shapes


def normalize_codec_state_dict(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Apply the publisher's codec loading rules to a loaded ``codec.pth`` dict (SPEC.md section 3.2).

    1. unwrap a top-level ``state_dict`` entry if present;
    2. if any key contains ``generator.``, keep only those keys and strip everything up to and including
       ``generator.``;
    3. drop keys ending in ``freqs_cis`` or ``causal_mask`` (buffers some exports carry).

    Pure dict manipulation: tensors are returned as given (no copy, no dtype change).
    """
    if "state_dict" in sd and isinstance(sd["state_dict"], Mapping):
        sd = sd["state_dict"]
    if any("generator." in k for k in sd):
        sd = {k.split("generator.", 1)[1]: v for k, v in sd.items() if "generator." in k}
    return {k: v for k, v in sd.items() if not k.endswith(("freqs_cis", "causal_mask"))}


def _canonical(key: str) -> tuple[str, str]:
    """``(module weight name, role)``: role ``g``/``v`` for either weight-norm flavour, ``""`` otherwise."""
    for (g_suffix, v_suffix) in (_WN_PARAMETRIZED, _WN_LEGACY):
        if key.endswith(g_suffix):
            return key[: -len(g_suffix)] + ".weight", "g"
        if key.endswith(v_suffix):
            return key[: -len(v_suffix)] + ".weight", "v"
    return key, ""


def _load_checkpoint(module: nn.Module, cfg: CodecConfig, sd: Mapping[str, Tensor], dtype: torch.dtype) -> None:
    """Validate ``sd`` against the publisher layout and assign the folded tensors ``module`` needs.

    Weight norm is folded as g * v / ||v|| with the norm over every axis but 0 (for ConvTranspose1d axis 0
    is the input channel), computed in float32 like ``torch._weight_norm``. Either flavour is accepted for
    any weight-normed tensor. Raises ValueError naming unexpected keys, missing keys or wrong shapes.
    """
    sd = normalize_codec_state_dict(sd)
    expected = {_canonical(k): (k, shape) for k, shape in codec_param_shapes(cfg).items()}
    given = {}
    unexpected = []
    for k, v in sd.items():
        c = _canonical(k)
        if c not in expected:
            unexpected.append(k)
        else:
            given[c] = (k, v)
    if unexpected:
        raise ValueError(f"codec checkpoint: unexpected keys {sorted(unexpected)}")
    wanted = set(module.state_dict())
    missing = sorted(name for c, (name, _) in expected.items() if c[0] in wanted and c not in given)
    if missing:
        raise ValueError(f"codec checkpoint: missing keys {missing}")
    bad = [f"{k} {tuple(v.shape)} (expected {expected[c][1]})" for c, (k, v) in given.items()
           if tuple(v.shape) != expected[c][1]]
    if bad:
        raise ValueError(f"codec checkpoint: wrong shapes {bad}")

    state = {}
    for name in wanted:
        if (name, "") in given:
            state[name] = given[(name, "")][1].to(torch.float32)
        else:
            g = given[(name, "g")][1].to(torch.float32)
            v = given[(name, "v")][1].to(torch.float32)
            norm = torch.linalg.vector_norm(v.reshape(v.shape[0], -1), dim=1).reshape(g.shape)
            state[name] = v * (g / norm)
    module.load_state_dict({k: t.to(dtype) for k, t in state.items()}, strict=True, assign=True)
    module.eval().requires_grad_(False)


# ----------------------------------------------------------------------------------------------------
# Convolutional layers


class _Snake(nn.Module):
    """Snake activation ``x + sin^2(alpha x) / (alpha + 1e-9)``, per-channel ``alpha`` ``[1, C, 1]``."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        return x + (self.alpha + SNAKE_EPS).reciprocal() * torch.sin(self.alpha * x).pow(2)


class _CausalConv(nn.Module):
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


class _CausalConvTranspose(nn.Module):
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


class _ResidualUnit(nn.Module):
    """Snake -> conv k7 (dilation d) -> Snake -> conv k1, added to the input; shape-preserving."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            _Snake(channels),
            _CausalConv(channels, channels, RESIDUAL_KERNEL, dilation=dilation),
            _Snake(channels),
            _CausalConv(channels, channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class _EncoderBlock(nn.Module):
    """Three residual units at ``c_in``, Snake, strided conv to ``2 c_in``, optional window transformer."""

    def __init__(self, c_in: int, stride: int, n_layer: int, window: int, ffn: int, head_dim: int,
                 max_positions: int):
        super().__init__()
        layers: list[nn.Module] = [_ResidualUnit(c_in, d) for d in RESIDUAL_DILATIONS]
        layers += [_Snake(c_in), _CausalConv(c_in, 2 * c_in, 2 * stride, stride=stride)]
        if n_layer:
            layers.append(_WindowTransformer(2 * c_in, n_layer, head_dim, ffn, window, max_positions))
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class _DecoderBlock(nn.Module):
    """Snake, transposed conv ``c_in -> c_in / 2`` (x ``stride`` in time), three residual units."""

    def __init__(self, c_in: int, stride: int):
        super().__init__()
        c_out = c_in // 2
        self.block = nn.Sequential(
            _Snake(c_in),
            _CausalConvTranspose(c_in, c_out, 2 * stride, stride),
            *[_ResidualUnit(c_out, d) for d in RESIDUAL_DILATIONS],
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class _ConvNeXt(nn.Module):
    """Causal depthwise conv k7 -> LayerNorm(1e-6) -> Linear 4x -> GELU (erf) -> Linear -> x gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = _CausalConv(dim, dim, CONVNEXT_KERNEL, groups=dim)
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


# ----------------------------------------------------------------------------------------------------
# Window transformer


class _LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


def _window_mask(positions: int, window: int) -> Tensor:
    """Bool ``[positions, positions]``: query ``i`` attends to key ``j`` iff ``i - window < j <= i``."""
    ones = torch.ones(positions, positions, dtype=torch.bool, device="cpu")
    return ones.tril() & ~ones.tril(-window)


class _Attention(nn.Module):
    def __init__(self, dim: int, head_dim: int):
        super().__init__()
        self.n_head = dim // head_dim
        self.head_dim = head_dim
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor, past: list[Tensor] | None = None) -> Tensor:
        """``x`` [B, L, dim] with ``rope`` [L, head_dim/2, 2] and ``mask`` bool [L, P + L] (True = attend).

        ``past`` (incremental decoding): the rotated keys and values [B, H, P, head_dim] of the P positions
        before ``x`` (an empty list at the start), prepended to this call's; the list is replaced by the
        concatenation [B, H, P + L, head_dim] (the caller trims it to the window).
        """
        b, length, dim = x.shape
        q, k, v = self.wqkv(x).view(b, length, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        rope = rope.unsqueeze(0)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if past is not None:
            if past:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            past[:] = [k, v]
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, length, dim))


class _TransformerLayer(nn.Module):
    def __init__(self, dim: int, head_dim: int, ffn: int):
        super().__init__()
        self.attention = _Attention(dim, head_dim)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim, RMS_NORM_EPS)
        self.ffn_norm = RMSNorm(dim, RMS_NORM_EPS)
        self.attention_layer_scale = _LayerScale(dim)
        self.ffn_layer_scale = _LayerScale(dim)

    def forward(self, x: Tensor, rope: Tensor, mask: Tensor, past: list[Tensor] | None = None) -> Tensor:
        h = x + self.attention_layer_scale(self.attention(self.attention_norm(x), rope, mask, past))
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h)))


class _WindowTransformer(nn.Module):
    """Pre-norm transformer over ``[B, C, L]`` (channels first in and out) with a final RMSNorm.

    Query ``i`` sees keys ``i - window + 1 .. i`` (causal, sliding window); RoPE base 10000 over positions
    ``0 .. L-1`` of this call. Both come from buffers built for ``max_positions``; raises ValueError when
    ``L`` exceeds it.
    """

    def __init__(self, dim: int, n_layer: int, head_dim: int, ffn: int, window: int, max_positions: int):
        super().__init__()
        self.layers = nn.ModuleList(_TransformerLayer(dim, head_dim, ffn) for _ in range(n_layer))
        self.norm = RMSNorm(dim, RMS_NORM_EPS)
        self.window = window
        self.register_buffer("rope", rope_table(max_positions, head_dim, ROPE_BASE), persistent=False)
        self.register_buffer("mask", _window_mask(max_positions, window), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        length = x.shape[-1]
        if length > self.mask.shape[0]:
            raise ValueError(f"codec transformer: {length} positions exceed max_positions {self.mask.shape[0]} "
                             "(build the codec with a larger max_frames)")
        rope, mask = self.rope[:length], self.mask[:length, :length]
        h = x.transpose(1, 2)
        for layer in self.layers:
            h = layer(h, rope, mask)
        return self.norm(h).transpose(1, 2)

    def step(self, x: Tensor, start: int, past: list[list[Tensor]]) -> Tensor:
        """Incremental :meth:`forward`: ``x`` [B, C, n] holds positions ``start .. start + n - 1`` of a sequence
        whose earlier positions went through earlier calls; returns their outputs [B, C, n], equal (up to float
        rounding) to the same columns of ``forward`` on the whole sequence.

        ``past`` holds one list per layer (empty at ``start`` 0) with that layer's rotated keys and values of
        the last ``window - 1`` positions, all a later query can see; it is updated in place. Each layer needs
        its own keys because its input at a position depends on everything before (stacked layers see
        ``n_layer x (window - 1)`` positions back), so a re-run over a window of recent frames would not be
        exact. RoPE and the mask use absolute positions, so ``start + n`` must not exceed ``max_positions``
        (ValueError).
        """
        end = start + x.shape[-1]
        if end > self.mask.shape[0]:
            raise ValueError(f"codec transformer: position {end} exceeds max_positions {self.mask.shape[0]} "
                             "(build the codec with a larger max_frames)")
        cached = past[0][0].shape[2] if past[0] else 0
        rope, mask = self.rope[start:end], self.mask[start:end, start - cached:end]
        h = x.transpose(1, 2)
        for layer, kv in zip(self.layers, past):
            h = layer(h, rope, mask, kv)
            kv[:] = [t[:, :, max(0, t.shape[2] - self.window + 1):] for t in kv]
        return self.norm(h).transpose(1, 2)


# ----------------------------------------------------------------------------------------------------
# Vector quantisers


class _VectorQuantizer(nn.Module):
    """One VQ: WN conv1x1 ``latent -> codebook_dim`` (encoder only), codebook, WN conv1x1 back to latent."""

    def __init__(self, latent: int, size: int, dim: int, with_in_proj: bool):
        super().__init__()
        if with_in_proj:
            self.in_proj = nn.Conv1d(latent, dim, 1)
        self.out_proj = nn.Conv1d(dim, latent, 1)
        self.codebook = nn.Embedding(size, dim)

    def decode(self, codes: Tensor) -> Tensor:
        """codes int ``[B, T]`` (in range) -> ``[B, latent, T]``: the codebook rows projected back."""
        return self.out_proj(self.codebook(codes).transpose(1, 2))

    def encode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """``z`` ``[B, latent, T]`` -> (codes int64 ``[B, T]``, back-projection ``[B, latent, T]``).

        The nearest codebook row to the projected vector, both L2-normalised (nearest by cosine), as the
        publisher's quantizer; the back-projection uses the un-normalised row.
        """
        e = F.normalize(self.in_proj(z).transpose(1, 2), dim=-1)  # [B, T, d]
        cb = F.normalize(self.codebook.weight, dim=-1)  # [K, d]
        dist = e.pow(2).sum(-1, keepdim=True) - 2 * e @ cb.t() + cb.pow(2).sum(-1)
        codes = (-dist).argmax(-1)  # = argmin (first of equals alike); coreai-torch lowers argmax only
        return codes, self.decode(codes)


class _ResidualVQ(nn.Module):
    def __init__(self, n: int, latent: int, size: int, dim: int, with_in_proj: bool):
        super().__init__()
        self.quantizers = nn.ModuleList(_VectorQuantizer(latent, size, dim, with_in_proj) for _ in range(n))

    def decode(self, codes: Tensor) -> Tensor:
        """codes ``[B, n, T]`` -> sum of the ``n`` back-projections ``[B, latent, T]``."""
        out = self.quantizers[0].decode(codes[:, 0])
        for i in range(1, len(self.quantizers)):
            out = out + self.quantizers[i].decode(codes[:, i])
        return out

    def encode(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """``z`` ``[B, latent, T]`` -> (codes ``[B, n, T]``, residual left after the last VQ)."""
        codes = []
        for vq in self.quantizers:
            c, zq = vq.encode(z)
            codes.append(c)
            z = z - zq
        return torch.stack(codes, dim=1), z


def _resample_stack(latent: int, transposed: bool) -> nn.Sequential:
    """The quantizer's 2 x [conv k2 s2 (no weight norm) -> ConvNeXt]: 4x down, or 4x up when transposed."""
    conv = _CausalConvTranspose if transposed else _CausalConv
    return nn.Sequential(*[
        nn.Sequential(conv(latent, latent, f, stride=f), _ConvNeXt(latent)) for f in QUANTIZER_FACTORS
    ])


def _quantizer_transformer(cfg: CodecConfig, max_frames: int) -> _WindowTransformer:
    qt = cfg.quantizer_transformer
    return _WindowTransformer(cfg.latent_dim, qt.n_layer, cfg.head_dim, qt.intermediate_size, qt.window_size,
                              max_frames)


def _check_heads(cfg: CodecConfig) -> None:
    """The codec transformers use ``dim // head_dim`` heads; the quantizer's declared head count must agree."""
    qt = cfg.quantizer_transformer
    if cfg.latent_dim % cfg.head_dim or cfg.latent_dim // cfg.head_dim != qt.n_head:
        raise ValueError(f"codec: latent_dim {cfg.latent_dim} with head_dim {cfg.head_dim} does not give "
                         f"quantizer_transformer.n_head {qt.n_head}")


class _DecodeQuantizer(nn.Module):
    """The decode half of the publisher's quantizer (its names): VQ back-projections, post_module, upsample."""

    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__()
        lat, d = cfg.latent_dim, cfg.codebook_dim
        self.semantic_quantizer = _ResidualVQ(1, lat, cfg.semantic_codebook_size, d, with_in_proj=False)
        self.quantizer = _ResidualVQ(cfg.residual_codebooks, lat, cfg.residual_codebook_size, d,
                                     with_in_proj=False)
        self.post_module = _quantizer_transformer(cfg, max_frames)
        self.upsample = _resample_stack(lat, transposed=True)


class _EncodeQuantizer(nn.Module):
    """The encode half of the publisher's quantizer (its names): downsample, pre_module, VQs."""

    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__()
        lat, d = cfg.latent_dim, cfg.codebook_dim
        self.semantic_quantizer = _ResidualVQ(1, lat, cfg.semantic_codebook_size, d, with_in_proj=True)
        self.quantizer = _ResidualVQ(cfg.residual_codebooks, lat, cfg.residual_codebook_size, d,
                                     with_in_proj=True)
        self.downsample = _resample_stack(lat, transposed=False)
        self.pre_module = _quantizer_transformer(cfg, max_frames)


class _SEANetDecoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        ch = cfg.decoder_channels
        layers: list[nn.Module] = [_CausalConv(cfg.latent_dim, ch, 7)]
        for stride in cfg.decoder_strides:
            layers.append(_DecoderBlock(ch, stride))
            ch //= 2
        layers += [_Snake(ch), _CausalConv(ch, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)


class _SEANetEncoder(nn.Module):
    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__()
        ch = cfg.encoder_base_channels
        layers: list[nn.Module] = [_CausalConv(1, ch, 7)]
        samples_per_step = 1
        for stride, n_layer in zip(cfg.encoder_strides, cfg.encoder_transformer_layers):
            samples_per_step *= stride  # this block's transformer runs at 44.1 kHz / samples_per_step
            layers.append(_EncoderBlock(ch, stride, n_layer, cfg.encoder_transformer_window,
                                        cfg.encoder_transformer_intermediate_size, cfg.head_dim,
                                        max_frames * cfg.frame_length // samples_per_step))
            ch *= 2
        layers += [_Snake(ch), _CausalConv(ch, cfg.latent_dim, 3)]
        self.block = nn.Sequential(*layers)


# ----------------------------------------------------------------------------------------------------
# Public modules


class CodecDecoder(nn.Module):
    """Codes -> 44.1 kHz audio: the publisher's ``ArkttsCodec.decode`` (SPEC.md section 8).

    ``forward(codes)``: codes int ``[B, num_codebooks, T]`` (row 0 semantic, rows 1.. residual) ->
    float32 waveform ``[B, T * cfg.frame_length]`` in [-1, 1]. Codes are clamped first (row 0 to
    ``[0, semantic_codebook_size - 1]``, the others to ``[0, residual_codebook_size - 1]``), as the
    publisher clamps a copy before decoding; -1 padding therefore decodes as code 0 (decode only the
    valid prefix). The stages are also callable one by one: :meth:`dequantize` (oracle ``post_in``),
    :meth:`post_transform` (``post_out``), :meth:`upsample` (``upsample_out``) and :meth:`synthesize`.

    ``max_frames`` bounds T per call (ValueError beyond; decode longer audio in windows). Build with
    :meth:`from_state_dict`; ``CodecDecoder(cfg)`` alone has placeholder weights (use it under
    ``torch.device('meta')`` to inspect shapes). Raises ValueError if ``cfg`` has inconsistent head counts.
    """

    def __init__(self, cfg: CodecConfig, max_frames: int = DEFAULT_MAX_FRAMES):
        super().__init__()
        _check_heads(cfg)
        self.cfg = cfg
        self.quantizer = _DecodeQuantizer(cfg, max_frames)
        self.decoder = _SEANetDecoder(cfg)

    @classmethod
    def from_state_dict(cls, cfg: CodecConfig, sd: Mapping[str, Tensor], dtype: torch.dtype = torch.float32,
                        max_frames: int = DEFAULT_MAX_FRAMES) -> "CodecDecoder":
        """Build from the publisher's codec tensors (``codec.pth`` / ``codec.safetensors`` names).

        ``sd`` may be raw (``normalize_codec_state_dict`` is applied) and must hold only codec keys;
        the encoder's tensors are accepted and ignored. Weight norm is folded (both flavours). The module
        is returned in eval mode without gradients, in ``dtype`` on the CPU. Raises ValueError naming
        unexpected keys, missing decoder keys or wrong shapes.
        """
        with torch.device("meta"):
            module = cls(cfg, max_frames)
        _load_checkpoint(module, cfg, sd, dtype)
        return module

    def dequantize(self, codes: Tensor) -> Tensor:
        """codes int ``[B, 10, T]`` -> ``[B, latent, T]``: clamp, then sum every codebook's back-projection."""
        q = self.quantizer
        semantic = codes[:, :1].clamp(0, self.cfg.semantic_codebook_size - 1)
        residual = codes[:, 1:].clamp(0, self.cfg.residual_codebook_size - 1)
        return q.semantic_quantizer.decode(semantic) + q.quantizer.decode(residual)

    def post_transform(self, latent: Tensor) -> Tensor:
        """``[B, latent, T]`` -> ``[B, latent, T]``: the window-128 ``post_module`` transformer."""
        return self.quantizer.post_module(latent)

    def upsample(self, latent: Tensor) -> Tensor:
        """``[B, latent, T]`` -> ``[B, latent, 4 T]``: two transposed-conv + ConvNeXt stages."""
        return self.quantizer.upsample(latent)

    def synthesize(self, latent: Tensor) -> Tensor:
        """``[B, latent, 4 T]`` -> waveform ``[B, 4 T * hop_length]`` (the SEANet decoder, tanh included)."""
        return self.decoder.model(latent).squeeze(1)

    def intermediates(self, codes: Tensor) -> dict[str, Tensor]:
        """Every stage for codes ``[B, 10, T]``: ``post_in``, ``post_out``, ``upsample_out``, ``waveform``
        (the oracle's ``decode_item{i}_*`` recordings)."""
        post_in = self.dequantize(codes)
        post_out = self.post_transform(post_in)
        upsample_out = self.upsample(post_out)
        return {"post_in": post_in, "post_out": post_out, "upsample_out": upsample_out,
                "waveform": self.synthesize(upsample_out).float()}

    def forward(self, codes: Tensor) -> Tensor:
        return self.synthesize(self.upsample(self.post_transform(self.dequantize(codes)))).float()

    @torch.no_grad()
    def decode(self, codes: Tensor) -> tuple[Tensor, Tensor]:
        """Decode generated codes with -1 sentinels the way the publisher's ``decode_audio`` does.

        ``codes`` int ``[B, 10, T]``: item b's frame count is the number of columns whose codes are all
        >= 0, and that prefix is decoded on its own (0 frames give no samples). Returns (float32 waveform
        ``[B, frame_length * max count]`` zero-padded across the batch, sample counts int64 ``[B]``).
        """
        counts = (codes >= 0).all(dim=1).sum(dim=1).tolist()
        hop = self.cfg.frame_length
        out = torch.zeros(codes.shape[0], hop * max(counts, default=0), device=codes.device)
        for b, n in enumerate(counts):
            if n:
                out[b, : n * hop] = self(codes[b : b + 1, :, :n])[0]
        return out, torch.tensor(counts, dtype=torch.long) * hop


class StreamingDecoder:
    """Exact incremental :class:`CodecDecoder`: codes pushed a few frames at a time -> the audio of those frames.

    ``push(codes)`` with codes int ``[B, num_codebooks, n]`` (the next n frames of the utterance) returns
    float32 ``[B, n * frame_length]``: the same samples a whole-utterance ``decoder(codes)`` gives for those
    frames, up to float rounding (about 1e-6 at fp32), for any split of the utterance into pushes. Each stage
    keeps what its next call needs and nothing is decoded twice:

    * dequantize: per frame, no state;
    * post_module: per layer, the rotated keys/values of the last ``window - 1`` frames
      (:meth:`_WindowTransformer.step`), at absolute positions from the utterance start, so an utterance can be
      at most the decoder's ``max_frames`` long (ValueError beyond);
    * upsample and the SEANet decoder: every causal conv keeps its last ``(k - 1) d`` input steps (zeros at the
      start, which is the conv's own zero padding); a causal ConvTranspose (kernel ``2 s``) keeps its last
      input step, whose output tail a whole run would add to the next samples; Snake, tanh and ConvNeXt's
      pointwise part are per step.

    One instance per utterance (``reset`` starts another); state lives on the decoder's device. Not
    thread-safe. Raises TypeError if the decoder holds a layer kind it does not know how to stream.
    """

    def __init__(self, decoder: CodecDecoder):
        self.decoder = decoder
        self.reset()

    def reset(self) -> None:
        """Forget the utterance: the next push is frame 0."""
        self.frames = 0
        self._past: list[list[Tensor]] = [[] for _ in self.decoder.quantizer.post_module.layers]
        self._tails: dict[nn.Module, Tensor] = {}

    @torch.no_grad()
    def push(self, codes: Tensor) -> Tensor:
        dec = self.decoder
        latent = dec.quantizer.post_module.step(dec.dequantize(codes), self.frames, self._past)
        wav = self._run(dec.decoder.model, self._run(dec.quantizer.upsample, latent))
        self.frames += codes.shape[-1]
        return wav.squeeze(1).float()

    def _with_tail(self, module: nn.Module, x: Tensor, steps: int) -> Tensor:
        """``x`` [B, C, L] preceded by the last ``steps`` input steps ``module`` saw (zeros at first); keeps the
        new last ``steps`` for the next call."""
        tail = self._tails.get(module)
        if tail is None:
            tail = x.new_zeros(*x.shape[:-1], steps)
        full = torch.cat([tail, x], dim=-1)
        self._tails[module] = full[..., full.shape[-1] - steps:].clone()  # not a view pinning all of ``full``
        return full

    def _run(self, module: nn.Module, x: Tensor) -> Tensor:
        if isinstance(module, nn.Sequential):
            for m in module:
                x = self._run(m, x)
            return x
        if isinstance(module, _ResidualUnit):
            return x + self._run(module.block, x)
        if isinstance(module, _DecoderBlock):
            return self._run(module.block, x)
        if isinstance(module, _ConvNeXt):
            return module.mix(x, self._run(module.dwconv, x))
        if isinstance(module, _CausalConv) and module.stride == 1:
            # The tail replaces the left zero padding: conv over [tail, x] gives exactly len(x) outputs.
            return module.conv(self._with_tail(module, x, module.left) if module.left else x)
        if isinstance(module, _CausalConvTranspose):
            kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
            steps = -(-(kernel - stride) // stride)  # earlier inputs whose outputs reach into this call's span
            if not steps:
                return module(x)
            y = module.full(self._with_tail(module, x, steps))
            return y[..., steps * stride:(steps + x.shape[-1]) * stride]
        if isinstance(module, (_Snake, nn.Tanh)):
            return module(x)
        raise TypeError(f"streaming decode does not know how to stream {type(module).__name__}")


class CodecEncoder(nn.Module):
    """44.1 kHz audio -> codes: the publisher's ``ArkttsCodec.encode`` (SPEC.md section 8).

    ``forward(audio)``: float ``[B, 1, N]`` with N a multiple of ``cfg.frame_length`` (2048 samples) ->
    codes int64 ``[B, num_codebooks, N / frame_length]``. :meth:`latent` gives the SEANet encoder output
    (oracle ``clone__ref_encoder_out``) and :meth:`encode` is the host-side entry point that pads a clip
    and marks frames past its length. ``max_frames`` bounds the audio per call (``max_frames * 2048``
    samples; ValueError beyond). Build with :meth:`from_state_dict`.
    """

    def __init__(self, cfg: CodecConfig, max_frames: int = DEFAULT_MAX_FRAMES):
        super().__init__()
        _check_heads(cfg)
        self.cfg = cfg
        self.encoder = _SEANetEncoder(cfg, max_frames)
        self.quantizer = _EncodeQuantizer(cfg, max_frames)

    @classmethod
    def from_state_dict(cls, cfg: CodecConfig, sd: Mapping[str, Tensor], dtype: torch.dtype = torch.float32,
                        max_frames: int = DEFAULT_MAX_FRAMES) -> "CodecEncoder":
        """As :meth:`CodecDecoder.from_state_dict`, keeping the encoder's tensors (decoder ones ignored)."""
        with torch.device("meta"):
            module = cls(cfg, max_frames)
        _load_checkpoint(module, cfg, sd, dtype)
        return module

    def latent(self, audio: Tensor) -> Tensor:
        """audio ``[B, 1, N]`` -> SEANet encoder output ``[B, latent, N / hop_length]`` (hop 512 samples)."""
        return self.encoder.block(audio)

    def quantize(self, latent: Tensor) -> Tensor:
        """``[B, latent, 4 T]`` -> codes int64 ``[B, 10, T]``: downsample, pre_module, semantic VQ on the
        result, then the residual VQs on what the semantic back-projection leaves."""
        q = self.quantizer
        z = q.pre_module(q.downsample(latent))
        semantic, residual = q.semantic_quantizer.encode(z)
        rest, _ = q.quantizer.encode(residual)
        return torch.cat([semantic, rest], dim=1)

    def forward(self, audio: Tensor) -> Tensor:
        return self.quantize(self.latent(audio))

    @torch.no_grad()
    def encode(self, audio: Tensor, lengths: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Encode a clip or a batch the way the publisher's ``encode`` does (SPEC.md section 8).

        ``audio``: float 44.1 kHz mono, ``[N]``, ``[B, N]`` or ``[B, 1, N]``; ``lengths``: samples per item
        (default: all N). The batch is right-padded with zeros to a multiple of ``frame_length``; item b
        gets ``ceil(lengths[b] / frame_length)`` frames and later frames are set to -1. Returns (codes int64
        ``[B, 10, T]``, frame counts int64 ``[B]``). Raises ValueError for empty audio or a bad rank.
        """
        if audio.dim() == 1:
            audio = audio[None, None]
        elif audio.dim() == 2:
            audio = audio[:, None]
        elif audio.dim() != 3 or audio.shape[1] != 1:
            raise ValueError(f"codec encode: expected audio [N], [B, N] or [B, 1, N], got {tuple(audio.shape)}")
        n = audio.shape[-1]
        if n == 0:
            raise ValueError("codec encode: empty audio")
        hop = self.cfg.frame_length
        frames = math.ceil(n / hop)
        param = next(self.parameters())
        audio = F.pad(audio.to(device=param.device, dtype=param.dtype), (0, frames * hop - n))
        if lengths is None:
            lengths = torch.full((audio.shape[0],), n, dtype=torch.long)
        counts = ((lengths.to(torch.long) + hop - 1) // hop).clamp(0, frames).to(param.device)
        codes = self(audio)
        valid = torch.arange(frames, device=param.device)[None, :] < counts[:, None]
        return codes.masked_fill(~valid[:, None, :], -1), counts
