"""The codec's tensors as the publisher names them: every name and shape, the publisher's loading rules for a loaded
dict, and weight norm folded into the modules' plain conv weights. Works on dicts only; reading files is
:mod:`audio8_coreai.checkpoint`'s job."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from ...config import CodecConfig
from .layers import (
    CONVNEXT_EXPANSION,
    CONVNEXT_KERNEL,
    DEFAULT_MAX_FRAMES,
    QUANTIZER_FACTORS,
    RESIDUAL_DILATIONS,
    RESIDUAL_KERNEL,
)

_WN_PARAMETRIZED = (".parametrizations.weight.original0", ".parametrizations.weight.original1")
_WN_LEGACY = (".weight_g", ".weight_v")


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
    for g_suffix, v_suffix in (_WN_PARAMETRIZED, _WN_LEGACY):
        if key.endswith(g_suffix):
            return key[: -len(g_suffix)] + ".weight", "g"
        if key.endswith(v_suffix):
            return key[: -len(v_suffix)] + ".weight", "v"
    return key, ""


def load_codec_weights(module: nn.Module, cfg: CodecConfig, sd: Mapping[str, Tensor], dtype: torch.dtype) -> None:
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
    bad = [
        f"{k} {tuple(v.shape)} (expected {expected[c][1]})"
        for c, (k, v) in given.items()
        if tuple(v.shape) != expected[c][1]
    ]
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


class CodecPart(nn.Module):
    """A half of the codec (decoder or encoder) built from the publisher's tensors by :meth:`from_state_dict`."""

    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__()

    @classmethod
    def from_state_dict(
        cls,
        cfg: CodecConfig,
        sd: Mapping[str, Tensor],
        dtype: torch.dtype = torch.float32,
        max_frames: int = DEFAULT_MAX_FRAMES,
    ) -> CodecPart:
        """Build from the publisher's codec tensors (``codec.pth`` / ``codec.safetensors`` names), sized for
        ``max_frames`` frames.

        ``sd`` may be raw (``normalize_codec_state_dict`` is applied) and must hold only codec keys; the other
        half's tensors are accepted and ignored. Weight norm is folded (both flavours). The module is returned in
        eval mode without gradients, in ``dtype`` on the CPU. Raises ValueError naming unexpected keys, missing
        keys of this half or wrong shapes.
        """
        with torch.device("meta"):
            module = cls(cfg, max_frames)
        load_codec_weights(module, cfg, sd, dtype)
        return module
