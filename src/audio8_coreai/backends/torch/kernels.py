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
:func:`.quantize.quantize_blocks` swaps these into transformer blocks in place. Each replacement keeps ``in_features``/
``out_features`` (and says its ``input_dtype``) so the benchmark's weight-streaming floor can call it alone.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import torch
from torch import Tensor, nn

from ...errors import Audio8Error
from ...precision import DEFAULT_BLOCK

ORT_DOMAIN = "com.microsoft"


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
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ORT_DOMAIN, 1)])

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
            onnx.save_model(
                model(),
                path,
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location="graph.data",
                size_threshold=1024,
            )
            return ort.InferenceSession(path, so, providers=providers)
    except OSError:
        return ort.InferenceSession(model().SerializeToString(), so, providers=providers)


def _split16(helper, numpy_helper, name: str, x: str, out: str, k: int, block: int, inits: list, nodes: list) -> None:
    """``out`` [2M, K] = ``x`` [M, K] as two rows each: ``hi`` on the int8 grid of its own block scale (max|q| =
    127, so MatMulNBits's int8 quantization of it is exact to an ulp of the scale) and ``lo = x - hi``, which
    MatMulNBits then quantizes at a 127x finer scale: 16-bit fixed point per block, from int8 arithmetic."""

    def c(v, n: str) -> str:  # a named constant initializer
        inits.append(numpy_helper.from_array(np.asarray(v), f"{name}_{n}"))
        return f"{name}_{n}"

    shape3, shape2 = c(np.array([0, k // block, block], np.int64), "sh3"), c(np.array([-1, k], np.int64), "sh2")
    q127, tiny = c(np.float32(127.0), "127"), c(np.float32(1e-30), "tiny")
    lo_q, hi_q = c(np.float32(-127.0), "m127"), q127

    def p(n: str) -> str:
        return f"{name}_{n}"

    nodes += [
        helper.make_node("Reshape", [x, shape3], [p("xr")]),
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
        helper.make_node("Reshape", [p("x2r"), shape2], [out]),
    ]


def _matmul_nbits(
    helper,
    numpy_helper,
    name: str,
    x: str,
    y: str,
    weight: Tensor,
    bias: Tensor | None,
    bits: int,
    block: int,
    accuracy: int,
    inits: list,
    nodes: list,
    pieces: int = 1,
    lo_bits: int = 8,
) -> None:
    """``y = x @ weight.T (+ bias)`` as MatMulNBits. ``pieces`` 2: 16-bit fixed point from int8 kernels, see
    :func:`_two_pieces`."""
    n, k = weight.shape
    codes, scales, deq = pack_nbits(weight, bits, block)
    out = y if bias is None else f"{name}_ys"
    if pieces == 2:
        lo_codes, lo_scales, _ = pack_nbits(weight.detach().float().cpu() - torch.from_numpy(deq), lo_bits, block)
        _two_pieces(
            helper,
            numpy_helper,
            name,
            x,
            out,
            (codes, scales, bits),
            (lo_codes, lo_scales, lo_bits),
            n,
            k,
            block,
            accuracy,
            inits,
            nodes,
        )
    else:
        inits += [numpy_helper.from_array(codes, f"{name}_q"), numpy_helper.from_array(scales, f"{name}_s")]
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [x, f"{name}_q", f"{name}_s"],
                [out],
                domain=ORT_DOMAIN,
                K=k,
                N=n,
                bits=bits,
                block_size=block,
                accuracy_level=accuracy,
            )
        )
    if bias is not None:
        inits.append(numpy_helper.from_array(bias.detach().float().cpu().numpy(), f"{name}_b"))
        nodes.append(helper.make_node("Add", [out, f"{name}_b"], [y]))


def _two_pieces(
    helper,
    numpy_helper,
    name: str,
    x: str,
    y: str,
    hi: tuple,
    lo: tuple,
    n: int,
    k: int,
    block: int,
    accuracy: int,
    inits: list,
    nodes: list,
) -> None:
    """``y`` [M, N] = ``x`` [M, K] @ (w_hi + w_lo).T from int8 kernels: the weight as ``hi`` (codes, scales, bits:
    int8 per block) plus ``lo``, its quantized residual (int8: 16-bit fixed point; int4: 12-bit), and the input as
    :func:`_split16`'s x_hi + x_lo (16-bit fixed point per block).

    Three products, ``(x_hi + x_lo) @ w_hi + x_hi @ w_lo``: the fourth, ``x_lo @ w_lo``, is under 1/127^2 of a
    block's product and dropping it saves a quarter of the work, which at M > 1 (prefill) is the time: there MLAS's
    int8 kernel is compute-bound (about 65 GMAC/s on one core here, about twice torch's fp32 GEMM at M = 32; its
    time grows with the rows, and tiling N does not help: measured). ``x_hi @ w_lo`` is fed ``x`` itself:
    the int8 quantization MatMulNBits applies to its input per block is x_hi. Each weight piece is one node
    (ONNX Runtime prepacks a weight once per consuming node)."""

    def p(s: str) -> str:
        return f"{name}_{s}"

    _split16(helper, numpy_helper, p("a"), x, p("x2"), k, block, inits, nodes)  # [x_hi; x_lo]: 2M rows
    for piece, rows, (codes, scales, bits) in (("hi", p("x2"), hi), ("lo", x, lo)):
        inits += [numpy_helper.from_array(codes, p(f"q_{piece}")), numpy_helper.from_array(scales, p(f"s_{piece}"))]
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [rows, p(f"q_{piece}"), p(f"s_{piece}")],
                [p(f"y_{piece}")],
                domain=ORT_DOMAIN,
                K=k,
                N=n,
                bits=bits,
                block_size=block,
                accuracy_level=accuracy,
            )
        )
    # Split + Sum, not a ReduceSum over [2, M, N]: ONNX Runtime's reduction took ~10 % of a prefill pass.
    nodes += [
        helper.make_node("Shape", [x], [p("m")], start=0, end=1),
        helper.make_node("Concat", [p("m"), p("m")], [p("halves")], axis=0),
        helper.make_node("Split", [p("y_hi"), p("halves")], [p("y_xhi"), p("y_xlo")], axis=0),
        helper.make_node("Sum", [p("y_xhi"), p("y_xlo"), p("y_lo")], [y]),
    ]


class OrtModule(nn.Module):
    """Runs a one-input, one-output ONNX Runtime session on float32 [..., in_features] -> [..., out_features];
    ``weights`` is the number of weights one call reads."""

    input_dtype = torch.float32

    @property
    def weights(self) -> int:
        return self.in_features * self.out_features

    def _run(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        a = x.detach().reshape(-1, self.in_features).to("cpu", torch.float32).contiguous().numpy()
        y = self._sess.run(None, {"x": a})[0]
        return torch.from_numpy(y).view(*lead, self.out_features).to(x.device, x.dtype)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"block={self.block}, accuracy_level={self.accuracy}, pieces={self.pieces}"
        )


class NBitsLinear(OrtModule):
    """``nn.Linear`` with ``bits``-bit block-quantized weights, run by ONNX Runtime's ``MatMulNBits``.

    ``accuracy`` is the operator's ``accuracy_level``: 4 quantizes the input per block to int8 and multiplies
    in integers (VNNI), the fast path; 0 dequantizes to fp32.
    """

    def __init__(
        self,
        linear: nn.Linear,
        bits: int = 8,
        block: int = DEFAULT_BLOCK,
        accuracy: int = 4,
        threads: int = 1,
        pieces: int = 1,
        lo_bits: int = 8,
    ):
        super().__init__()
        _, helper, tp, numpy_helper = _ort()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.bits, self.block, self.accuracy, self.pieces = bits, block, accuracy, pieces
        nodes, inits = [], []
        _matmul_nbits(
            helper,
            numpy_helper,
            "l",
            "x",
            "y",
            linear.weight,
            linear.bias,
            bits,
            block,
            accuracy,
            inits,
            nodes,
            pieces,
            lo_bits,
        )
        self._sess = _session(
            nodes,
            inits,
            [helper.make_tensor_value_info("x", tp.FLOAT, ["M", self.in_features])],
            [helper.make_tensor_value_info("y", tp.FLOAT, ["M", self.out_features])],
            threads,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x)


class NBitsFeedForward(OrtModule):
    """The SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` in one ONNX Runtime call, weights as NBitsLinear.

    ``in_features``/``out_features`` are the block's width; the floor benchmark calls it as one module whose
    weights are all three matrices.
    """

    def __init__(
        self,
        ff: nn.Module,
        bits: int = 8,
        block: int = DEFAULT_BLOCK,
        accuracy: int = 4,
        threads: int = 1,
        pieces: int = 1,
        lo_bits: int = 8,
    ):
        super().__init__()
        _, helper, tp, numpy_helper = _ort()
        dim, hidden = ff.w1.in_features, ff.w1.out_features
        self.in_features = self.out_features = dim
        self.hidden = hidden
        self.bits, self.block, self.accuracy, self.pieces = bits, block, accuracy, pieces
        nodes, inits = [], []
        w13 = torch.cat([ff.w1.weight, ff.w3.weight])
        _matmul_nbits(
            helper, numpy_helper, "w13", "x", "h13", w13, None, bits, block, accuracy, inits, nodes, pieces, lo_bits
        )
        inits.append(numpy_helper.from_array(np.array([hidden, hidden], dtype=np.int64), "split"))
        nodes += [
            helper.make_node("Split", ["h13", "split"], ["a", "b"], axis=-1),
            helper.make_node("Sigmoid", ["a"], ["sa"]),
            helper.make_node("Mul", ["a", "sa"], ["silu"]),
            helper.make_node("Mul", ["silu", "b"], ["g"]),
        ]
        _matmul_nbits(
            helper,
            numpy_helper,
            "w2",
            "g",
            "y",
            ff.w2.weight,
            None,
            bits,
            block,
            accuracy,
            inits,
            nodes,
            pieces,
            lo_bits,
        )
        self._sess = _session(
            nodes,
            inits,
            [helper.make_tensor_value_info("x", tp.FLOAT, ["M", dim])],
            [helper.make_tensor_value_info("y", tp.FLOAT, ["M", dim])],
            threads,
        )

    @property
    def weights(self) -> int:
        return 3 * self.in_features * self.hidden

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x)
