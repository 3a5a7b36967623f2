"""The codec's quantizer: vector quantisers (cosine nearest codebook row), residual stacks, and the decode and
encode halves of the publisher's quantizer module (its names)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import CodecConfig
from ..layers import Embedding
from .layers import resample_stack
from .transformer import quantizer_transformer


class _VectorQuantizer(nn.Module):
    """One VQ: WN conv1x1 ``latent -> codebook_dim`` (encoder only), codebook, WN conv1x1 back to latent."""

    def __init__(self, latent: int, size: int, dim: int, with_in_proj: bool):
        super().__init__()
        if with_in_proj:
            self.in_proj = nn.Conv1d(latent, dim, 1)
        self.out_proj = nn.Conv1d(dim, latent, 1)
        self.codebook = Embedding(size, dim)

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


class _VQs(nn.Module):
    """The semantic VQ and the residual VQs of the publisher's quantizer (its names); ``with_in_proj``: the encode
    half's input projections."""

    def __init__(self, cfg: CodecConfig, with_in_proj: bool):
        super().__init__()
        lat, d = cfg.latent_dim, cfg.codebook_dim
        self.semantic_quantizer = _ResidualVQ(1, lat, cfg.semantic_codebook_size, d, with_in_proj=with_in_proj)
        self.quantizer = _ResidualVQ(
            cfg.residual_codebooks, lat, cfg.residual_codebook_size, d, with_in_proj=with_in_proj
        )


class DecodeQuantizer(_VQs):
    """The decode half of the publisher's quantizer (its names): VQ back-projections, post_module, upsample."""

    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__(cfg, with_in_proj=False)
        self.post_module = quantizer_transformer(cfg, max_frames)
        self.upsample = resample_stack(cfg.latent_dim, transposed=True)


class EncodeQuantizer(_VQs):
    """The encode half of the publisher's quantizer (its names): downsample, pre_module, VQs."""

    def __init__(self, cfg: CodecConfig, max_frames: int):
        super().__init__(cfg, with_in_proj=True)
        self.downsample = resample_stack(cfg.latent_dim, transposed=False)
        self.pre_module = quantizer_transformer(cfg, max_frames)
