"""A frame's attention on CUDA as split-key Triton kernels (flash-decoding): every KV head's few queries against its
keys, the keys cut into blocks that run side by side, then one pass that joins the blocks.

A frame's queries are few (the slow AR's one, the fast AR's one or two a pass) and its keys many (the slow AR's
whole static context, 2,048 in the 0.6b), so torch's fused attention kernels, which split their work by queries,
run one block a KV head per row and read the context serially: at batch 1 most of a graphed fp32 frame's time
(benchmarks/README.md, "Measured on an H200 (stop 42)"). Here a program
takes one KV head's ``group x S`` queries (the query heads that share it, times the step's columns) against
``BLOCK_L`` keys, and writes its block's row maxima, sums and weighted values; a second kernel joins a row's blocks
(the softmax's usual rescaling). A step whose keys fit one block is written by the first kernel alone.

The maths is SDPA's (products and sums in fp32 whatever the cache dtype, scores scaled by ``1 / sqrt(D)``, the
softmax over the visible keys, a row with none gives zeros), its sums in another order: within fp32 rounding of
torch's kernels. Tested under ``TRITON_INTERPRET=1`` against :func:`torch.nn.functional.scaled_dot_product_attention`
(tests/backends/torch/test_fused_attention.py). Installed by :func:`.fused.install_fused`
(:class:`.fused.FusedAttention`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .fused import EXACT

MAX_ROWS = 16  # queries a KV head (group x S) the kernels take; more (a prefill) stays with torch's SDPA


@triton.jit
def _attend_blocks(q_ptr, q_b, q_h, q_s, k_ptr, k_b, k_h, k_l, v_ptr, v_b, v_h, v_l, m_ptr, m_b, m_s, m_l,
                   o_ptr, o_b, o_h, o_s, top_ptr, sum_ptr, acc_ptr, L, scale, N_KV: tl.constexpr,
                   GROUP: tl.constexpr, S: tl.constexpr, D: tl.constexpr, HAS_MASK: tl.constexpr,
                   CAUSAL: tl.constexpr, ONE_BLOCK: tl.constexpr, ROWS: tl.constexpr, BLOCK_L: tl.constexpr,
                   BLOCK_D: tl.constexpr):  # fmt: skip
    """Program (b * N_KV + h, j): KV head h of batch row b, keys [j BLOCK_L, (j + 1) BLOCK_L). Row r is query head
    h GROUP + r // S at column r % S. ONE_BLOCK: the output itself; else the block's row maxima, sums and
    exp-weighted values."""
    bh = tl.program_id(0)
    j = tl.program_id(1)
    blocks = tl.num_programs(1)
    b = bh // N_KV
    h = bh % N_KV
    r = tl.arange(0, ROWS)
    real = r < GROUP * S
    head = h * GROUP + r // S
    col = r % S
    d = tl.arange(0, BLOCK_D)
    d_in = d < D
    q = tl.load(q_ptr + b * q_b + head[:, None] * q_h + col[:, None] * q_s + d[None, :],
                mask=real[:, None] & d_in[None, :], other=0.0).to(tl.float32)  # fmt: skip
    keys = j * BLOCK_L + tl.arange(0, BLOCK_L)
    inside = keys < L
    kv_mask = inside[:, None] & d_in[None, :]
    k = tl.load(k_ptr + b * k_b + h * k_h + keys[:, None] * k_l + d[None, :], mask=kv_mask, other=0.0)
    scores = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee") * scale  # [ROWS, BLOCK_L]
    seen = real[:, None] & inside[None, :]
    if HAS_MASK:
        m = tl.load(m_ptr + b * m_b + col[:, None] * m_s + keys[None, :] * m_l, mask=seen, other=0)
        seen = seen & (m != 0)
    if CAUSAL:  # torch's is_causal: column s sees keys [0, s]
        seen = seen & (keys[None, :] <= col[:, None])
    scores = tl.where(seen, scores, float("-inf"))
    top = tl.max(scores, axis=1)
    top_safe = tl.where(top == float("-inf"), 0.0, top)  # a row that sees no key here: every weight 0, not NaN
    p = tl.exp(scores - top_safe[:, None])
    total = tl.sum(p, axis=1)
    v = tl.load(v_ptr + b * v_b + h * v_h + keys[:, None] * v_l + d[None, :], mask=kv_mask, other=0.0)
    acc = tl.dot(p, v.to(tl.float32), input_precision="ieee")  # [ROWS, BLOCK_D]
    if ONE_BLOCK:
        out = acc / tl.where(total > 0, total, 1.0)[:, None]
        tl.store(o_ptr + b * o_b + head[:, None] * o_h + col[:, None] * o_s + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=real[:, None] & d_in[None, :])  # fmt: skip
    else:
        stat = (bh * blocks + j) * ROWS + r
        tl.store(top_ptr + stat, top)
        tl.store(sum_ptr + stat, total)
        tl.store(acc_ptr + stat[:, None] * BLOCK_D + d[None, :], acc)


@triton.jit
def _join_blocks(o_ptr, o_b, o_h, o_s, top_ptr, sum_ptr, acc_ptr, BLOCKS, N_KV: tl.constexpr, GROUP: tl.constexpr,
                 S: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_J: tl.constexpr):  # fmt: skip
    """Program (b * N_KV + h, r): row r's blocks rescaled to their common maximum and summed; zeros where no block
    saw a key."""
    bh = tl.program_id(0)
    r = tl.program_id(1)
    b = bh // N_KV
    h = bh % N_KV
    j = tl.arange(0, BLOCK_J)
    j_in = j < BLOCKS
    d = tl.arange(0, BLOCK_D)
    stat = (bh * BLOCKS + j) * ROWS + r
    top = tl.load(top_ptr + stat, mask=j_in, other=float("-inf"))
    best = tl.max(top, axis=0)
    weight = tl.exp(top - tl.where(best == float("-inf"), 0.0, best))  # a block that saw nothing: 0
    total = tl.sum(weight * tl.load(sum_ptr + stat, mask=j_in, other=0.0), axis=0)
    acc = tl.load(acc_ptr + stat[:, None] * BLOCK_D + d[None, :], mask=j_in[:, None], other=0.0)
    out = tl.sum(weight[:, None] * acc, axis=0) / tl.where(total > 0, total, 1.0)
    head = h * GROUP + r // S
    tl.store(o_ptr + b * o_b + head * o_h + (r % S) * o_s + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


def takes(q: Tensor, k: Tensor) -> bool:
    """Whether :func:`split_attention` runs attention of q [B, H, S, D] over k [B, n_kv, L, D]: at most
    :data:`MAX_ROWS` queries a KV head (a frame's steps; a prefill's many stay with SDPA)."""
    return q.shape[1] // k.shape[1] * q.shape[2] <= MAX_ROWS


def split_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> Tensor:
    """SDPA of q [B, H, S, D] over k, v [B, n_kv, L, D] (any strides with D contiguous; H a multiple of n_kv, each
    KV head serving ``H / n_kv`` consecutive query heads) under ``mask`` (bool [B or 1, 1, S, L], True = attend; None:
    every key) and, when ``causal``, torch's causal rule (column s sees keys [0, s]) -> [B, H, S, D] in q's dtype.
    The rules of :meth:`..model.layers.Attention.sdpa`; a call :func:`takes` refuses raises ValueError."""
    b, n_head, s, dim = q.shape
    n_kv, length = k.shape[1], k.shape[2]
    group = n_head // n_kv
    if not takes(q, k) or k.stride(-1) != 1 or v.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError(f"split_attention takes at most {MAX_ROWS} queries a KV head, each head's D contiguous")
    rows = max(16, triton.next_power_of_2(group * s))  # tl.dot's smallest tile
    block_l = max(16, min(64, triton.next_power_of_2(length)))
    block_d = max(16, triton.next_power_of_2(dim))
    blocks = triton.cdiv(length, block_l)
    out = torch.empty(b, n_head, s, dim, dtype=q.dtype, device=q.device)
    if mask is None:
        masked, m_b, m_s, m_l = q, 0, 0, 0  # a placeholder pointer, never read
    else:
        masked = mask.expand(mask.shape[0], 1, s, length).view(torch.uint8)
        m_b = 0 if mask.shape[0] == 1 else masked.stride(0)
        m_s, m_l = masked.stride(2), masked.stride(3)
    one = blocks == 1
    if one:
        top = total = acc = out  # placeholders, never written
    else:
        top = torch.empty(b * n_kv, blocks, rows, dtype=torch.float32, device=q.device)
        total = torch.empty_like(top)
        acc = torch.empty(b * n_kv, blocks, rows, block_d, dtype=torch.float32, device=q.device)
    _attend_blocks[(b * n_kv, blocks)](
        q, q.stride(0), q.stride(1), q.stride(2),
        k, k.stride(0), k.stride(1), k.stride(2),
        v, v.stride(0), v.stride(1), v.stride(2),
        masked, m_b, m_s, m_l,
        out, out.stride(0), out.stride(1), out.stride(2),
        top, total, acc, length, 1.0 / math.sqrt(dim),
        N_KV=n_kv, GROUP=group, S=s, D=dim, HAS_MASK=mask is not None, CAUSAL=causal, ONE_BLOCK=one,
        ROWS=rows, BLOCK_L=block_l, BLOCK_D=block_d, **EXACT,
    )  # fmt: skip
    if not one:
        _join_blocks[(b * n_kv, group * s)](
            out, out.stride(0), out.stride(1), out.stride(2), top, total, acc, blocks,
            N_KV=n_kv, GROUP=group, S=s, D=dim, ROWS=rows, BLOCK_D=block_d,
            BLOCK_J=triton.next_power_of_2(blocks), **EXACT,
        )  # fmt: skip
    return out
