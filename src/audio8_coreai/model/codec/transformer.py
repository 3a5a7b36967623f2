"""The codec's window transformer: pre-norm layers with layer scale, RoPE (base 10000) and a causal sliding
window, run whole or step by step (the streaming decoder); the quantizer's pre/post modules are one."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...config import CodecConfig
from ..layers import FeedForward, RMSNorm, apply_rope, rope_table

RMS_NORM_EPS = 1e-5  # codec transformer RMSNorm (SPEC.md section 10, item 3)
ROPE_BASE = 10000.0  # codec transformers (the LM uses 1e6)


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
        """``x`` [B, L, dim] with ``rope`` [B or 1, L, head_dim/2, 2] and ``mask`` bool [L, P + L] or
        [B, 1, L, P + L] (True = attend).

        ``past`` (incremental decoding): the rotated keys and values [B, H, P, head_dim] of the P positions
        before ``x`` (an empty list at the start), prepended to this call's; the list is replaced by the
        concatenation [B, H, P + L, head_dim] (the caller trims it to the window).
        """
        b, length, dim = x.shape
        q, k, v = self.wqkv(x).view(b, length, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
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


class WindowTransformer(nn.Module):
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
            raise ValueError(
                f"codec transformer: {length} positions exceed max_positions {self.mask.shape[0]} "
                "(build the codec with a larger max_frames)"
            )
        rope, mask = self.rope[:length][None], self.mask[:length, :length]
        h = x.transpose(1, 2)
        for layer in self.layers:
            h = layer(h, rope, mask)
        return self.norm(h).transpose(1, 2)

    def step(self, x: Tensor, start: Tensor | int, past: list[list[Tensor]], count: Tensor | None = None) -> Tensor:
        """Incremental :meth:`forward`: ``x`` [B, C, n] holds positions ``start .. start + n - 1`` of a sequence
        whose earlier positions went through earlier calls; returns their outputs [B, C, n], equal (up to float
        rounding) to the same columns of ``forward`` on the whole sequence.

        ``past`` holds one list per layer (empty at ``start`` 0) with that layer's rotated keys and values of
        the last ``window - 1`` positions, all a later query can see; it is updated in place. Each layer needs
        its own keys because its input at a position depends on everything before (stacked layers see
        ``n_layer x (window - 1)`` positions back), so a re-run over a window of recent frames would not be
        exact. RoPE and the mask use absolute positions, so ``start + n`` must not exceed ``max_positions``
        (ValueError).

        Static form (``count`` an int tensor [1], ``start`` one [1], or [B]: each row its own position, streams
        at different points batched; the Core AI asset): every layer's keys and
        values are ``window - 1`` rows always (zeros, masked, before position 0), only the first ``count`` of
        the n columns are real (the rest is padding no real query sees), and the kept rows are those before
        ``start + count``, written into the ``past`` tensors in place. RoPE rows are gathered from the table
        (``start + n <= max_positions``: the caller checks) and the mask is a band of ``window - 1 + n`` rows
        of the window mask (``max_positions`` at least that).
        """
        n = x.shape[-1]
        if count is None:
            end = start + n
            if end > self.mask.shape[0]:
                raise ValueError(
                    f"codec transformer: position {end} exceeds max_positions {self.mask.shape[0]} "
                    "(build the codec with a larger max_frames)"
                )
            cached = past[0][0].shape[2] if past[0] else 0
            rope, mask = self.rope[start:end][None], self.mask[start:end, start - cached : end]
        else:
            kept = self.window - 1
            steps = start.long()[:, None] + torch.arange(n, device=x.device)  # [B or 1, n]: each row's positions
            rope = self.rope.index_select(0, steps.flatten()).view(*steps.shape, *self.rope.shape[1:])
            # The mask is the same band at every start (rows ``kept ..`` of the window mask), less each row's key
            # rows before its position 0 (float arithmetic: one comparison, as the Core AI delegate wants).
            keys = torch.arange(kept + n, dtype=torch.float32, device=x.device)[None] + start.float()[:, None]
            mask = (self.mask[kept : kept + n, : kept + n][None] & (keys >= kept)[:, None])[:, None]
        h = x.transpose(1, 2)
        for layer, kv in zip(self.layers, past):
            state = list(kv)
            h = layer(h, rope, mask, kv)
            if count is None:
                kv[:] = [t[:, :, max(0, t.shape[2] - self.window + 1) :] for t in kv]
            else:
                rows = count.long() + torch.arange(self.window - 1, device=x.device)
                for s, t in zip(state, kv):
                    s.copy_(t.index_select(2, rows))
                kv[:] = state
        return self.norm(h).transpose(1, 2)


def quantizer_transformer(cfg: CodecConfig, max_frames: int) -> WindowTransformer:
    """``pre_module`` or ``post_module``: the quantizer's window transformer over the latent, one position per frame."""
    qt = cfg.quantizer_transformer
    return WindowTransformer(cfg.latent_dim, qt.n_layer, cfg.head_dim, qt.intermediate_size, qt.window_size, max_frames)


def check_heads(cfg: CodecConfig) -> None:
    """The codec transformers use ``dim // head_dim`` heads; the quantizer's declared head count must agree."""
    qt = cfg.quantizer_transformer
    if cfg.latent_dim % cfg.head_dim or cfg.latent_dim // cfg.head_dim != qt.n_head:
        raise ValueError(
            f"codec: latent_dim {cfg.latent_dim} with head_dim {cfg.head_dim} does not give "
            f"quantizer_transformer.n_head {qt.n_head}"
        )
