"""The modules to export, with their weights in a Core AI precision.

Precisions: ``fp32`` (reference: reproduces the oracle), ``fp16`` (the DualAR's and the decoder's weights,
activations and KV state in fp16; RMSNorm, RoPE and the sampler in fp32 inside the graph), ``int8-fp16`` (``fp16``
with the slow AR's linear weights in int8, symmetric, one scale per block of 32 input channels, via coreai-opt;
the fast AR stays fp16 because int8 there costs draws). The encoder computes in fp32 in every precision
(fp16 arithmetic flips its nearest-neighbour code choices); in ``fp16`` and ``int8-fp16`` its weights are stored
fp16 and cast to fp32 in the graph, except the vector quantizers' (:func:`encoder_module`). coreai-torch keeps
that cast only for large weights and folds it into an fp32 constant for small ones (docs/coreai.md).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from ...checkpoint import Checkpoint
from ...checkpoint.validate import require_finite_weights
from ...config import CodecConfig
from ...errors import AssetError
from ...model.codec import CodecDecoder, CodecEncoder
from ...model.dualar import DualAR
from ...model.frame import PREFILL_WIDTH
from ...model.layers import SpanKV, causal_cache_mask
from ...precision import FP16_MAX

QUANT_BLOCK = 32  # int8 weights: one scale per this many input channels


class _Upcast(nn.Module):
    """A parametrization that hands its module the stored tensor cast to float32."""

    def forward(self, stored: Tensor) -> Tensor:
        return stored.float()


def store_fp16(module: nn.Module) -> None:
    """Store ``module``'s float32 parameters as float16, each cast back to float32 where it is used, in place.

    The exported program then holds float16 constants followed by a cast, which coreai-torch 0.4.3 keeps for
    weights of about 250,000 elements or more (the asset stores half their bytes while every op computes in
    float32) and folds into a float32 constant for smaller ones (measured; tests/backends/coreai/test_coreai_parity.py).
    """
    for sub in list(module.modules()):
        for name, param in list(sub.named_parameters(recurse=False)):
            setattr(sub, name, nn.Parameter(param.detach().half(), requires_grad=False))
            # unsafe: the parametrization changes the dtype (float16 stored, float32 seen).
            parametrize.register_parametrization(sub, name, _Upcast(), unsafe=True)


def encoder_module(cc: CodecConfig, state: dict[str, Tensor], precision: str, frames: int) -> CodecEncoder:
    """The codec encoder for ``precision``: float32 compute always (float16 arithmetic flips its
    nearest-neighbour code choices); for fp16 and int8-fp16, every weight but the vector quantizers' is stored
    float16 (the VQ projections and codebooks, 0.3M of the 0.6b encoder's 207M weights, stay float32: stored
    float16 they flip 5 of the tiny oracle clip's 110 codes, the rest flips none)."""
    encoder = CodecEncoder.from_state_dict(cc, state, max_frames=frames)
    if precision != "fp32":
        for part in (encoder.encoder, encoder.quantizer.downsample, encoder.quantizer.pre_module):
            store_fp16(part)
    return encoder


def decoder_module(cc: CodecConfig, state: dict[str, Tensor], precision: str, frames: int) -> CodecDecoder:
    """The codec decoder for ``precision``: float32 for fp32, float16 weights and activations otherwise."""
    dtype = torch.float32 if precision == "fp32" else torch.float16
    return CodecDecoder.from_state_dict(cc, state, dtype, max_frames=frames)


def _quantize_slow_linears(model: DualAR, context: int) -> None:
    """Replace the slow AR's linear weights by int8 (symmetric with clipping, per block of QUANT_BLOCK input
    channels, weight only) with coreai-opt, in place. Embeddings, the head and the norms stay as they are."""
    # coreai-opt imports torchao, which logs a warning per CUDA-only library a CPU machine cannot load and a torch
    # deprecation: noise a user reads as errors, silenced for the import alone.
    quieted = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in quieted]
    try:
        for logger in quieted:
            logger.setLevel(logging.ERROR)
        from coreai_opt import ExportBackend
        from coreai_opt.quantization import ModuleQuantizerConfig, QuantizationSpec, Quantizer, QuantizerConfig
        from coreai_opt.quantization.spec import PerBlockGranularity, QuantizationScheme
    finally:
        for logger, level in zip(quieted, levels):
            logger.setLevel(level)

    spec = QuantizationSpec(
        dtype=torch.int8,
        qscheme=QuantizationScheme.SYMMETRIC_WITH_CLIPPING,
        granularity=PerBlockGranularity(axis=1, block_size=QUANT_BLOCK),
    )
    weights_only = ModuleQuantizerConfig(op_input_spec=None, op_output_spec=None, op_state_spec={"weight": spec})
    # Eager mode keeps an nn.Module, so the one quantized slow AR serves prefill and frame alike.
    config = QuantizerConfig(
        global_config=None,
        execution_mode="eager",
        module_name_configs={r"layers\.\d+\.(attention\.(wqkv|wo)|feed_forward\.w[123])": weights_only},
    )
    cfg = model.cfg
    k, v = model.new_kv_cache(length=context)
    slots = torch.arange(PREFILL_WIDTH)
    example = (
        torch.zeros(1, 1 + cfg.num_codebooks, PREFILL_WIDTH, dtype=torch.long),
        slots[None],
        k,
        v,
        SpanKV(0, None, causal_cache_mask(slots[:1], PREFILL_WIDTH, context)),
    )
    quantizer = Quantizer(model.slow, config)
    quantizer.prepare(example)
    model.slow = quantizer.finalize(backend=ExportBackend.CoreAI)


def dualar_model(ckpt: Checkpoint, precision: str, context: int) -> DualAR:
    """The DualAR of ``ckpt`` for ``precision``: float32 for fp32, float16 otherwise, and for int8-fp16 the slow
    AR's linear weights in int8 (prepared on an example prefill window over ``context`` KV slots). Raises
    CheckpointError for a weight holding NaN or inf (assets of a damaged checkpoint would draw from NaN), AssetError
    for a weight beyond float16's range in a float16 precision."""
    state = ckpt.model_state_dict()
    reach = require_finite_weights((t for t in state.values() if t.is_floating_point()), ckpt.model_file.name)
    if precision != "fp32" and reach > FP16_MAX:
        raise AssetError(
            f"a weight of magnitude {reach:g} is beyond float16's range ({FP16_MAX:g}), so {precision} would make "
            "it infinite: convert with --precision fp32"
        )
    model = DualAR.from_state_dict(ckpt.config, state, torch.float32 if precision == "fp32" else torch.float16)
    del state
    if precision == "int8-fp16":
        _quantize_slow_linears(model, context)
    return model
