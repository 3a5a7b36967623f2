"""A frame's attention as split-key Triton kernels (backends/torch/fused_attention.py) is SDPA's: fp32 to rounding,
bf16 to a bf16 step, under every mask form a frame passes (per row, broadcast, none, a row that sees no key, the fast
AR's causal pair), over strided cache views and contexts that are no multiple of a key block. Under Triton's
interpreter on the CPU (as CI runs it) and natively on CUDA."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # read when triton is imported and its kernels made
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="the fused kernels need triton (the test extra on Linux x86_64)")
from audio8_coreai.backends.torch.fused_attention import MAX_ROWS, split_attention, takes  # noqa: E402


def sdpa(q, k, v, mask, causal=False):
    """torch's SDPA in fp32, a row that sees no key as zeros (the model's rule, layers.Attention.sdpa)."""
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal,
                                         enable_gqa=True)  # fmt: skip
    return torch.nan_to_num(out, nan=0.0)


def case(batch, heads, kv, s, dim, length, seed, spare=7):
    """q [B, H, S, D]; k, v [B, kv, length, D] as a layer's views of a longer cache [1, B, kv, length + spare, D]
    (strided, not contiguous); a random mask [B, 1, S, length] with row 1 (when there is one) seeing no key."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, s, dim, generator=gen)
    kc, vc = (torch.randn(1, batch, kv, length + spare, dim, generator=gen) for _ in range(2))
    mask = torch.rand(batch, 1, s, length, generator=gen) > 0.3
    if batch > 1:
        mask[1] = False
    return q, kc[0, :, :, :length], vc[0, :, :, :length], mask


@pytest.mark.parametrize(
    ("batch", "heads", "kv", "dim", "length"),
    [(3, 14, 2, 64, 150), (1, 14, 2, 64, 2048), (2, 4, 2, 16, 10), (4, 4, 4, 16, 65)],
)
def test_one_query_a_head_is_sdpa_under_every_mask(batch, heads, kv, dim, length):
    """The slow AR's step (one query, a context of key blocks: 3, 32, 1 and 2 of them; GQA 7, 2, 1 heads a KV head):
    per-row and broadcast masks and none, within fp32 rounding of torch's SDPA; a row that sees no key is zeros."""
    q, k, v, mask = case(batch, heads, kv, 1, dim, length, seed=length)
    assert not k.is_contiguous()
    for m in (mask, mask[:1], None):
        got = split_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), None if m is None else m.to(DEVICE))
        assert got.shape == (batch, heads, 1, dim) and got.dtype == torch.float32
        torch.testing.assert_close(got.cpu(), sdpa(q, k, v, m), rtol=1e-5, atol=2e-6)
    if batch > 1:
        got = split_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), mask.to(DEVICE))
        assert torch.equal(got[1].cpu(), torch.zeros(heads, 1, dim))


def test_the_fast_ars_causal_pair_and_a_masked_pair():
    """The fast AR's first pass (rows 0 and 1 together, causal among themselves) and two masked columns."""
    q, k, v, mask = case(2, 14, 2, 2, 64, 2, seed=1)
    got = split_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), None, causal=True).cpu()
    torch.testing.assert_close(got, sdpa(q, k, v, None, causal=True), rtol=1e-5, atol=2e-6)
    q, k, v, mask = case(2, 4, 2, 2, 16, 300, seed=2)
    got = split_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), mask.to(DEVICE)).cpu()
    torch.testing.assert_close(got, sdpa(q, k, v, mask), rtol=1e-5, atol=2e-6)


def test_masks_of_any_strides():
    """A mask strided or broadcast along its keys (SDPA takes either) reads the same keys."""
    q, k, v, _ = case(2, 14, 2, 1, 64, 300, seed=4)
    every_other = (torch.rand(2, 1, 1, 600, generator=torch.Generator().manual_seed(5)) > 0.5)[..., ::2]
    for mask in (every_other, torch.ones(1, 1, 1, 1, dtype=torch.bool).expand(2, 1, 1, 300)):
        got = split_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), mask.to(DEVICE)).cpu()
        torch.testing.assert_close(got, sdpa(q, k, v, mask), rtol=1e-5, atol=2e-6)


def test_bf16_is_sdpa_to_a_bf16_step():
    """A bf16 cache: products and sums in fp32, the output rounded once to bf16 (the interpreter truncates)."""
    q, k, v, mask = case(3, 14, 2, 1, 64, 150, seed=3)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    got = split_attention(qb.to(DEVICE), kb.to(DEVICE), vb.to(DEVICE), mask.to(DEVICE)).cpu()
    want = sdpa(qb, kb, vb, mask)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=2**-7 * want.abs().max().item())


def test_a_prefill_is_left_to_sdpa():
    """At most MAX_ROWS queries a KV head: the 0.6b's one query (7 a KV head) and the fast pair (14) are taken, a
    three-token window (21) and a prefill are not, and split_attention refuses them."""
    k = torch.zeros(1, 2, 64, 64)
    assert MAX_ROWS == 16
    assert takes(torch.zeros(1, 14, 1, 64), k) and takes(torch.zeros(1, 14, 2, 64), k)
    assert not takes(torch.zeros(1, 14, 3, 64), k) and not takes(torch.zeros(1, 14, 40, 64), k)
    with pytest.raises(ValueError, match="at most 16 queries a KV head"):
        split_attention(torch.zeros(1, 14, 3, 64), k, k, None)
