"""The asset functions: the frame (model/frame.py, export mode) and the codec's streaming decoder
(model/codec/streaming.py, static form) behind the contract's exact names, shapes and dtypes (manifest.py), their
example inputs, and their export with torch.export for coreai-torch."""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from ...config import CodecConfig, SamplingParams
from ...model.codec import CodecDecoder, CodecEncoder, StreamingDecoder
from ...model.dualar import DualAR
from ...model.frame import PREFILL_WIDTH, Frame, FrameInputs, FrameOutputs, Prefilled
from .manifest import FRAME_OUTPUTS, STATE_NAMES

# torch.export in torch 2.13 warns about its own pytree internals on every export.
warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated", category=FutureWarning)


class AssetFunction(NamedTuple):
    """One entry point of an asset: its module, example inputs (name -> tensor, in the contract's order),
    output names and KV states (name -> tensor; empty for a stateless function)."""

    module: nn.Module
    inputs: dict[str, Tensor]
    outputs: tuple[str, ...]
    states: dict[str, Tensor]


def _frame_outputs(out: FrameOutputs) -> tuple[Tensor, ...]:
    """A frame's batch-1 outputs in FRAME_OUTPUTS order, ids as int32, batch axis dropped."""
    i32 = torch.int32
    return (
        out.semantic.to(i32),
        out.codes[0].to(i32),
        out.logits[0],
        out.hidden[0],
        out.fast_logits[0],
        out.sampled_semantic.to(i32),
        out.sampled_codes[0].to(i32),
    )


def _inputs(
    noise_slow: Tensor,
    window: Tensor,
    noise_fast: Tensor,
    forced: Tensor,
    use_forced: Tensor,
    column: Tensor | None = None,
    pos: Tensor | None = None,
) -> FrameInputs:
    """The asset's unbatched inputs as the frame's batch-1 inputs."""
    return FrameInputs(
        noise_slow[None], window[None], noise_fast[None], forced[None], use_forced, column, 0 if pos is None else pos
    )


class _PrefillFn(nn.Module):
    """``prefill`` (see manifest.py's contract): one window of W columns into the KV state."""

    def __init__(self, model: DualAR):
        super().__init__()
        self.frame = Frame(model, mode="export")

    def forward(self, codes: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        logits, hidden = self.frame.prefill(codes, pos, k_cache, v_cache)
        return logits[0], hidden[0]


class _FirstFrameFn(nn.Module):
    """``first_frame``: frame 0 from the prefill's last logits/hidden (the frame with no column: no slow step, no
    state)."""

    def __init__(self, model: DualAR, params: SamplingParams):
        super().__init__()
        self.frame, self.params = Frame(model, mode="export"), params

    def forward(
        self,
        logits: Tensor,
        hidden: Tensor,
        noise_slow: Tensor,
        window: Tensor,
        noise_fast: Tensor,
        forced: Tensor,
        use_forced: Tensor,
    ) -> tuple[Tensor, ...]:
        # Outputs that are inputs unchanged would be graph arguments, not results: pass them through an op.
        first = Prefilled(torch.ones(1, dtype=torch.bool), logits.clone()[None], hidden.clone()[None])
        inputs = _inputs(noise_slow, window, noise_fast, forced, use_forced)  # no column: frame 0
        return _frame_outputs(self.frame(self.params, inputs, None, None, first))


class _FrameFn(nn.Module):
    """``frame``: the slow step on the previous column, both semantic draws and the fast AR in one call."""

    def __init__(self, model: DualAR, params: SamplingParams):
        super().__init__()
        self.frame, self.params = Frame(model, mode="export"), params

    def forward(
        self,
        codes: Tensor,
        pos: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        noise_slow: Tensor,
        window: Tensor,
        noise_fast: Tensor,
        forced: Tensor,
        use_forced: Tensor,
    ) -> tuple[Tensor, ...]:
        inputs = _inputs(noise_slow, window, noise_fast, forced, use_forced, codes, pos)
        return _frame_outputs(self.frame(self.params, inputs, k_cache, v_cache))


class _StreamDecodeFn(nn.Module):
    """``codec_decoder.main`` and ``first`` (see manifest.py's contract): a push of codes [1, C, P] int32 whose
    first ``count`` are frames ``start ..`` of the utterance, then the decoder state -> wav [1, P * frame_length]
    float32; the state is written in place (:meth:`.model.codec.StreamingDecoder.push_static`)."""

    def __init__(self, decoder: CodecDecoder):
        super().__init__()
        self.decoder = decoder
        self.stream = StreamingDecoder(decoder)
        self.names = tuple(self.stream.state_layout())

    def forward(self, codes: Tensor, start: Tensor, *state_and_count: Tensor) -> Tensor:
        *state, count = state_and_count
        return self.stream.push_static(codes, start, count, dict(zip(self.names, state, strict=True)))


class _EncodeFn(nn.Module):
    """``codec_encoder.main``: audio [1, 1, T * frame_length] float32 -> codes [1, C, T] int32."""

    def __init__(self, encoder: CodecEncoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, audio: Tensor) -> Tensor:
        return self.encoder(audio).to(torch.int32)


def dualar_functions(model: DualAR, params: SamplingParams, context: int) -> dict[str, AssetFunction]:
    """``prefill``, ``first_frame`` and ``frame`` of ``model`` with ``params`` baked in, on example inputs of
    the contract's shapes and a zero KV state of ``context`` slots."""
    cfg = model.cfg
    c, v_size = cfg.num_codebooks, cfg.num_semantic + 1
    dtype = model.slow.head.weight.dtype
    states = dict(zip(STATE_NAMES, model.new_kv_cache(length=context), strict=True))
    i32 = torch.int32
    column = torch.zeros(1, 1 + c, 1, dtype=i32)
    column[:, 0] = cfg.pad_token_id
    window = torch.zeros(1, 1 + c, PREFILL_WIDTH, dtype=i32)
    window[:, 0] = cfg.pad_token_id
    tail = {
        "noise_slow": torch.rand(2, v_size),
        "window": torch.full((cfg.ras_window_size,), -1, dtype=i32),
        "noise_fast": torch.rand(c - 1, cfg.codebook_size),
        "forced": torch.zeros(1 + c, dtype=i32),
        "use_forced": torch.zeros(1),
    }
    return {
        "prefill": AssetFunction(
            _PrefillFn(model), {"codes": window, "pos": torch.tensor([0], dtype=i32)}, ("logits", "hidden"), states
        ),
        "first_frame": AssetFunction(
            _FirstFrameFn(model, params),
            {"logits": torch.zeros(v_size, dtype=dtype), "hidden": torch.zeros(cfg.dim, dtype=dtype), **tail},
            FRAME_OUTPUTS,
            {},
        ),
        "frame": AssetFunction(
            _FrameFn(model, params),
            {"codes": column, "pos": torch.tensor([PREFILL_WIDTH], dtype=i32), **tail},
            FRAME_OUTPUTS,
            states,
        ),
    }


def decoder_functions(decoder: CodecDecoder, cc: CodecConfig, pushes: dict[str, int]) -> dict[str, AssetFunction]:
    """``codec_decoder``'s functions (name -> frames per push, manifest.decoder_pushes), each on example inputs of
    its push, all on one zero decoder state (the asset's functions share it)."""
    fn = _StreamDecodeFn(decoder)
    dtype = next(decoder.parameters()).dtype
    states = {name: torch.zeros(shape, dtype=dtype) for name, shape in fn.stream.state_layout().items()}
    i32 = torch.int32

    def inputs(push: int) -> dict[str, Tensor]:
        return {
            "codes": torch.zeros(1, cc.num_codebooks, push, dtype=i32),
            "start": torch.tensor([0], dtype=i32),
            "count": torch.tensor([push], dtype=i32),
        }

    return {name: AssetFunction(fn, inputs(push), ("wav",), states) for name, push in pushes.items()}


def encoder_function(encoder: CodecEncoder, cc: CodecConfig, frames: int) -> AssetFunction:
    """``codec_encoder.main`` on example audio of a bucket of ``frames``."""
    return AssetFunction(_EncodeFn(encoder), {"audio": torch.zeros(1, 1, frames * cc.frame_length)}, ("codes",), {})


def export_program(module: nn.Module, args: tuple[Tensor, ...]) -> Any:
    """torch.export with static shapes, decomposed for coreai-torch."""
    import coreai_torch

    with torch.no_grad():
        program = torch.export.export(module, args)
    return program.run_decompositions(coreai_torch.get_decomp_table())


def export_function(fn: AssetFunction) -> Any:
    """:func:`export_program` of one asset function on its example inputs and states."""
    args = list(fn.inputs.values())
    # The states come right after the first two inputs in every stateful function's forward.
    args[2:2] = fn.states.values()
    return export_program(fn.module, tuple(args))
