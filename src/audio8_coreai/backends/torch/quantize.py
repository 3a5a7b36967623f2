"""Apply a precision to a DualAR in place: block linears and heads to the precision's kernels
(:mod:`.kernels`), converted block by block from the mapped checkpoint (each stored weight's pages handed back once
its copy is made), embedding tables kept in their stored dtype and read in place from the mapped checkpoint."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...checkpoint import MODEL_FILE
from ...checkpoint.validate import require_finite_weights
from ...errors import QuantError
from ...packages import require
from ...precision import DEFAULT_BLOCK, FP16_MAX, Precision
from .fp16 import Fp16FeedForward, Fp16Linear
from .kernels import NBits, NBitsFeedForward, NBitsLinear, onnx_runtime
from .memory import make_resident, release_freed_memory, release_mapped_pages

KINDS = ("fp32", "fp16w", "bf16w", "int8", "int4", "int12", "int16")
_NBITS = {"int8": (8, 1, 8), "int4": (4, 1, 8), "int12": (8, 2, 4), "int16": (8, 2, 8)}  # kind -> (bits, pieces, lo)


WIDENED = ("fp16w", "bf16w")
"""Kinds whose weights are stored 16-bit and widened to fp32 for fp32 products (:func:`widened`)."""


def widened(kind: str) -> tuple[type[nn.Module], type[nn.Module]]:
    """The (linear, feed-forward) kernels of a :data:`WIDENED` kind: FBGEMM's float16 ones (CPU) or the bfloat16
    Triton kernel's (CUDA; raises QuantError naming the install without triton)."""
    if kind == "fp16w":
        return Fp16Linear, Fp16FeedForward
    require("triton", QuantError)
    from .bf16w import Bf16wFeedForward, Bf16wLinear

    return Bf16wLinear, Bf16wFeedForward


def nbits(kind: str, block: int = DEFAULT_BLOCK) -> NBits:
    """The kernel format of a weight ``kind`` (int8, int4, int12, int16) with ``block`` channels per scale."""
    bits, pieces, lo = _NBITS[kind]
    return NBits(bits, block, pieces, lo)


def _check_weights(weights: list[Tensor], kind: str) -> None:
    """Raise CheckpointError for a weight holding NaN or inf (:func:`...checkpoint.validate.require_finite_weights`),
    QuantError for an fp16w weight beyond float16's range (FBGEMM's packing would saturate it: other products)."""
    reach = require_finite_weights(weights, MODEL_FILE)
    if kind == "fp16w" and reach > FP16_MAX:
        raise QuantError(
            f"a weight of magnitude {reach:g} is beyond float16's range ({FP16_MAX:g}), so fp16w would change it: "
            "load with precision int16 or fp32"
        )


def quantize_blocks(blocks, kind: str, block: int = DEFAULT_BLOCK, threads: int = 1) -> list[Tensor]:
    """Swap the linears of transformer ``blocks`` (layers.Block) in place for ``kind``'s kernels.

    fp32: unchanged. fp16w: Fp16Linear for ``wqkv``/``wo`` and Fp16FeedForward (float16 weights, fp32
    compute; CPU); bf16w: the same with bfloat16 weights (:mod:`.bf16w`; CUDA). int8 / int4: NBitsLinear for
    ``wqkv``/``wo`` and NBitsFeedForward for the feed-forward (int8 compute). int16: the same with two int8 pieces
    for weights and inputs (16-bit fixed point per block); int12:
    the weight's residual in 4 bits. ``threads`` blocks are converted at a time, one per thread (FBGEMM's prepack
    and ONNX Runtime's session builds run without the GIL); after each such group the pages of the weights it
    replaced are handed back (:func:`.memory.release_mapped_pages`), so converting from a mapped checkpoint holds
    ``threads`` blocks' stored weights at a time beside the converted ones. Returns the stored weights replaced.
    Raises QuantError (for fp16w also a weight beyond float16's range), or CheckpointError for a weight holding NaN
    or inf.
    """
    if kind not in KINDS:
        raise QuantError(f"unknown weight kind {kind!r}: use one of {', '.join(KINDS)}")
    if kind == "fp32":
        return []
    fmt = None if kind in WIDENED else nbits(kind, block)

    def convert(blk) -> list[Tensor]:
        att, ff = blk.attention, blk.feed_forward
        replaced = [att.wqkv.weight, att.wo.weight, ff.w1.weight, ff.w2.weight, ff.w3.weight]
        _check_weights(replaced, kind)
        if fmt is None:
            linear, feed_forward = widened(kind)
            att.wqkv, att.wo, blk.feed_forward = linear(att.wqkv), linear(att.wo), feed_forward(ff)
        else:
            att.wqkv = NBitsLinear(att.wqkv, fmt, threads)
            att.wo = NBitsLinear(att.wo, fmt, threads)
            blk.feed_forward = NBitsFeedForward(ff, fmt, threads)
        return replaced

    if fmt is not None:
        onnx_runtime()  # imported here, on the caller's thread, not by the pool's threads at once
    group, stored = max(1, threads), []
    with ThreadPoolExecutor(group, thread_name_prefix="audio8-convert") as pool:
        for start in range(0, len(blocks), group):
            replaced = [w for ws in pool.map(convert, blocks[start : start + group]) for w in ws]
            release_mapped_pages(replaced)
            release_freed_memory()
            stored += replaced
    return stored


def quantize_linear(linear: nn.Linear, kind: str, block: int = DEFAULT_BLOCK, threads: int = 1) -> nn.Module:
    """One ``nn.Linear`` (a head) for ``kind``'s kernels (fp32: itself); the pages of the weight it replaces are
    handed back as in :func:`quantize_blocks`."""
    if kind == "fp32":
        return linear
    _check_weights([linear.weight], kind)
    kernel = widened(kind)[0](linear) if kind in WIDENED else NBitsLinear(linear, nbits(kind, block), threads)
    release_mapped_pages([linear.weight])
    return kernel


class UpcastEmbedding(nn.Module):
    """An embedding table kept in its stored dtype (bf16 in the release) whose rows come out in ``dtype``: exact
    (bf16 -> fp32 is), at half the memory of an fp32 table."""

    def __init__(self, emb: nn.Embedding, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(emb.weight.detach(), requires_grad=False)
        self.dtype = dtype

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight).to(self.dtype)


def apply_precision(model, precision: Precision, threads: int | None = None) -> None:
    """Swap ``model``'s (dualar.DualAR) block linears and heads for the precision's kernels, in place, then bring
    everything else to ``precision.dtype``, except the embedding tables, which keep their dtype and upcast the
    rows they return (:class:`UpcastEmbedding`). Build the model in the checkpoint's own dtype (bf16 for the
    release): quantizing from it is exact and the load never holds an fp32 copy of the weights. Built from a mapped
    checkpoint (``DualAR.from_state_dict`` keeps the stored tensors), the tables stay mapped, so only the pages of the
    rows a prompt reads become resident, except the rows a frame reads, moved to anonymous memory
    (:func:`.memory.make_resident`: never faulted in from the disk mid-frame), and the linears are converted block
    by block (see :func:`quantize_blocks`). ONNX Runtime sessions get ``threads`` intra-op threads (default:
    torch's count)."""
    threads = threads or torch.get_num_threads()
    replaced = quantize_blocks(model.slow.layers, precision.slow, precision.block, threads)
    replaced += quantize_blocks(model.fast.fast_layers, precision.fast, precision.block, threads)
    for owner, name in ((model.slow, "head"), (model.fast, "fast_output")):
        linear = getattr(owner, name)
        setattr(owner, name, quantize_linear(linear, precision.heads, precision.block, threads))
        if getattr(owner, name) is not linear:
            replaced.append(linear.weight)
    dt = precision.dtype
    for owner, name in _embedding_tables(model):
        emb = getattr(owner, name)
        if emb.weight.dtype != dt:
            setattr(owner, name, UpcastEmbedding(emb, dt))
    # The rows a frame reads, moved out of the mapping (nothing a frame reads faults in from the disk): the
    # semantic rows of the token table (the text rows serve prefill, read in place), the codebook tables whole.
    cfg = model.cfg
    make_resident(model.slow.embeddings.weight, cfg.semantic_begin_id, cfg.semantic_end_id + 1)
    make_resident(model.slow.codebook_embeddings.weight)
    make_resident(model.fast.fast_embeddings.weight)
    for m in model.modules():
        if isinstance(m, UpcastEmbedding):
            continue
        for p in m.parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dt:
                p.data = p.data.to(dt)
    # Once more over every replaced weight: a read fault maps the file's neighbouring pages too (the kernel's
    # fault-around, 64 KiB), so a table or norm read after memory pressure dropped its pages maps back pages of a
    # linear already handed back.
    release_mapped_pages(replaced)
    release_freed_memory()


def _embedding_tables(model) -> tuple[tuple[nn.Module, str], ...]:
    """(owner module, attribute) of a DualAR's embedding tables."""
    return ((model.slow, "embeddings"), (model.slow, "codebook_embeddings"), (model.fast, "fast_embeddings"))
