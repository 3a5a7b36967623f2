"""Exact incremental decoding: :class:`StreamingDecoder` keeps each stage's state between pushes of a few frames."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .decoder import CodecDecoder
from .layers import CausalConv, CausalConvTranspose, ConvNeXt, DecoderBlock, ResidualUnit, Snake


class StreamingDecoder:
    """Exact incremental :class:`CodecDecoder`: codes pushed a few frames at a time -> the audio of those frames.

    ``push(codes)`` with codes int ``[B, num_codebooks, n]`` (the next n frames of the utterance) returns
    float32 ``[B, n * frame_length]``: the same samples a whole-utterance ``decoder(codes)`` gives for those
    frames, up to float rounding (about 1e-6 at fp32), for any split of the utterance into pushes. Each stage
    keeps what its next call needs and nothing is decoded twice:

    * dequantize: per frame, no state;
    * post_module: per layer, the rotated keys/values of the last ``window - 1`` frames
      (:meth:`WindowTransformer.step`), at absolute positions from the utterance start, so an utterance can be
      at most the decoder's ``max_frames`` long (ValueError beyond);
    * upsample and the SEANet decoder: every causal conv keeps its last ``(k - 1) d`` input steps (zeros at the
      start, which is the conv's own zero padding); a causal ConvTranspose (kernel ``2 s``) keeps its last
      input step, whose output tail a whole run would add to the next samples; Snake, tanh and ConvNeXt's
      pointwise part are per step.

    One instance per utterance (``reset`` starts another); state lives on the decoder's device. Not
    thread-safe. Raises TypeError if the decoder holds a layer kind it does not know how to stream.
    """

    def __init__(self, decoder: CodecDecoder):
        self.decoder = decoder
        self.reset()

    def reset(self) -> None:
        """Forget the utterance: the next push is frame 0."""
        self.frames = 0
        self._past: list[list[Tensor]] = [[] for _ in self.decoder.quantizer.post_module.layers]
        self._tails: dict[nn.Module, Tensor] = {}

    @torch.no_grad()
    def push(self, codes: Tensor) -> Tensor:
        dec = self.decoder
        latent = dec.quantizer.post_module.step(dec.dequantize(codes), self.frames, self._past)
        wav = self._run(dec.decoder.model, self._run(dec.quantizer.upsample, latent))
        self.frames += codes.shape[-1]
        return wav.squeeze(1).float()

    def _with_tail(self, module: nn.Module, x: Tensor, steps: int) -> Tensor:
        """``x`` [B, C, L] preceded by the last ``steps`` input steps ``module`` saw (zeros at first); keeps the
        new last ``steps`` for the next call."""
        tail = self._tails.get(module)
        if tail is None:
            tail = x.new_zeros(*x.shape[:-1], steps)
        full = torch.cat([tail, x], dim=-1)
        self._tails[module] = full[..., full.shape[-1] - steps :].clone()  # not a view pinning all of ``full``
        return full

    def _run(self, module: nn.Module, x: Tensor) -> Tensor:
        if isinstance(module, nn.Sequential):
            for m in module:
                x = self._run(m, x)
            return x
        if isinstance(module, ResidualUnit):
            return x + self._run(module.block, x)
        if isinstance(module, DecoderBlock):
            return self._run(module.block, x)
        if isinstance(module, ConvNeXt):
            return module.mix(x, self._run(module.dwconv, x))
        if isinstance(module, CausalConv) and module.stride == 1:
            # The tail replaces the left zero padding: conv over [tail, x] gives exactly len(x) outputs.
            return module.conv(self._with_tail(module, x, module.left) if module.left else x)
        if isinstance(module, CausalConvTranspose):
            kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
            steps = -(-(kernel - stride) // stride)  # earlier inputs whose outputs reach into this call's span
            if not steps:
                return module(x)
            y = module.full(self._with_tail(module, x, steps))
            return y[..., steps * stride : (steps + x.shape[-1]) * stride]
        if isinstance(module, (Snake, nn.Tanh)):
            return module(x)
        raise TypeError(f"streaming decode does not know how to stream {type(module).__name__}")
