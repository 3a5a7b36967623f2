"""Low-precision linears for the torch backend on CPU: ONNX Runtime's ``MatMulNBits``, the fastest well-kept
kernel measured for them (docs/speed.md, Kernels, has the side-by-side figures).

* :class:`NBitsLinear` and :class:`NBitsFeedForward`: weights quantized symmetric per block of ``block``
  input channels (one fp32 scale per block, int8 range [-127, 127] or int4 [-7, 7]), run by an ONNX Runtime
  session per module. The feed-forward runs ``w1``/``w3`` as one matmul, SiLU and the product, and ``w2`` in a
  single session call.
* :func:`.quantize.quantize_blocks` swaps these (and :mod:`.fp16`'s) into transformer blocks in place. Each is a
  :class:`LinearKernel`: it keeps ``in_features``/``out_features`` and declares ``input_dtype`` and ``weights``,
  so the benchmark's weight-streaming floor can call it alone and count what it reads.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from ...errors import QuantError
from ...precision import DEFAULT_BLOCK

ORT_DOMAIN = "com.microsoft"


def onnx_runtime():
    """(onnxruntime, onnx.helper, onnx.TensorProto, onnx.numpy_helper), imported on first use; raises QuantError
    without the packages. Called once on the caller's thread before blocks are converted on a pool's threads, so
    they do not race to import the C extensions."""
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


@dataclass(frozen=True)
class NBits:
    """A kernel's weight format: codes of ``bits`` (4 or 8) per weight, one fp32 scale per ``block`` input
    channels; ``pieces`` 2 adds the weight's quantized residual in ``lo_bits`` and splits the input into two int8
    pieces (16-bit fixed point per block, :meth:`_Graph.two_pieces`); ``accuracy`` is MatMulNBits's
    ``accuracy_level`` (4 quantizes the input per block to int8 and multiplies in integers, the fast path; 0
    dequantizes to fp32)."""

    bits: int = 8
    block: int = DEFAULT_BLOCK
    pieces: int = 1
    lo_bits: int = 8
    accuracy: int = 4


class _Graph:
    """An ONNX graph being built: its nodes and initializers, and the session it becomes."""

    def __init__(self) -> None:
        _, self.helper, self.tensor_proto, self.numpy_helper = onnx_runtime()
        self.nodes: list = []
        self.inits: list = []

    def const(self, value, name: str) -> str:
        """A named constant initializer; returns its name."""
        self.inits.append(self.numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.nodes.append(self.helper.make_node(op, inputs, outputs, **attrs))

    def matmul_nbits(
        self, x: str, y: str, codes: np.ndarray, scales: np.ndarray, n: int, k: int, bits: int, fmt: NBits, name: str
    ) -> None:
        """One MatMulNBits node ``y = x @ w.T`` over packed ``codes`` and ``scales`` (named ``name_q``/``name_s``)."""
        self.const(codes, f"{name}_q")
        self.const(scales, f"{name}_s")
        self.node(
            "MatMulNBits",
            [x, f"{name}_q", f"{name}_s"],
            [y],
            domain=ORT_DOMAIN,
            K=k,
            N=n,
            bits=bits,
            block_size=fmt.block,
            accuracy_level=fmt.accuracy,
        )

    def linear(self, name: str, x: str, y: str, weight: Tensor, bias: Tensor | None, fmt: NBits) -> None:
        """``y = x @ weight.T (+ bias)`` in ``fmt`` (two pieces: see :meth:`two_pieces`)."""
        n, k = weight.shape
        codes, scales, deq = pack_nbits(weight, fmt.bits, fmt.block)
        out = y if bias is None else f"{name}_ys"
        if fmt.pieces == 2:
            residual = weight.detach().float().cpu() - torch.from_numpy(deq)
            lo_codes, lo_scales, _ = pack_nbits(residual, fmt.lo_bits, fmt.block)
            self.two_pieces(name, x, out, (codes, scales), (lo_codes, lo_scales), n, k, fmt)
        else:
            self.matmul_nbits(x, out, codes, scales, n, k, fmt.bits, fmt, name)
        if bias is not None:
            self.const(bias.detach().float().cpu().numpy(), f"{name}_b")
            self.node("Add", [out, f"{name}_b"], [y])

    def split16(self, name: str, x: str, out: str, k: int, block: int) -> None:
        """``out`` [2M, K] = ``x`` [M, K] as two rows each: ``hi`` on the int8 grid of its own block scale (max|q| =
        127, so MatMulNBits's int8 quantization of it is exact to an ulp of the scale) and ``lo = x - hi``, which
        MatMulNBits then quantizes at a 127x finer scale: 16-bit fixed point per block, from int8 arithmetic."""

        def p(n: str) -> str:
            return f"{name}_{n}"

        shape3, shape2 = (
            self.const(np.array([0, k // block, block], np.int64), p("sh3")),
            self.const(np.array([-1, k], np.int64), p("sh2")),
        )
        q127, tiny = self.const(np.float32(127.0), p("127")), self.const(np.float32(1e-30), p("tiny"))
        lo_q = self.const(np.float32(-127.0), p("m127"))
        for op, ins, outs, attrs in (
            ("Reshape", [x, shape3], ["xr"], {}),
            ("Abs", ["xr"], ["ax"], {}),
            ("ReduceMax", ["ax"], ["amax"], {"axes": [-1], "keepdims": 1}),
            ("Div", ["amax", q127], ["s0"], {}),
            ("Max", ["s0", tiny], ["s"], {}),
            ("Div", ["xr", "s"], ["xs"], {}),
            ("Round", ["xs"], ["xq"], {}),
            ("Clip", ["xq", lo_q, q127], ["xc"], {}),
            ("Mul", ["xc", "s"], ["hi"], {}),
            ("Sub", ["xr", "hi"], ["lo"], {}),
            ("Concat", ["hi", "lo"], ["x2r"], {"axis": 0}),
            ("Reshape", ["x2r", shape2], [out], {}),
        ):
            named = [v if v in (x, shape3, shape2, q127, tiny, lo_q, out) else p(v) for v in ins]
            self.node(op, named, [v if v == out else p(v) for v in outs], **attrs)

    def two_pieces(self, name: str, x: str, y: str, hi: tuple, lo: tuple, n: int, k: int, fmt: NBits) -> None:
        """``y`` [M, N] = ``x`` [M, K] @ (w_hi + w_lo).T from int8 kernels: the weight as ``hi`` (codes, scales:
        ``fmt.bits`` per block) plus ``lo``, its quantized residual (``fmt.lo_bits``; int8: 16-bit fixed point,
        int4: 12-bit), and the input as :meth:`split16`'s x_hi + x_lo (16-bit fixed point per block).

        Three products, ``(x_hi + x_lo) @ w_hi + x_hi @ w_lo``: the fourth, ``x_lo @ w_lo``, is under 1/127^2 of a
        block's product and dropping it saves a quarter of the work, which at M > 1 (prefill) is the time (MLAS's
        int8 kernel is compute-bound there). ``x_hi @ w_lo`` is fed ``x`` itself: the int8 quantization
        MatMulNBits applies to its input per block is x_hi. Each weight piece is one node (ONNX Runtime prepacks
        a weight once per consuming node)."""

        def p(s: str) -> str:
            return f"{name}_{s}"

        self.split16(p("a"), x, p("x2"), k, fmt.block)  # [x_hi; x_lo]: 2M rows
        self.matmul_nbits(p("x2"), p("y_hi"), *hi, n, k, fmt.bits, fmt, p("hi"))
        self.matmul_nbits(x, p("y_lo"), *lo, n, k, fmt.lo_bits, fmt, p("lo"))
        # Split + Sum, not a ReduceSum over [2, M, N]: ONNX Runtime's reduction took ~10 % of a prefill pass.
        self.node("Shape", [x], [p("m")], start=0, end=1)
        self.node("Concat", [p("m"), p("m")], [p("halves")], axis=0)
        self.node("Split", [p("y_hi"), p("halves")], [p("y_xhi"), p("y_xlo")], axis=0)
        self.node("Sum", [p("y_xhi"), p("y_xlo"), p("y_lo")], [y])

    def session(self, in_features: int, out_features: int, threads: int):
        """The ONNX Runtime session of this graph: input ``x`` float32 [M, in_features], output ``y``."""
        ort = onnx_runtime()[0]
        import onnx  # installed with onnxruntime's extra (_ort checked it)

        helper, fp = self.helper, self.tensor_proto.FLOAT
        inputs = [helper.make_tensor_value_info("x", fp, ["M", in_features])]
        outputs = [helper.make_tensor_value_info("y", fp, ["M", out_features])]

        def model():  # a fresh proto each time: saving with external data rewrites the one it saves
            graph = helper.make_graph(self.nodes, "audio8_linear", inputs, outputs, self.inits)
            opsets = [helper.make_opsetid("", 17), helper.make_opsetid(ORT_DOMAIN, 1)]
            return helper.make_model(graph, opset_imports=opsets)

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


class LinearKernel(nn.Module):
    """A low-precision linear (or a whole feed-forward) swapped into a block: float32 [..., in_features] ->
    [..., out_features]. Declares what the benchmark's weight-streaming floor needs to call it alone and count
    what it reads: ``input_dtype``, ``weights`` (weights one call reads) and ``bytes_per_weight`` (of its stored
    form, scales included)."""

    input_dtype = torch.float32
    bytes_per_weight = 4.0

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features

    @property
    def weights(self) -> int:
        return self.in_features * self.out_features


class OrtModule(LinearKernel):
    """Runs a one-input, one-output ONNX Runtime session on float32 [..., in_features] -> [..., out_features];
    ``fmt`` is its weight format."""

    def __init__(self, in_features: int, out_features: int, fmt: NBits):
        super().__init__(in_features, out_features)
        self.fmt = fmt

    @property
    def bytes_per_weight(self) -> float:
        """Codes and one fp32 scale per block; two pieces add the residual's codes and scales."""
        fmt = self.fmt
        per = fmt.bits / 8 + 4 / fmt.block
        return per + (fmt.lo_bits / 8 + 4 / fmt.block if fmt.pieces == 2 else 0.0)

    def _run(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        a = x.detach().reshape(-1, self.in_features).to("cpu", torch.float32).contiguous().numpy()
        y = self._sess.run(None, {"x": a})[0]
        return torch.from_numpy(y).view(*lead, self.out_features).to(x.device, x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self._run(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}"


class NBitsLinear(OrtModule):
    """``nn.Linear`` with block-quantized weights in format ``fmt``, run by ONNX Runtime's ``MatMulNBits``."""

    def __init__(self, linear: nn.Linear, fmt: NBits = NBits(), threads: int = 1):
        super().__init__(linear.in_features, linear.out_features, fmt)
        g = _Graph()
        g.linear("l", "x", "y", linear.weight, linear.bias, fmt)
        self._sess = g.session(self.in_features, self.out_features, threads)


class NBitsFeedForward(OrtModule):
    """The SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` in one ONNX Runtime call, weights as NBitsLinear.

    ``in_features``/``out_features`` are the block's width; the floor benchmark calls it as one module whose
    weights are all three matrices.
    """

    def __init__(self, ff: nn.Module, fmt: NBits = NBits(), threads: int = 1):
        dim, hidden = ff.w1.in_features, ff.w1.out_features
        super().__init__(dim, dim, fmt)
        self.hidden = hidden
        g = _Graph()
        g.linear("w13", "x", "h13", torch.cat([ff.w1.weight, ff.w3.weight]), None, fmt)
        g.const(np.array([hidden, hidden], dtype=np.int64), "split")
        g.node("Split", ["h13", "split"], ["a", "b"], axis=-1)
        g.node("Sigmoid", ["a"], ["sa"])
        g.node("Mul", ["a", "sa"], ["silu"])
        g.node("Mul", ["silu", "b"], ["g"])
        g.linear("w2", "g", "y", ff.w2.weight, None, fmt)
        self._sess = g.session(dim, dim, threads)

    @property
    def weights(self) -> int:
        return 3 * self.in_features * self.hidden
