"""Transformer pieces shared by the slow AR and the fast AR (SPEC.md section 4 and 10).

Numerics follow the publisher on purpose: RMSNorm in fp32 with the weight applied after the downcast,
RoPE tables rounded to bf16 and applied in fp32 to interleaved pairs (2i, 2i+1), GQA where query head
``h`` uses KV head ``h // (n_head / n_kv)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import BlockShape


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x * rsqrt(mean(x^2) + eps)`` in fp32, cast back to ``x.dtype``, then times ``weight``.

    Matches the publisher's RMSNorm: the weight multiplies after the downcast. fp32 ``x`` and ``weight`` take
    torch's one fused call, which computes the same values (the downcast is a no-op there).
    """
    if x.dtype == weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
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

    def add(self, x: Tensor, delta: Tensor | None) -> tuple[Tensor, Tensor]:
        """The residual stream ``h = x + delta`` (``x`` itself when ``delta`` is None) and its norm, each shaped as
        ``x``: the add and the norm that follows it, one step (a fused kernel's seam: :mod:`..backends.torch.fused`)."""
        h = x if delta is None else x + delta
        return h, self(h)


class Embedding(nn.Embedding):
    """:class:`torch.nn.Embedding` without a random init: its rows always come from a checkpoint (the DualAR's
    tables, the codec's codebooks). Drawing them on the meta device would run torch's Python reference
    of ``normal_``, whose first call imports ``torch._dynamo`` (seconds), for values that are never used."""

    def reset_parameters(self) -> None:
        """Nothing to draw (see the class)."""


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


def rope_rotation(table: Tensor) -> tuple[Tensor, Tensor]:
    """A RoPE table slice [B or 1, S, D/2, 2] (cos, sin) as the factors :func:`rotate` takes: pairs (cos, cos) and
    (-sin, sin), each fp32 [B or 1, 1, S, D/2, 2] (the 1 broadcasts over heads). Made once per forward pass and
    shared by every layer."""
    t = table.unsqueeze(1)
    sin = t[..., 1:]
    # (-sin, sin) by a negation, not a product with a constant tensor: a tensor made from Python values inside the
    # frame is a host-to-device copy, which a CUDA graph capture refuses (tests/backends/torch/test_capture_safety.py)
    return t[..., :1].expand(t.shape), torch.cat([-sin, sin], dim=-1)


def rotate(x: Tensor, rotation: tuple[Tensor, Tensor]) -> Tensor:
    """Rotate interleaved pairs (2i, 2i+1) of ``x`` [B, H, S, D] (GPT-J convention, not rotate-half) by
    :func:`rope_rotation`'s factors, in fp32; keeps ``x``'s dtype.

    ``(x0, x1) -> (x0 cos - x1 sin, x1 cos + x0 sin)``, computed as ``pairs * (cos, cos) + swapped pairs *
    (-sin, sin)``: the same products and sums, so the same values, in a handful of calls.
    """
    cos, sin = rotation
    pairs = (x if x.dtype == torch.float32 else x.float()).unflatten(-1, (-1, 2))
    out = (pairs * cos + pairs.flip(-1) * sin).flatten(-2)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def apply_rope(x: Tensor, table: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` [B, H, S, D] by ``table`` [B or 1, S, D/2, 2] (fp32), keep dtype
    (:func:`rotate` by :func:`rope_rotation` of ``table``)."""
    return rotate(x, rope_rotation(table))


class Attention(nn.Module):
    """Fused-qkv GQA attention over an explicit KV cache.

    ``wqkv`` rows are q (n_head heads), then k (n_kv), then v (n_kv), each head a contiguous block of
    ``head_dim`` (the publisher's layout). Keys are rotated before they are cached.
    """

    def __init__(self, dim: int, n_head: int, n_kv: int, head_dim: int, qkv_bias: bool, o_bias: bool):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, n_kv, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)

    def qkv(self, x: Tensor, rotation: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Project ``x`` [B, S, dim] to q [B, n_head, S, D], k and v [B, n_kv, S, D], q and k rotated together
        by ``rotation`` (:func:`rope_rotation`)."""
        b, s, _ = x.shape
        heads = self.wqkv(x).reshape(b, s, -1, self.head_dim).transpose(1, 2)  # [B, n_head + 2 n_kv, S, D]
        qk = rotate(heads[:, : self.n_head + self.n_kv], rotation)
        return qk[:, : self.n_head], qk[:, self.n_head :], heads[:, self.n_head + self.n_kv :]

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """SDPA of q [B, H, S, D] over k, v [B, n_kv, L, D] -> [B, H, S, D].

        ``mask`` bool [B or 1, 1, S, L], True = attend (None: every key). A query row with no visible key gives
        zeros (as torch's SDPA does for the publisher's left-padded rows), never NaN.

        One query (S = 1, every frame's slow step) with GQA is folded: the ``n_head / n_kv`` query heads that share
        a KV head become that head's queries, q [B, n_kv, group, D], so plain attention reads each K/V once. The
        same products and sums as ``enable_gqa``, which takes the math kernel for a masked call (its K/V repeated
        per query head, in fp32) where the fold takes the memory-efficient one.
        """
        group = self.n_head // self.n_kv
        b, _, s, d = q.shape
        if group > 1 and s == 1 and not causal:
            out = F.scaled_dot_product_attention(q.reshape(b, self.n_kv, group, d), k, v, attn_mask=mask)
            return out.reshape(b, self.n_head, 1, d)  # [B, n_kv, group, D] is [B, H, 1, D]: head h = kv h // group
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=group > 1)

    def out(self, heads: Tensor) -> Tensor:
        """``wo`` over the attention output [B, H, S, D] -> [B, S, dim]."""
        b, _, s, _ = heads.shape
        return self.wo(heads.transpose(1, 2).reshape(b, s, self.n_head * self.head_dim))

    def forward(
        self, x: Tensor, rotation: tuple[Tensor, Tensor], k_cache: Tensor, v_cache: Tensor, kv: KVStep
    ) -> Tensor:
        """Attention of the normed ``x`` [B, S, dim] -> [B, S, dim]: q, k, v rotated by ``rotation``, keys and values
        written into ``k_cache``/``v_cache`` [1, B, n_kv, L, D] as ``kv`` says, then ``wo``."""
        q, k, v = self.qkv(x, rotation)
        return self.out(kv.attend(self, q, k, v, k_cache, v_cache))


class KVStep(Protocol):
    """How one attention step writes its new keys and values into a KV cache and what its queries attend.

    The modes of the one attention step (:meth:`Block.forward`): :class:`SpanKV` (slots by slice: eager and
    exported graphs), :class:`IndexKV` (slots by an index tensor: CUDA graphs, recorded batches),
    :class:`RowsKV` (one column per batch row, each at its own slot: continuous batching) and
    :class:`RowSlotsKV` (the same in static shapes, each batch row its own: batched CUDA graphs).
    """

    def attend(self, att: Attention, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """Write k, v [B, n_kv, S, D] into ``k_cache``/``v_cache`` [1, B, n_kv, L, D] (one layer's slice, in
        place) and return the attention of q [B, H, S, D] -> [B, H, S, D]."""
        ...

    def slot_table(self, batch: int, width: int) -> Tensor | int | None:
        """Where batch row b's column s is written: an int ``start`` (slot ``start + s`` in every row), an int64
        tensor viewed as [B, S] (broadcast views, no copy), or None where the step writes no slot table (its
        writes stay its own: :class:`RowsKV`). What a fused writer (:mod:`..backends.torch.fused`) takes."""
        ...

    def read(self, att: Attention, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        """:meth:`attend` after the keys and values are written at :meth:`slot_table` (by a fused writer)."""
        ...


@dataclass(frozen=True)
class SpanKV:
    """S consecutive slots from ``start``, written as one slice; queries attend slots ``[0, end)`` (all L when
    ``end`` is None, the static-graph form) under ``mask`` (bool [B or 1, 1, S, L], cut to ``end``), or causally
    among themselves when ``causal`` (``start`` must then be 0), or unmasked (one query, the newest slot).

    ``start`` may be the SymInt of a traced position: ``torch.export`` records the write as ``slice_scatter``,
    which coreai-torch lowers to an in-place ``slice_update`` of S rows (an index write, or a write through an
    indexed layer view, becomes a copy of the whole state instead).
    """

    start: int
    end: int | None = None
    mask: Tensor | None = None
    causal: bool = False

    def attend(self, att: Attention, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        s = k.shape[2]
        k_cache[:, :, :, self.start : self.start + s].copy_(k)  # copy_ casts and broadcasts: two calls, not four
        v_cache[:, :, :, self.start : self.start + s].copy_(v)
        return self.read(att, q, k_cache, v_cache)

    def slot_table(self, batch: int, width: int) -> int:
        return self.start

    def read(self, att: Attention, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        if self.end is None:
            return att.sdpa(q, k_cache[0], v_cache[0], self.mask, self.causal)
        mask = None if self.mask is None else self.mask[..., : self.end]
        return att.sdpa(q, k_cache[0, :, :, : self.end], v_cache[0, :, :, : self.end], mask, self.causal)


@dataclass(frozen=True)
class IndexKV:
    """Slots int64 [S] written with ``index_copy_`` (no host read: the slot stays an input of a CUDA graph);
    queries attend all L slots under ``mask`` (bool [B or 1, 1, S, L])."""

    slots: Tensor
    mask: Tensor

    def attend(self, att: Attention, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        k_cache.index_copy_(3, self.slots, k.to(k_cache.dtype).unsqueeze(0))
        v_cache.index_copy_(3, self.slots, v.to(v_cache.dtype).unsqueeze(0))
        return self.read(att, q, k_cache, v_cache)

    def slot_table(self, batch: int, width: int) -> Tensor:
        return self.slots.view(1, width).expand(batch, width)

    def read(self, att: Attention, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        return att.sdpa(q, k_cache[0], v_cache[0], self.mask)


@dataclass(frozen=True)
class RowsKV:
    """One column per utterance (S = 1): utterance j lives in batch row ``rows[j]`` of the cache, writes its slot
    ``positions[j]`` and attends its slots ``[0, positions[j]]``.

    Attention runs per utterance with no copies (``gathered`` None: the CPU way), or in one call over the
    utterances' rows gathered up to the longest under a key mask (``gathered`` = (rows int64 [n], positions int64
    [n], mask bool [n, 1, 1, K]): the GPU way, one launch instead of n). Its writes are its own (no slot table).
    """

    rows: Sequence[int]
    positions: Sequence[int]
    gathered: tuple[Tensor, Tensor, Tensor] | None = None

    def attend(self, att: Attention, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        kc, vc = k_cache[0], v_cache[0]
        if self.gathered is not None:
            row_t, pos_t, mask = self.gathered
            kc[row_t, :, pos_t] = k[:, :, 0].to(kc.dtype)
            vc[row_t, :, pos_t] = v[:, :, 0].to(vc.dtype)
            end = mask.shape[-1]
            return att.sdpa(q, kc[row_t, :, :end], vc[row_t, :, :end], mask)
        outs = []
        for j, (r, p) in enumerate(zip(self.rows, self.positions)):
            kc[r, :, p] = k[j, :, 0].to(kc.dtype)
            vc[r, :, p] = v[j, :, 0].to(vc.dtype)
            outs.append(att.sdpa(q[j : j + 1], kc[r : r + 1, :, : p + 1], vc[r : r + 1, :, : p + 1]))
        return torch.cat(outs)

    def slot_table(self, batch: int, width: int) -> None:
        return None

    def read(self, att: Attention, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        raise NotImplementedError("RowsKV writes its own slots: call attend")


@dataclass(frozen=True)
class RowSlotsKV:
    """:class:`RowsKV` in static shapes (batched CUDA graphs: nothing read on the host): batch row j writes its
    slot ``slots[j]`` (int64 [B]; a scatter along the slot axis) and attends all L slots of its own row of the KV
    state under ``mask`` (bool [B, 1, 1, L]), read in place: no row is gathered or copied."""

    slots: Tensor
    mask: Tensor

    def attend(self, att: Attention, q: Tensor, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        kc, vc = k_cache[0], v_cache[0]  # [B, n_kv, L, D]
        index = self.slots.view(-1, 1, 1, 1).expand(k.shape)  # [B, n_kv, 1, D]: row j's slot
        kc.scatter_(2, index, k.to(kc.dtype))
        vc.scatter_(2, index, v.to(vc.dtype))
        return self.read(att, q, k_cache, v_cache)

    def slot_table(self, batch: int, width: int) -> Tensor:
        return self.slots.view(batch, width)

    def read(self, att: Attention, q: Tensor, k_cache: Tensor, v_cache: Tensor) -> Tensor:
        return att.sdpa(q, k_cache[0], v_cache[0], self.mask)


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
    """Pre-norm transformer block: ``h = x + attn(norm(x)); out = h + ffn(norm(h))``.

    The residual add is carried to the norm that follows it (the next block's, or the model's final one): a block
    takes the stream ``x`` and the previous block's output ``delta`` not yet added, and returns its own pair, so
    every add is one step with its norm (:meth:`RMSNorm.add`; one kernel where :mod:`..backends.torch.fused` is
    installed). The same sums in the same order as adding at once."""

    def __init__(self, s: BlockShape):
        super().__init__()
        self.attention = Attention(s.dim, s.n_head, s.n_kv, s.head_dim, s.qkv_bias, s.o_bias)
        self.feed_forward = FeedForward(s.dim, s.ffn)
        self.attention_norm = RMSNorm(s.dim, s.eps)
        self.ffn_norm = RMSNorm(s.dim, s.eps)

    def forward(
        self,
        x: Tensor,
        delta: Tensor | None,
        rotation: tuple[Tensor, Tensor],
        k_cache: Tensor,
        v_cache: Tensor,
        kv: KVStep,
    ) -> tuple[Tensor, Tensor]:
        """One block over the stream ``x + delta`` (``x`` [B, S, dim]; ``delta`` the previous block's output, None
        before the first) with RoPE ``rotation`` (:func:`rope_rotation` of the rows' table slice [B or 1, S, D/2,
        2]), writing this layer's keys and values into ``k_cache``/``v_cache`` [1, B, n_kv, L, D] as ``kv`` says
        (see :class:`KVStep`). Returns the stream after attention and the feed-forward's output, not yet added."""
        x, normed = self.attention_norm.add(x, delta)
        h, normed = self.ffn_norm.add(x, self.attention(normed, rotation, k_cache, v_cache, kv))
        return h, self.feed_forward(normed)


def causal_cache_mask(first_slot: Tensor, width: int, cache_len: int) -> Tensor:
    """Bool [1, 1, width, cache_len]: query row i (at slot ``first_slot + i``) sees slots j <= its own.

    ``first_slot`` is an int tensor [1]; built with float arithmetic so it exports without int chains.
    """
    rows = first_slot.float() + torch.arange(width, dtype=torch.float32, device=first_slot.device)
    cols = torch.arange(cache_len, dtype=torch.float32, device=first_slot.device)
    return (cols[None, :] <= rows[:, None])[None, None]
