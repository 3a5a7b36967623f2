"""Low-precision linears for the torch backend on CPU: the fastest well-kept kernels measured on this machine.

Measured side by side (``benchmarks/bench_kernels.py``: the fast AR's 63M weights at batch 1, one thread, a
2-core AVX-512 VNNI/BF16 machine under load), relative to fp32 ``F.linear``: ONNX Runtime's ``MatMulNBits``
(8-bit weights in blocks along the input, int8 compute, ``accuracy_level`` 4) 0.20-0.27x; torch's dynamic
qint8 (fbgemm) 0.27x but with per-tensor 7-bit activations; ``torch._weight_int8pack_mm`` 0.45x (bf16 inputs)
and 2.9x (fp32 inputs); oneDNN bf16 with prepacked weights 0.58x; plain bf16 ``F.linear`` 0.78x. With two
threads on a loaded machine every OpenMP-threaded torch kernel here slows down several times (its barrier
waits on a descheduled thread), while ONNX Runtime without spinning does not.

So:

* :class:`NBitsLinear` and :class:`NBitsFeedForward`: weights quantized symmetric per block of ``block``
  input channels (one fp32 scale per block, int8 range [-127, 127] or int4 [-7, 7]), run by an ONNX Runtime
  session (built in memory, no file) per module. The feed-forward runs ``w1``/``w3`` as one matmul, SiLU and
  the product, and ``w2`` in a single session call.
* :class:`PackedBf16Linear`: bf16 weights prepacked for oneDNN; inputs rounded to bf16, outputs back in the
  caller's dtype (fp32 stays fp32 around it: norms, residuals, attention).

:func:`quantize_blocks` swaps these into transformer blocks in place. Each replacement keeps ``in_features``/
``out_features`` (and says its ``input_dtype``) so the benchmark's weight-streaming floor can call it alone.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import Audio8Error

ORT_DOMAIN = "com.microsoft"
DEFAULT_BLOCK = 32


class QuantError(Audio8Error, RuntimeError):
    """The low-precision kernels are unavailable (onnxruntime missing) or a shape does not fit them."""


def _ort():
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError as e:  # pragma: no cover - an install without the extra
        raise QuantError("int8/mixed precision runs on ONNX Runtime: pip install onnxruntime onnx") from e
    return ort, helper, TensorProto, numpy_helper


def pack_nbits(weight: Tensor, bits: int, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize ``weight`` [N, K] symmetric per block of ``block`` input channels for ``MatMulNBits``.

    Returns (packed uint8 [N, K/block, block*bits/8], scales fp32 [N * K/block], dequantized fp32 [N, K]).
    Stored codes are ``q + 2^(bits-1)`` (the operator's default zero point) with ``q`` in
    ``[-(2^(bits-1) - 1), 2^(bits-1) - 1]``; 4-bit codes pack two per byte, the even element in the low nibble.
    K must be a multiple of ``block``.
    """
    if bits not in (4, 8):
        raise QuantError(f"bits must be 4 or 8, got {bits}")
    n, k = weight.shape
    if k % block:
        raise QuantError(f"input width {k} is not a multiple of the quantization block {block}")
    # In torch (its threads, fewer temporaries: most of a 0.6b load was this arithmetic in NumPy), fp32 throughout:
    # round half to even, and a product of a small integer and an fp32 scale rounded once, as NumPy does it.
    with torch.no_grad():
        w = weight.detach().to("cpu", torch.float32).reshape(n, k // block, block)
        qmax = (1 << (bits - 1)) - 1
        scale = w.abs().amax(-1) / qmax
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(w / scale[..., None]).clamp_(-qmax, qmax)
        deq = (q * scale[..., None]).reshape(n, k)
        codes = q.add_(1 << (bits - 1)).to(torch.uint8)
        if bits == 4:
            codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(codes.numpy()), scale.reshape(-1).numpy(), deq.numpy()


def _session(nodes, inits, inputs, outputs, threads: int):
    ort, helper, _, _ = _ort()
    import onnx  # installed with onnxruntime's extra (_ort checked it)

    def model():  # a fresh proto each time: saving with external data rewrites the one it saves
        graph = helper.make_graph(nodes, "audio8_linear", inputs, outputs, inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                       helper.make_opsetid(ORT_DOMAIN, 1)])

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # A spinning pool fights other processes for the cores and measured up to 3x slower here under load.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # No per-session arena: ~190 sessions would each keep their largest activation (prefill's); 0.45 GB here.
    so.enable_cpu_mem_arena = False
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = ["CPUExecutionProvider"]
    # Loaded from a file whose weights are external data, ONNX Runtime maps them, prepacks them and drops the
    # mapping; loaded from bytes it keeps a copy of every weight beside the prepacked form (measured per int8
    # weight: 1.54 bytes resident against 2.64). The files go once the session holds what it needs; without a
    # writable temporary folder the bytes still work, at the larger footprint.
    try:
        with tempfile.TemporaryDirectory(prefix="audio8-ort-", ignore_cleanup_errors=True) as folder:
            path = os.path.join(folder, "graph.onnx")
            onnx.save_model(model(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="graph.data", size_threshold=1024)
            return ort.InferenceSession(path, so, providers=providers)
    except OSError:
        return ort.InferenceSession(model().SerializeToString(), so, providers=providers)


def _split16(helper, numpy_helper, name: str, x: str, out: str, k: int, block: int, inits: list,
             nodes: list) -> None:
    """``out`` [2M, K] = ``x`` [M, K] as two rows each: ``hi`` on the int8 grid of its own block scale (max|q| =
    127, so MatMulNBits's int8 quantization of it is exact to an ulp of the scale) and ``lo = x - hi``, which
    MatMulNBits then quantizes at a 127x finer scale: 16-bit fixed point per block, from int8 arithmetic."""
    c = lambda v, n: inits.append(numpy_helper.from_array(np.asarray(v), f"{name}_{n}")) or f"{name}_{n}"
    shape3, shape2 = c(np.array([0, k // block, block], np.int64), "sh3"), c(np.array([-1, k], np.int64), "sh2")
    q127, tiny = c(np.float32(127.0), "127"), c(np.float32(1e-30), "tiny")
    lo_q, hi_q = c(np.float32(-127.0), "m127"), q127
    p = lambda n: f"{name}_{n}"
    nodes += [helper.make_node("Reshape", [x, shape3], [p("xr")]),
              helper.make_node("Abs", [p("xr")], [p("ax")]),
              helper.make_node("ReduceMax", [p("ax")], [p("amax")], axes=[-1], keepdims=1),
              helper.make_node("Div", [p("amax"), q127], [p("s0")]),
              helper.make_node("Max", [p("s0"), tiny], [p("s")]),
              helper.make_node("Div", [p("xr"), p("s")], [p("xs")]),
              helper.make_node("Round", [p("xs")], [p("xq")]),
              helper.make_node("Clip", [p("xq"), lo_q, hi_q], [p("xc")]),
              helper.make_node("Mul", [p("xc"), p("s")], [p("hi")]),
              helper.make_node("Sub", [p("xr"), p("hi")], [p("lo")]),
              helper.make_node("Concat", [p("hi"), p("lo")], [p("x2r")], axis=0),
              helper.make_node("Reshape", [p("x2r"), shape2], [out])]


def _matmul_nbits(helper, numpy_helper, name: str, x: str, y: str, weight: Tensor, bias: Tensor | None,
                  bits: int, block: int, accuracy: int, inits: list, nodes: list, pieces: int = 1,
                  lo_bits: int = 8) -> None:
    """``y = x @ weight.T (+ bias)`` as MatMulNBits. ``pieces`` 2: 16-bit fixed point from int8 kernels, see
    :func:`_two_pieces`."""
    n, k = weight.shape
    codes, scales, deq = pack_nbits(weight, bits, block)
    out = y if bias is None else f"{name}_ys"
    if pieces == 2:
        lo_codes, lo_scales, _ = pack_nbits(weight.detach().float().cpu() - torch.from_numpy(deq), lo_bits, block)
        _two_pieces(helper, numpy_helper, name, x, out, (codes, scales, bits), (lo_codes, lo_scales, lo_bits), n,
                    k, block, accuracy, inits, nodes)
    else:
        inits += [numpy_helper.from_array(codes, f"{name}_q"), numpy_helper.from_array(scales, f"{name}_s")]
        nodes.append(helper.make_node("MatMulNBits", [x, f"{name}_q", f"{name}_s"], [out], domain=ORT_DOMAIN,
                                      K=k, N=n, bits=bits, block_size=block, accuracy_level=accuracy))
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.detach().float().cpu().numpy(), f"{name}_b"))
        nodes.append(helper.make_node("Add", [out, f"{name}_b"], [y]))


def _two_pieces(helper, numpy_helper, name: str, x: str, y: str, hi: tuple, lo: tuple, n: int, k: int, block: int,
                accuracy: int, inits: list, nodes: list) -> None:
    """``y`` [M, N] = ``x`` [M, K] @ (w_hi + w_lo).T from int8 kernels: the weight as ``hi`` (codes, scales, bits:
    int8 per block) plus ``lo``, its quantized residual (int8: 16-bit fixed point; int4: 12-bit), and the input as
    :func:`_split16`'s x_hi + x_lo (16-bit fixed point per block).

    Three products, ``(x_hi + x_lo) @ w_hi + x_hi @ w_lo``: the fourth, ``x_lo @ w_lo``, is under 1/127^2 of a
    block's product and dropping it saves a quarter of the work, which at M > 1 (prefill) is the time: there MLAS's
    int8 kernel is compute-bound (about 65 GMAC/s on one core here, about twice torch's fp32 GEMM at M = 32; its
    time grows with the rows, and tiling N does not help: measured). ``x_hi @ w_lo`` is fed ``x`` itself:
    the int8 quantization MatMulNBits applies to its input per block is x_hi. Each weight piece is one node
    (ONNX Runtime prepacks a weight once per consuming node)."""
    p = lambda s: f"{name}_{s}"
    _split16(helper, numpy_helper, p("a"), x, p("x2"), k, block, inits, nodes)  # [x_hi; x_lo]: 2M rows
    for piece, rows, (codes, scales, bits) in (("hi", p("x2"), hi), ("lo", x, lo)):
        inits += [numpy_helper.from_array(codes, p(f"q_{piece}")), numpy_helper.from_array(scales, p(f"s_{piece}"))]
        nodes.append(helper.make_node("MatMulNBits", [rows, p(f"q_{piece}"), p(f"s_{piece}")], [p(f"y_{piece}")],
                                      domain=ORT_DOMAIN, K=k, N=n, bits=bits, block_size=block,
                                      accuracy_level=accuracy))
    # Split + Sum, not a ReduceSum over [2, M, N]: ONNX Runtime's reduction took ~10 % of a prefill pass.
    nodes += [helper.make_node("Shape", [x], [p("m")], start=0, end=1),
              helper.make_node("Concat", [p("m"), p("m")], [p("halves")], axis=0),
              helper.make_node("Split", [p("y_hi"), p("halves")], [p("y_xhi"), p("y_xlo")], axis=0),
              helper.make_node("Sum", [p("y_xhi"), p("y_xlo"), p("y_lo")], [y])]


class _OrtModule(nn.Module):
    """Runs a one-input, one-output ONNX Runtime session on [..., in_features] -> [..., out_features]."""

    input_dtype = torch.float32

    def _run(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        a = x.detach().reshape(-1, self.in_features).to("cpu", torch.float32).contiguous().numpy()
        y = self._sess.run(None, {"x": a})[0]
        return torch.from_numpy(y).view(*lead, self.out_features).to(x.device, x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
                f"block={self.block}, accuracy_level={self.accuracy}, pieces={self.pieces}")


class NBitsLinear(_OrtModule):
    """``nn.Linear`` with ``bits``-bit block-quantized weights, run by ONNX Runtime's ``MatMulNBits``.

    ``accuracy`` is the operator's ``accuracy_level``: 4 quantizes the input per block to int8 and multiplies
    in integers (VNNI), the fast path; 0 dequantizes to fp32.
    """

    def __init__(self, linear: nn.Linear, bits: int = 8, block: int = DEFAULT_BLOCK, accuracy: int = 4,
                 threads: int = 1, pieces: int = 1, lo_bits: int = 8):
        super().__init__()
        _, helper, tp, numpy_helper = _ort()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bits, self.block, self.accuracy, self.pieces = bits, block, accuracy, pieces
        nodes, inits = [], []
        _matmul_nbits(helper, numpy_helper, "l", "x", "y", linear.weight, linear.bias, bits, block, accuracy,
                      inits, nodes, pieces, lo_bits)
        self._sess = _session(nodes, inits, [helper.make_tensor_value_info("x", tp.FLOAT, ["M", self.in_features])],
                              [helper.make_tensor_value_info("y", tp.FLOAT, ["M", self.out_features])], threads)

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x)


class NBitsFeedForward(_OrtModule):
    """The SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` in one ONNX Runtime call, weights as NBitsLinear.

    ``in_features``/``out_features`` are the block's width; the floor benchmark calls it as one module whose
    weights are all three matrices.
    """

    def __init__(self, ff: nn.Module, bits: int = 8, block: int = DEFAULT_BLOCK, accuracy: int = 4,
                 threads: int = 1, pieces: int = 1, lo_bits: int = 8):
        super().__init__()
        _, helper, tp, numpy_helper = _ort()
        dim, hidden = ff.w1.in_features, ff.w1.out_features
        self.in_features = self.out_features = dim
        self.hidden = hidden
        self.bits, self.block, self.accuracy, self.pieces = bits, block, accuracy, pieces
        nodes, inits = [], []
        w13 = torch.cat([ff.w1.weight, ff.w3.weight])
        _matmul_nbits(helper, numpy_helper, "w13", "x", "h13", w13, None, bits, block, accuracy, inits, nodes,
                      pieces, lo_bits)
        inits.append(numpy_helper.from_array(np.array([hidden, hidden], dtype=np.int64), "split"))
        nodes += [helper.make_node("Split", ["h13", "split"], ["a", "b"], axis=-1),
                  helper.make_node("Sigmoid", ["a"], ["sa"]),
                  helper.make_node("Mul", ["a", "sa"], ["silu"]),
                  helper.make_node("Mul", ["silu", "b"], ["g"])]
        _matmul_nbits(helper, numpy_helper, "w2", "g", "y", ff.w2.weight, None, bits, block, accuracy, inits, nodes,
                      pieces, lo_bits)
        self._sess = _session(nodes, inits, [helper.make_tensor_value_info("x", tp.FLOAT, ["M", dim])],
                              [helper.make_tensor_value_info("y", tp.FLOAT, ["M", dim])], threads)

    @property
    def weights(self) -> int:
        return 3 * self.in_features * self.hidden

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x)


class PackedBf16Linear(nn.Module):
    """``nn.Linear`` with bf16 weights prepacked for oneDNN (batch-1 layout); fp32 in, fp32 out.

    The input is rounded to bf16 (as a bf16 model's activations are), the product accumulates in fp32, the
    output is returned in the input's dtype.
    """

    input_dtype = torch.float32

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().to(torch.bfloat16)
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(w, 1), persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16),
                             persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch.ops.mkldnn._linear_pointwise(a, self.packed, self.bias, "none", [], "")
        return y.view(*lead, self.out_features).to(x.dtype)


class _FeedForward(nn.Module):
    """SwiGLU over replaced linears, ``w1``/``w3`` fused into one matmul (the same maths as layers.FeedForward)."""

    def __init__(self, w13: nn.Module, w2: nn.Module, hidden: int):
        super().__init__()
        self.w13, self.w2, self.hidden = w13, w2, hidden

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.w13(x).split(self.hidden, dim=-1)
        return self.w2(F.silu(a) * b)


def _fused_linear(w1: nn.Linear, w3: nn.Linear) -> nn.Linear:
    lin = nn.Linear(w1.in_features, w1.out_features + w3.out_features, bias=False, device="meta")
    lin.weight = nn.Parameter(torch.cat([w1.weight, w3.weight]).detach(), requires_grad=False)
    return lin


KINDS = ("fp32", "bf16", "int8", "int4", "int12", "int16")
_NBITS = {"int8": (8, 1, 8), "int4": (4, 1, 8), "int12": (8, 2, 4), "int16": (8, 2, 8)}  # kind -> (bits, pieces, lo)


def quantize_blocks(blocks, kind: str, block: int = DEFAULT_BLOCK, threads: int = 1) -> None:
    """Swap the linears of transformer ``blocks`` (layers.Block) in place for ``kind``'s kernels.

    fp32: unchanged. bf16: PackedBf16Linear (feed-forward w1/w3 fused). int8 / int4: NBitsLinear for
    ``wqkv``/``wo`` and NBitsFeedForward for the feed-forward (int8 compute). int16: the same with two int8
    pieces for weights and inputs (16-bit fixed point per block); int12: the weight's residual in 4 bits.
    Raises QuantError.
    """
    if kind not in KINDS:
        raise QuantError(f"unknown weight kind {kind!r}: use one of {', '.join(KINDS)}")
    if kind == "fp32":
        return
    for blk in blocks:
        att, ff = blk.attention, blk.feed_forward
        if kind == "bf16":
            att.wqkv, att.wo = PackedBf16Linear(att.wqkv), PackedBf16Linear(att.wo)
            blk.feed_forward = _FeedForward(PackedBf16Linear(_fused_linear(ff.w1, ff.w3)), PackedBf16Linear(ff.w2),
                                            ff.w1.out_features)
        else:
            bits, pieces, lo = _NBITS[kind]
            att.wqkv = NBitsLinear(att.wqkv, bits, block, threads=threads, pieces=pieces, lo_bits=lo)
            att.wo = NBitsLinear(att.wo, bits, block, threads=threads, pieces=pieces, lo_bits=lo)
            blk.feed_forward = NBitsFeedForward(ff, bits, block, threads=threads, pieces=pieces, lo_bits=lo)


def quantize_linear(linear: nn.Linear, kind: str, block: int = DEFAULT_BLOCK, threads: int = 1) -> nn.Module:
    """One ``nn.Linear`` (a head) for ``kind``'s kernels (fp32: itself)."""
    if kind == "fp32":
        return linear
    if kind == "bf16":
        return PackedBf16Linear(linear)
    bits, pieces, lo = _NBITS[kind]
    return NBitsLinear(linear, bits, block, threads=threads, pieces=pieces, lo_bits=lo)


@dataclass(frozen=True)
class Precision:
    """A ``--precision`` of the torch backend: the model's dtype, then the kernels of the slow AR's and the fast
    AR's block linears (:func:`quantize_blocks` kinds). Embeddings, norms, the heads and the codec keep the
    model dtype (the codec runs fp32 on CPU whatever the precision)."""

    name: str
    dtype: torch.dtype
    slow: str
    fast: str
    heads: str = "fp32"  # the slow AR's 4,097-row head and the fast AR's output
    block: int = DEFAULT_BLOCK
    summary: str = ""

    @property
    def quantized(self) -> bool:
        """Whether any linear leaves the model dtype's own kernels."""
        return (self.slow, self.fast, self.heads) != ("fp32", "fp32", "fp32")


PRECISIONS = {
    "fp32": Precision("fp32", torch.float32, "fp32", "fp32", summary="fp32 everywhere (exact: the publisher's CPU run)"),
    "bf16": Precision("bf16", torch.bfloat16, "fp32", "fp32", summary="the whole model in bf16"),
    "int8": Precision("int8", torch.float32, "int8", "fp32",
                      summary="int8 slow-AR block weights (ONNX Runtime MatMulNBits), fp32 elsewhere"),
    "mixed": Precision("mixed", torch.float32, "int8", "int16",
                       summary="int8 slow-AR block weights, 16-bit fixed-point fast AR, fp32 elsewhere"),
    "int12": Precision("int12", torch.float32, "int12", "int12", "int12",
                       summary="12-bit weights (int8 + a 4-bit residual per 32-block) and 16-bit inputs in every "
                               "block linear and both heads, fp32 elsewhere"),
    "int16": Precision("int16", torch.float32, "int16", "int16", "int16",
                       summary="16-bit fixed point per 32-block (weights and inputs, as int8 pairs) in every "
                               "block linear and both heads, fp32 elsewhere"),
}


DEFAULT_PRECISION = "int16"
"""The CPU default: the fastest precision whose draws keep the bar (semantic 98.5 %, codebook 97.5 %) against
fp32, teacher-forced on the 0.6b random checkpoint (int16: 256/256 and 2304/2304; int12 98.8 % / 99.6 %, too
close to the bar for a default; int8 slow-AR weights 94.9 % / 94.3 %) and on the tiny oracle (every draw)."""


def default_precision(device_type: str = "cpu") -> str:
    """DEFAULT_PRECISION on the CPU when ONNX Runtime is installed, else fp32 (CUDA, or no onnxruntime)."""
    if device_type != "cpu":
        return "fp32"
    try:
        _ort()
    except QuantError:
        return "fp32"
    return DEFAULT_PRECISION


def resolve_precision(name: str) -> Precision:
    """The :class:`Precision` called ``name``; raises QuantError naming the choices."""
    try:
        return PRECISIONS[name]
    except KeyError:
        raise QuantError(f"unknown precision {name!r}: use one of {', '.join(PRECISIONS)}") from None


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
    release): quantizing from it is exact and the load never holds an fp32 copy of the weights. ONNX Runtime
    sessions get ``threads`` intra-op threads (default: torch's count)."""
    threads = threads or torch.get_num_threads()
    quantize_blocks(model.slow.layers, precision.slow, precision.block, threads)
    quantize_blocks(model.fast.fast_layers, precision.fast, precision.block, threads)
    model.slow.head = quantize_linear(model.slow.head, precision.heads, precision.block, threads)
    model.fast.fast_output = quantize_linear(model.fast.fast_output, precision.heads, precision.block, threads)
    dt = precision.dtype
    for owner, name in _embedding_tables(model):
        emb = getattr(owner, name)
        if emb.weight.dtype != dt:
            setattr(owner, name, UpcastEmbedding(emb, dt))
    for m in model.modules():
        if isinstance(m, UpcastEmbedding):
            continue
        for key, p in m.named_parameters(recurse=False):
            if p.is_floating_point() and p.dtype != dt:
                p.data = p.data.to(dt)
    release_freed_memory()


def _embedding_tables(model) -> tuple[tuple[nn.Module, str], ...]:
    """(owner module, attribute) of a DualAR's embedding tables; the attribute is also the tensor's name in
    model.safetensors (``NAME.weight``)."""
    return ((model.slow, "embeddings"), (model.slow, "codebook_embeddings"), (model.fast, "fast_embeddings"))


def map_embeddings(model, state: dict[str, Tensor]) -> None:
    """Point ``model``'s (dualar.DualAR) embedding tables (:class:`UpcastEmbedding` or ``nn.Embedding``) at the
    tensors of ``state`` instead of their own copies, where dtype and shape match. ``state`` is a fresh
    ``Checkpoint.model_state_dict()``: views of model.safetensors memory-mapped (copy on write), so only the
    pages of the rows a prompt or frame reads become resident (the 0.6b model's tables are 0.36 GB in bf16) and
    the values are the stored ones."""
    for owner, name in _embedding_tables(model):
        emb, stored = getattr(owner, name), state.get(f"{name}.weight")
        same = stored is not None and (stored.dtype, stored.shape, stored.device) == (
            emb.weight.dtype, emb.weight.shape, emb.weight.device)
        if isinstance(emb, (UpcastEmbedding, nn.Embedding)) and same:
            emb.weight = nn.Parameter(stored, requires_grad=False)
    release_freed_memory()


def release_freed_memory() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; a no-op elsewhere): the load frees many
    mid-sized weight copies that would otherwise stay in the process's RSS."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


def linear_weights(m: nn.Module) -> int:
    """Weights one call of a linear-like module reads (for the floor's byte count)."""
    return getattr(m, "weights", m.in_features * m.out_features)
