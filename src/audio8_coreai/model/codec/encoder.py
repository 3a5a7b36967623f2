"""44.1 kHz audio -> codes: :class:`CodecEncoder`, the publisher's ``ArkttsCodec.encode``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import CodecConfig
from .layers import DEFAULT_MAX_FRAMES, CausalConv, EncoderBlock, Snake
from .quantizer import EncodeQuantizer
from .transformer import check_heads
from .weights import CodecPart


class _SEANetEncoder(nn.Module):
    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__()
        ch = cfg.encoder_base_channels
        layers: list[nn.Module] = [CausalConv(1, ch, 7)]
        samples_per_step = 1
        for stride, n_layer in zip(cfg.encoder_strides, cfg.encoder_transformer_layers):
            samples_per_step *= stride  # this block's transformer runs at 44.1 kHz / samples_per_step
            layers.append(
                EncoderBlock(
                    ch,
                    stride,
                    n_layer,
                    cfg.encoder_transformer_window,
                    cfg.encoder_transformer_intermediate_size,
                    cfg.head_dim,
                    max_frames * cfg.frame_length // samples_per_step,
                )
            )
            ch *= 2
        layers += [Snake(ch), CausalConv(ch, cfg.latent_dim, 3)]
        self.block = nn.Sequential(*layers)


class CodecEncoder(CodecPart):
    """44.1 kHz audio -> codes: the publisher's ``ArkttsCodec.encode`` (SPEC.md section 8).

    ``forward(audio)``: float ``[B, 1, N]`` with N a multiple of ``cfg.frame_length`` (2048 samples) ->
    codes int64 ``[B, num_codebooks, N / frame_length]``. :meth:`latent` gives the SEANet encoder output
    (oracle ``clone__ref_encoder_out``) and :meth:`encode` is the host-side entry point that pads a clip
    and marks frames past its length. ``max_frames`` bounds the audio per call (``max_frames * 2048``
    samples; ValueError beyond). Build with :meth:`from_state_dict`.
    """

    def __init__(self, cfg: CodecConfig, max_frames: int = DEFAULT_MAX_FRAMES):
        super().__init__(cfg, max_frames)
        check_heads(cfg)
        self.cfg = cfg
        self.encoder = _SEANetEncoder(cfg, max_frames)
        self.quantizer = EncodeQuantizer(cfg, max_frames)

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
