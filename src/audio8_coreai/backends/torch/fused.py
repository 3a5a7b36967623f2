"""Fused Triton kernels for the frame on CUDA: fewer, larger launches over the same maths.

A frame's blocks are memory-light chains of small ops (a norm after each residual add, RoPE then the KV write, SiLU
then a product); on a GPU each op is a kernel whose fixed cost dwarfs its work, captured graph or not. Installed on a
model (:func:`install_fused`, by :class:`.backend.TorchBackend` on CUDA), the blocks' seams run one kernel each:

* :func:`add_rms_norm`: the residual add and the RMSNorm after it (:meth:`..model.layers.RMSNorm.add`);
* :func:`rope_kv`: q and k rotated and k, v written into the KV cache at the step's slot table
  (:meth:`..model.layers.KVStep.slot_table`), from the q/k/v projection as it comes out of ``wqkv``;
* :func:`swiglu`: ``silu(gate) * up`` of the feed-forward's stacked ``w1 || w3`` product (one GEMM);
* a frame's attention, its keys split across programs (:mod:`.fused_attention`);
* the sampler's draws over its candidates, one kernel a race (:mod:`.fused_draws`).

The elementwise maths repeats the eager ops' roundings (fp32 products and sums, no fused multiply-add: RoPE and the
KV it writes are bit-identical); a reduction (the norm's mean) or a transcendental (SiLU's exp) may differ in its last
bit. Triton runs the same kernels on the CPU under ``TRITON_INTERPRET=1``, which is how CI proves them
(tests/backends/torch/test_fused.py). Imported only where they run (it needs ``triton``, which PyTorch's CUDA
builds bring).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor, nn

from ...model.layers import Attention, Block, FeedForward, KVStep, RMSNorm
from .kernels import LinearKernel

EXACT = {"enable_fp_fusion": False}  # launch option: no fused multiply-add, so products round as eager ops do


@triton.jit
def _add_rms_norm(x_ptr, d_ptr, w_ptr, h_ptr, y_ptr, x_row, d_row, N, eps, HAS_DELTA: tl.constexpr,
                  BLOCK: tl.constexpr):  # fmt: skip
    """One row: h = x + d (x's dtype), y = (h * rsqrt(mean(h^2) + eps)) in fp32, cast to h's dtype, times w."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < N
    x = tl.load(x_ptr + row * x_row + cols, mask=inside, other=0.0)
    if HAS_DELTA:
        d = tl.load(d_ptr + row * d_row + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(h_ptr + row * N + cols, x, mask=inside)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (xf * r).to(x.dtype).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * N + cols, (y * w).to(x.dtype), mask=inside)


def as_rows(t: Tensor) -> tuple[Tensor, int]:
    """``t`` [..., N] as rows [M, N] (a view where the strides allow, else a copy) and the row stride."""
    rows = t.reshape(-1, t.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows, rows.stride(0)


def add_rms_norm(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """:meth:`..model.layers.RMSNorm.add` in one kernel: ``h = x + delta`` (``x`` when ``delta`` is None) and
    ``rms_norm(h) * weight``, each shaped and typed as ``x`` [..., N] (float32 or bfloat16, ``weight`` [N] the same
    dtype). ``h`` is the eager add's bits; the norm's mean may differ from torch's in its last bit."""
    n = x.shape[-1]
    xr, x_row = as_rows(x)
    dr, d_row = as_rows(delta) if delta is not None else (xr, x_row)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if delta is not None else x
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _add_rms_norm[(xr.shape[0],)](
        xr, dr, weight, h, y, x_row, d_row, n, eps, HAS_DELTA=delta is not None, BLOCK=triton.next_power_of_2(n)
    )
    return h, y


@triton.jit
def _rope_kv(qkv_ptr, qkv_b, qkv_s, cos_ptr, cos_b, cos_s, cos_i, sin_ptr, sin_b, sin_s, sin_i, q_ptr,
             k_ptr, v_ptr, c_b, c_h, c_l, slot_ptr, slot_b, slot_s, slot_start, S, H: tl.constexpr,
             KV: tl.constexpr, D: tl.constexpr, HEADS: tl.constexpr, HAS_SLOTS: tl.constexpr):  # fmt: skip
    """Program b * S + s, every head of row b's column s at once: q heads rotated into q [B, H, S, D], k heads
    rotated into the key cache and v heads copied into the value cache, at the row's slot for the column. Pairs
    (2i, 2i+1) turn as the eager :func:`..model.layers.rotate`: (x0 cos + x1 (-sin), x1 cos + x0 sin), each product
    rounded, then the sum; rounded to q's dtype, then (keys) to the cache's."""
    bs = tl.program_id(0)
    b = bs // S
    s = bs % S
    if HAS_SLOTS:
        slot = tl.load(slot_ptr + b * slot_b + s * slot_s)
    else:
        slot = slot_start + s
    head = tl.arange(0, HEADS)[:, None]  # [HEADS, 1]: q heads, then k, then v (HEADS >= H + 2 KV, a power of 2)
    i = tl.arange(0, D // 2)[None, :]  # [1, D/2]: pair i
    real = head < H + 2 * KV
    src = qkv_ptr + b * qkv_b + s * qkv_s + head * D + 2 * i
    x0 = tl.load(src, mask=real, other=0.0)
    x1 = tl.load(src + 1, mask=real, other=0.0)
    c = tl.load(cos_ptr + b * cos_b + s * cos_s + i * cos_i)
    neg = tl.load(sin_ptr + b * sin_b + s * sin_s + i * sin_i)  # the (-sin, sin) factor's first half
    pos = tl.load(sin_ptr + b * sin_b + s * sin_s + i * sin_i + 1)
    f0, f1 = x0.to(tl.float32), x1.to(tl.float32)
    y0 = (f0 * c + f1 * neg).to(q_ptr.dtype.element_ty)
    y1 = (f1 * c + f0 * pos).to(q_ptr.dtype.element_ty)
    is_q = head < H
    q_dst = q_ptr + ((b * H + tl.where(is_q, head, 0)) * S + s) * D + 2 * i
    tl.store(q_dst, y0, mask=is_q)
    tl.store(q_dst + 1, y1, mask=is_q)
    is_k = (head >= H) & (head < H + KV)
    k_dst = k_ptr + b * c_b + tl.where(is_k, head - H, 0) * c_h + slot * c_l + 2 * i
    tl.store(k_dst, y0.to(k_ptr.dtype.element_ty), mask=is_k)
    tl.store(k_dst + 1, y1.to(k_ptr.dtype.element_ty), mask=is_k)
    is_v = (head >= H + KV) & real
    v_dst = v_ptr + b * c_b + tl.where(is_v, head - H - KV, 0) * c_h + slot * c_l + 2 * i
    tl.store(v_dst, x0.to(v_ptr.dtype.element_ty), mask=is_v)
    tl.store(v_dst + 1, x1.to(v_ptr.dtype.element_ty), mask=is_v)


def rope_kv(
    qkv: Tensor,
    rotation: tuple[Tensor, Tensor],
    slots: Tensor | int,
    k_cache: Tensor,
    v_cache: Tensor,
    n_head: int,
    n_kv: int,
    head_dim: int,
) -> Tensor:
    """The q/k/v projection ``qkv`` [B, S, (n_head + 2 n_kv) * D] (heads in the publisher's order) to q [B, n_head,
    S, D] rotated by ``rotation`` (:func:`..model.layers.rope_rotation`'s factors, [B or 1, 1, S, D/2, 2]), with k
    rotated and v written into ``k_cache``/``v_cache`` [1, B, n_kv, L, D] (a layer's slice, in place) at ``slots``
    (:meth:`..model.layers.KVStep.slot_table`: an int start, or int64 [B, S]). One kernel; the bits of
    :meth:`..model.layers.Attention.qkv` and the KV step's write."""
    b, s, _ = qkv.shape
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    cos, sin = rotation
    if sin.stride(-1) != 1:
        raise ValueError("the (-sin, sin) factor's pairs must be contiguous (rope_rotation makes them so)")
    kc, vc = k_cache[0], v_cache[0]
    if kc.stride() != vc.stride() or kc.stride(-1) != 1:
        raise ValueError("the key and value caches must share one layout, each head's D values contiguous")
    q = torch.empty(b, n_head, s, head_dim, dtype=qkv.dtype, device=qkv.device)

    def bs(t: Tensor) -> tuple[int, int]:  # strides of batch and column in a [B or 1, 1, S, ...] factor
        return (0 if t.shape[0] == 1 else t.stride(0)), t.stride(2)

    table = slots if isinstance(slots, Tensor) else qkv  # a placeholder pointer when slots are consecutive
    slot_b, slot_s = (table.stride(0), table.stride(1)) if isinstance(slots, Tensor) else (0, 0)
    _rope_kv[(b * s,)](
        qkv, qkv.stride(0), qkv.stride(1),
        cos, *bs(cos), cos.stride(3),
        sin, *bs(sin), sin.stride(3),
        q, kc, vc, kc.stride(0), kc.stride(1), kc.stride(2),
        table, slot_b, slot_s, 0 if isinstance(slots, Tensor) else slots, s,
        H=n_head, KV=n_kv, D=head_dim, HEADS=triton.next_power_of_2(n_head + 2 * n_kv),
        HAS_SLOTS=isinstance(slots, Tensor), **EXACT,
    )  # fmt: skip
    return q


@triton.jit
def _swiglu(x_ptr, y_ptr, x_row, HIDDEN, BLOCK: tl.constexpr):
    """Row r, a block of columns: y = silu(gate) * up, gate and up the row's two halves; each op rounded to the
    input's dtype as torch's ``F.silu(gate) * up``."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < HIDDEN
    gate = tl.load(x_ptr + row * x_row + cols, mask=inside, other=0.0)
    up = tl.load(x_ptr + row * x_row + HIDDEN + cols, mask=inside, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)
    tl.store(y_ptr + row * HIDDEN + cols, (act * up.to(tl.float32)).to(gate.dtype), mask=inside)


def swiglu(gate_up: Tensor) -> Tensor:
    """``silu(gate) * up`` in one kernel, ``gate_up`` [..., 2 * hidden] the stacked ``w1 || w3`` product (float32 or
    bfloat16) -> [..., hidden] in its dtype. SiLU's exp may differ from torch's in its last bit."""
    hidden = gate_up.shape[-1] // 2
    rows, row = as_rows(gate_up)
    y = torch.empty(*gate_up.shape[:-1], hidden, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _swiglu[(rows.shape[0], triton.cdiv(hidden, block))](rows, y, row, hidden, BLOCK=block)
    return y


class FusedRMSNorm(RMSNorm):
    """:class:`..model.layers.RMSNorm` whose :meth:`add` is :func:`add_rms_norm` (the same weight)."""

    def add(self, x: Tensor, delta: Tensor | None) -> tuple[Tensor, Tensor]:
        return add_rms_norm(x, delta, self.weight, self.eps)


class FusedAttention(Attention):
    """:class:`..model.layers.Attention` whose projection, RoPE and KV write are ``wqkv`` then :func:`rope_kv`, for
    the KV steps with a slot table (every step but the eager batched rows', which keep the unfused form), and whose
    attention of a frame's few queries is :func:`.fused_attention.split_attention`."""

    def forward(
        self, x: Tensor, rotation: tuple[Tensor, Tensor], k_cache: Tensor, v_cache: Tensor, kv: KVStep
    ) -> Tensor:
        slots = kv.slot_table(x.shape[0], x.shape[1])
        if slots is None:
            return super().forward(x, rotation, k_cache, v_cache, kv)
        q = rope_kv(self.wqkv(x), rotation, slots, k_cache, v_cache, self.n_head, self.n_kv, self.head_dim)
        return self.out(kv.read(self, q, k_cache, v_cache))

    def sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
        """A frame's few queries through :func:`.fused_attention.split_attention`; a prefill's through SDPA."""
        from .fused_attention import split_attention, takes

        if takes(q, k):
            return split_attention(q, k, v, mask, causal)
        return super().sdpa(q, k, v, mask, causal)


class FusedFeedForward(LinearKernel):
    """The SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` in the model's dtype: ``w1`` and ``w3`` stacked as one
    GEMM, then :func:`swiglu`, then ``w2``. ``weights`` counts all three matrices."""

    def __init__(self, ff: FeedForward):
        dim, hidden = ff.w1.in_features, ff.w1.out_features
        super().__init__(dim, dim)
        self.hidden = hidden
        self.input_dtype = ff.w1.weight.dtype
        self.bytes_per_weight = float(ff.w1.weight.element_size())
        self.register_buffer("w13", torch.cat([ff.w1.weight.detach(), ff.w3.weight.detach()]))
        self.register_buffer("w2", ff.w2.weight.detach())

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(swiglu(F.linear(x, self.w13)), self.w2)

    @property
    def weights(self) -> int:
        return 3 * self.in_features * self.hidden


def _swap(owner: nn.Module, name: str, cls: type[nn.Module]) -> None:
    """``owner.name`` re-classed as ``cls`` (a subclass adding no state: the same module, its seams fused)."""
    module = getattr(owner, name)
    if type(module) is not cls:
        module.__class__ = cls


def install_fused(model: nn.Module) -> None:
    """Every block of ``model`` (a :class:`..model.dualar.DualAR`, after its precision is applied) with its seams
    fused: norms :class:`FusedRMSNorm`, attention :class:`FusedAttention`, a plain feed-forward
    :class:`FusedFeedForward` (a precision's own feed-forward kernel is kept); the final norms too; the sampler's
    draws :func:`.fused_draws.fused_draws`. In place."""
    from .fused_draws import fused_draws

    model.draws = fused_draws
    for block in model.modules():
        if isinstance(block, Block):
            _swap(block, "attention_norm", FusedRMSNorm)
            _swap(block, "ffn_norm", FusedRMSNorm)
            _swap(block, "attention", FusedAttention)
            if type(block.feed_forward) is FeedForward:
                block.feed_forward = FusedFeedForward(block.feed_forward)
    _swap(model.slow, "norm", FusedRMSNorm)
    _swap(model.fast, "fast_norm", FusedRMSNorm)
