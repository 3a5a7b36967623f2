"""Transformer pieces (model/layers.py): GQA attention folded for one query equals the unfolded form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from audio8_coreai.model.layers import Attention


# bf16: equal to enable_gqa; against one head alone (another kernel) within one bf16 step at these magnitudes
@pytest.mark.parametrize("dtype, atol, alone_atol", [(torch.float32, 2e-6, 2e-6), (torch.bfloat16, 0.0, 8e-3)])
@pytest.mark.parametrize("masked", [False, True])
def test_folded_gqa_equals_repeated_heads(dtype, atol, alone_atol, masked):
    """The 0.6b slow AR's shape (14 query heads over 2 KV heads, head_dim 64), one query per row at its own length:
    the fold gives what ``enable_gqa`` (K/V repeated per query head) gives, a row with no visible key zeros."""
    gen = torch.Generator().manual_seed(0)
    att = Attention(896, 14, 2, 64, qkv_bias=True, o_bias=False)
    b, length = 3, 40
    q = torch.randn(b, 14, 1, 64, generator=gen).to(dtype)
    k, v = (torch.randn(b, 2, length, 64, generator=gen).to(dtype) for _ in range(2))
    mask = None
    if masked:
        visible = torch.tensor([5, length, 0])  # keys [0, n) visible per row; the last row sees none
        mask = (torch.arange(length)[None, :] < visible[:, None])[:, None, None]  # [B, 1, 1, L]
    got = att.sdpa(q, k, v, mask)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert got.shape == (b, 14, 1, 64) and got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    if masked:
        assert not got.isnan().any()
        # row 0 sees keys 0..4 only: query head 9 (KV head 1) against them alone
        alone = F.scaled_dot_product_attention(q[:1, 9:10], k[:1, 1:2, :5], v[:1, 1:2, :5])
        torch.testing.assert_close(got[:1, 9:10], alone, rtol=0, atol=alone_atol)
