"""THE precision table: every precision's name, what it computes in, which runtime runs it, the default per device.

A name means one thing on every runtime that runs it. Torch precisions say the model's dtype and the kernels
of the slow AR's and the fast AR's block linears and of both heads (kinds of
:func:`.backends.torch.quantize.quantize_blocks`); Core AI precisions say the dtype its assets store the slow
AR's and the fast AR's weights in. Embeddings, norms and the codec keep the model's dtype (the codec runs fp32
on the CPU whatever the precision; the Core AI encoder computes in fp32 in every precision).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import PrecisionError

DEFAULT_BLOCK = 32
"""Input channels per quantization block (one fp32 scale each)."""


@dataclass(frozen=True)
class Precision:
    """One precision. ``dtype``: the model's float dtype; ``slow``/``fast``/``heads``: the kernels of the slow
    AR's and the fast AR's block linears and of both heads (``fp32`` = the dtype's own kernels; ``fp16`` = weights
    stored in float16, Core AI; ``fp16w`` = float16 weights under fp32 activations, torch CPU; ``bf16w`` = bfloat16
    weights under fp32 activations, torch CUDA); ``runtimes``:
    which of ``torch-cpu``, ``torch-cuda``, ``coreai`` run it; ``exact``: reproduces the publisher's fp32 draws
    on the oracle."""

    name: str
    dtype: torch.dtype
    slow: str
    fast: str
    heads: str
    runtimes: frozenset[str]
    summary: str
    exact: bool = False
    block: int = DEFAULT_BLOCK

    @property
    def quantized(self) -> bool:
        """Whether a torch linear leaves the model dtype's own kernels (FBGEMM, ONNX Runtime, Triton)."""
        return (self.slow, self.fast, self.heads) != ("fp32", "fp32", "fp32")


_TORCH = frozenset({"torch-cpu", "torch-cuda"})
_CPU = frozenset({"torch-cpu"})
_CUDA = frozenset({"torch-cuda"})
_COREAI = frozenset({"coreai"})

FP16_MAX = 65504.0
"""float16's largest finite value: a weight beyond it cannot be stored in a float16 precision."""

PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision(
            "fp32",
            torch.float32,
            "fp32",
            "fp32",
            "fp32",
            _TORCH | _COREAI,
            "fp32 everywhere (exact: the publisher's CPU run)",
            exact=True,
        ),
        Precision("bf16", torch.bfloat16, "fp32", "fp32", "fp32", _TORCH, "the whole model in bf16"),
        Precision(
            "fp16", torch.float16, "fp16", "fp16", "fp16", _COREAI, "float16 weights and activations (Core AI assets)"
        ),
        Precision(
            "fp16w",
            torch.float32,
            "fp16w",
            "fp16w",
            "fp16w",
            _CPU,
            "float16 weights (FBGEMM), fp32 activations in every block linear and both heads, fp32 elsewhere "
            "(the draws of fp32 on a bf16 checkpoint)",
        ),
        Precision(
            "bf16w",
            torch.float32,
            "bf16w",
            "bf16w",
            "bf16w",
            _CUDA,
            "bfloat16 weights as stored (a Triton kernel), fp32 activations and sums in every block linear and both "
            "heads, fp32 elsewhere (the draws of fp32 on a bf16 checkpoint at bf16's bytes)",
        ),
        Precision(
            "int16",
            torch.float32,
            "int16",
            "int16",
            "int16",
            _CPU,
            "16-bit fixed point per 32-block (weights and inputs, as int8 pairs) in every block linear and both "
            "heads, fp32 elsewhere",
        ),
        Precision(
            "int12",
            torch.float32,
            "int12",
            "int12",
            "int12",
            _CPU,
            "12-bit weights (int8 + a 4-bit residual per 32-block) and 16-bit inputs in every block linear and "
            "both heads, fp32 elsewhere",
        ),
        Precision(
            "int8",
            torch.float32,
            "int8",
            "fp32",
            "fp32",
            _CPU,
            "int8 slow-AR block weights (ONNX Runtime MatMulNBits), fp32 elsewhere",
        ),
        Precision(
            "int8-int16",
            torch.float32,
            "int8",
            "int16",
            "fp32",
            _CPU,
            "int8 slow-AR block weights, 16-bit fixed-point fast AR, fp32 elsewhere",
        ),
        Precision(
            "int8-fp16w",
            torch.float32,
            "int8",
            "fp16w",
            "fp16w",
            _CPU,
            "fast tier, not exact: int8 slow-AR block weights (int8 compute), float16-weight fast AR and heads",
        ),
        Precision(
            "int8-int8",
            torch.float32,
            "int8",
            "int8",
            "fp16w",
            _CPU,
            "fast tier, not exact: int8 block weights in both ARs (int8 compute), float16-weight heads",
        ),
        Precision(
            "int8-fp16",
            torch.float16,
            "int8",
            "fp16",
            "fp16",
            _COREAI,
            "int8 slow-AR weights (per-block 32), float16 fast AR and heads (Core AI assets)",
        ),
    )
}

ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}

_RENAMED = {"mixed": "'mixed' is now int8-int16 on torch and int8-fp16 on coreai (one name, one meaning)"}

DEFAULT_CPU = {torch.bfloat16: "fp16w", torch.float16: "fp16w", torch.float32: "int16"}
"""The CPU default per stored weight dtype: the fastest precision that keeps the agreement bar against fp32 on
such weights (docs/speed.md). float16 weights hold bf16 ones (the release's) exactly but round fp32 ones."""


def runtime_of(backend: str, device_type: str = "cpu") -> str:
    """The runtime key of a backend on a device: ``torch-cpu``, ``torch-cuda`` or ``coreai``."""
    return "coreai" if backend == "coreai" else f"torch-{device_type}"


def names(runtime: str) -> list[str]:
    """The precision names ``runtime`` runs, in table order."""
    return [name for name, p in PRECISIONS.items() if runtime in p.runtimes]


def resolve_precision(name: str, runtime: str | None = None) -> Precision:
    """The precision called ``name`` (or an alias), checked against ``runtime`` when given.

    Raises PrecisionError naming the choices (those of ``runtime`` when given).
    """
    if not isinstance(name, str):
        raise PrecisionError(f"precision must be a name, got {name!r}")
    spec = PRECISIONS.get(ALIASES.get(name, name))
    choices = names(runtime) if runtime else list(PRECISIONS)
    if spec is None:
        hint = f"{_RENAMED[name]}; " if name in _RENAMED else ""
        raise PrecisionError(f"unknown precision {name!r}: {hint}use one of {', '.join(choices)}")
    if runtime is not None and runtime not in spec.runtimes:
        raise PrecisionError(f"precision {spec.name} does not run on {runtime}: use one of {', '.join(choices)}")
    return spec


def default_precision(device_type: str = "cpu", stored: torch.dtype = torch.bfloat16) -> str:
    """The default torch precision on ``device_type`` for weights stored as ``stored`` (the checkpoint's dtype):
    DEFAULT_CPU's on the CPU, fp32 on CUDA."""
    return DEFAULT_CPU[stored] if device_type == "cpu" else "fp32"
