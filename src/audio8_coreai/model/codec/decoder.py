"""Codes -> 44.1 kHz audio: :class:`CodecDecoder`, the publisher's ``ArkttsCodec.decode``."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...config import CodecConfig
from .layers import DEFAULT_MAX_FRAMES, CausalConv, DecoderBlock, Snake
from .quantizer import DecodeQuantizer
from .transformer import check_heads
from .weights import CodecPart


class _SEANetDecoder(nn.Module):
    def __init__(self, cfg: CodecConfig):
        super().__init__()
        ch = cfg.decoder_channels
        layers: list[nn.Module] = [CausalConv(cfg.latent_dim, ch, 7)]
        for stride in cfg.decoder_strides:
            layers.append(DecoderBlock(ch, stride))
            ch //= 2
        layers += [Snake(ch), CausalConv(ch, 1, 7), nn.Tanh()]
        self.model = nn.Sequential(*layers)


class CodecDecoder(CodecPart):
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
        super().__init__(cfg, max_frames)
        check_heads(cfg)
        self.cfg = cfg
        self.quantizer = DecodeQuantizer(cfg, max_frames)
        self.decoder = _SEANetDecoder(cfg)

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
        return {
            "post_in": post_in,
            "post_out": post_out,
            "upsample_out": upsample_out,
            "waveform": self.synthesize(upsample_out).float(),
        }

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
