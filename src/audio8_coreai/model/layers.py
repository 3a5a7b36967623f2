"""Transformer pieces shared by the slow AR and the fast AR (SPEC.md section 4 and 10).

Numerics follow the publisher on purpose: RMSNorm in fp32 with the weight applied after the downcast,
RoPE tables rounded to bf16 and applied in fp32 to interleaved pairs (2i, 2i+1), GQA where query head
``h`` uses KV head ``h // (n_head / n_kv)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x * rsqrt(mean(x^2) + eps)`` in fp32, cast back to ``x.dtype``, then times ``weight``.

    Matches the publisher's RMSNorm: the weight multiplies after the downcast.
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


class RMSNorm(nn.Module):
    """RMSNorm over the last axis with a learned weight [dim]."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_table(length: int, head_dim: int, base: float) -> Tensor:
    """RoPE (cos, sin) table float32 [length, head_dim // 2, 2], values rounded to bf16.

    Frequencies ``base^(-2i/head_dim)``; the publisher stores the table in bf16 whatever the model
    dtype, so the rounding is part of the maths (exact angles move fp16 logits measurably). Always built
    on the CPU (a constant, also when modules are constructed on the meta device).
    """
    inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu")[: head_dim // 2] / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device="cpu"), inv)
    table = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)
    return table.to(torch.bfloat16).to(torch.float32)


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` [B, H, S, D] by ``table`` [B or 1, S, D/2, 2] (fp32), keep dtype.

    Pairs are adjacent elements (2i, 2i+1) of each head (GPT-J convention, not rotate-half).
    """
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    cos = table[..., 0].unsqueeze(1)
    sin = table[..., 1].unsqueeze(1)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)
    return out.flatten(-2).to(x.dtype)


class Attention(nn.Module):
    """Fused-qkv GQA attention over an explicit static KV cache.

    ``wqkv`` rows are q (n_head heads), then k (n_kv), then v (n_kv), each head a contiguous block of
    ``head_dim`` (the publisher's layout). Keys are rotated before they are cached.
    """

    def __init__(self, dim: int, n_head: int, n_kv: int, head_dim: int, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, n_kv, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)

    def qkv(self, x: Tensor, rope: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project ``x`` [B, S, dim] to rotated q [B, n_head, S, D], rotated k and v [B, n_kv, S, D]."""
        b, s, _ = x.shape
        qkv = self.wqkv(x)
        q_end = self.n_head * self.head_dim
        kv_end = q_end + self.n_kv * self.head_dim
        q = qkv[..., :q_end].reshape(b, s, self.n_head, self.head_dim).transpose(1, 2)
        k = qkv[..., q_end:kv_end].reshape(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = qkv[..., kv_end:].reshape(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        return apply_rope(q, rope), apply_rope(k, rope), v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """SDPA of q [B, H, S, D] over k, v [B, n_kv, L, D]; ``mask`` bool [B or 1, 1, S, L], True = attend.

        Returns [B, S, dim] after ``wo``. A query row with no visible key gives zeros (as torch's SDPA
        does for the publisher's left-padded rows), never NaN.
        """
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.n_head != self.n_kv)
        b, _, s, _ = out.shape
        return self.wo(out.transpose(1, 2).reshape(b, s, self.n_head * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm transformer block: ``h = x + attn(norm(x)); out = h + ffn(norm(h))``."""

    def __init__(self, dim: int, n_head: int, n_kv: int, head_dim: int, ffn: int, eps: float,
                 qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv, head_dim, qkv_bias, o_bias)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward_cached(self, x: Tensor, rope: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor | int,
                       mask: Tensor, kv_len: int | None = None) -> Tensor:
        """One block over ``x`` [B, S, dim] writing this layer's k/v into the cache (see :func:`write_kv`).

        ``k_cache``/``v_cache`` [1, B, n_kv, L, D] are this layer's slice of the state and are written in
        place at ``slots``; attention reads slots ``[0, kv_len)`` (all L when None, the static-graph form).
        """
        q, k, v = self.attention.qkv(self.attention_norm(x), rope)
        write_kv(k_cache, k, slots)
        write_kv(v_cache, v, slots)
        if kv_len is None:
            keys, values, m = k_cache[0], v_cache[0], mask
        else:
            keys, values, m = k_cache[0, :, :, :kv_len], v_cache[0, :, :, :kv_len], mask[..., :kv_len]
        h = x + self.attention.attend(q, keys, values, m)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward_concat(self, x: Tensor, rope: Tensor, past: list[Tensor]) -> Tensor:
        """One block for a single new row ``x`` [B, 1, dim] attending to ``past`` rows plus itself.

        ``past`` is [k, v] of earlier rows (or empty) and is replaced by the extended tensors: the fast
        AR's unrolled form, no mask needed because the query is always the last row.
        """
        q, k, v = self.attention.qkv(self.attention_norm(x), rope)
        if past:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        past[:] = [k, v]
        h = x + self.attention.attend(q, k, v, None)
        return h + self.feed_forward(self.ffn_norm(h))


def write_kv(cache: Tensor, new: Tensor, slots: Tensor | int) -> None:
    """Write ``new`` [B, n_kv, S, D] into ``cache`` [1, B, n_kv, L, D] (one layer's slice) in place.

    ``slots`` int64 [S]: any cache slots (``index_copy_``, the eager form). An int (or the SymInt of a
    traced ``pos``): the first of S consecutive slots, written as one slice, which ``torch.export``
    records as ``slice_scatter`` and coreai-torch lowers to an in-place ``slice_update`` of S rows (an
    index write, or a write through an indexed layer view, becomes a copy of the whole state instead).
    """
    new = new.to(cache.dtype).unsqueeze(0)
    if isinstance(slots, Tensor):
        cache.index_copy_(3, slots, new)
    else:
        cache[:, :, :, slots:slots + new.shape[3]] = new


def causal_cache_mask(first_slot: Tensor, width: int, cache_len: int) -> Tensor:
    """Bool [1, 1, width, cache_len]: query row i (at slot ``first_slot + i``) sees slots j <= its own.

    ``first_slot`` is an int tensor [1]; built with float arithmetic so it exports without int chains.
    """
    rows = first_slot.float() + torch.arange(width, dtype=torch.float32, device=first_slot.device)
    cols = torch.arange(cache_len, dtype=torch.float32, device=first_slot.device)
    return (cols[None, :] <= rows[:, None])[None, None]
