"""Exact incremental decoding: :class:`StreamingDecoder` keeps each stage's state between pushes of a few frames."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .decoder import CodecDecoder
from .layers import CausalConv, CausalConvTranspose, ConvNeXt, DecoderBlock, ResidualUnit, Snake


def _tail_steps(module: nn.Module) -> int:
    """Input steps a causal conv keeps between pushes (0: none): a stride-1 conv its ``(k - 1) d`` left context;
    a ConvTranspose the earlier inputs whose outputs reach into the next call's span."""
    if isinstance(module, CausalConv) and module.stride == 1:
        return module.left
    if isinstance(module, CausalConvTranspose):
        kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
        return -(-(kernel - stride) // stride)
    return 0


@dataclass
class _Push:
    """One push's conv state: ``tails`` (conv -> its kept input steps) and, in the static form, ``count`` (int
    tensor [1], the real frames among ``frames``; None: all ``frames`` are real)."""

    tails: dict[nn.Module, Tensor] = field(default_factory=dict)
    count: Tensor | None = None
    frames: int = 0


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

    :meth:`push_static` is the same maths in static shapes (the Core AI asset, backends/coreai): a fixed push
    whose last frames may be padding, the state in fixed tensors (:meth:`state_layout`) written in place.

    One instance per utterance (``reset`` starts another); state lives on the decoder's device. Not
    thread-safe. Raises TypeError if the decoder holds a layer kind it does not know how to stream.
    """

    def __init__(self, decoder: CodecDecoder):
        self.decoder = decoder
        post = decoder.quantizer.post_module
        self._keys = [(f"post_module_{i}_keys", f"post_module_{i}_values") for i in range(len(post.layers))]
        self._tail_names = {
            m: name.replace(".", "_")
            for root in ("quantizer.upsample", "decoder.model")
            for name, m in decoder.get_submodule(root).named_modules(prefix=root)
            if _tail_steps(m)
        }
        self.reset()

    def reset(self) -> None:
        """Forget the utterance: the next push is frame 0."""
        self.frames = 0
        self._past: list[list[Tensor]] = [[] for _ in self.decoder.quantizer.post_module.layers]
        self._push = _Push()

    @torch.no_grad()
    def push(self, codes: Tensor) -> Tensor:
        wav = self._decode(codes, self.frames, self._past, self._push)
        self.frames += codes.shape[-1]
        return wav

    def state_layout(self, batch: int = 1) -> dict[str, tuple[int, ...]]:
        """The static form's state: name -> shape, in order. Per post_module layer ``post_module_{i}_keys`` and
        ``_values`` [B, n_head, window - 1, head_dim] (rotated, the frames before the push, oldest first); per
        stateful conv (its module path, dots as underscores) its kept input steps [B, C_in, steps]. All in the
        decoder's dtype; zeros start an utterance."""
        post = self.decoder.quantizer.post_module
        att = post.layers[0].attention
        kv = (batch, att.n_head, post.window - 1, att.head_dim)
        shapes = {name: kv for pair in self._keys for name in pair}
        for m, name in self._tail_names.items():
            shapes[name] = (batch, m.conv.in_channels, _tail_steps(m))
        return shapes

    def push_static(self, codes: Tensor, start: Tensor, count: Tensor, state: dict[str, Tensor]) -> Tensor:
        """:meth:`push` in static shapes (export): codes int ``[B, C, P]`` of which the first ``count`` (int tensor
        [1], 1..P) are frames ``start ..`` (int tensor [1], or [B]: each row its own utterance's point, see
        :mod:`...backends.torch.codec_rows`) of the utterance and the rest padding; ``state`` as
        :meth:`state_layout` says, read and written in place. Returns float32 ``[B, P * frame_length]``: the
        first ``count * frame_length`` samples are the frames' (the codec is causal, so the padding after them
        changes nothing there), the rest is to be dropped. ``start + P`` must not exceed the decoder's
        ``max_frames`` (its RoPE rows; the caller checks)."""
        past = [[state[k], state[v]] for k, v in self._keys]
        tails = {m: state[name] for m, name in self._tail_names.items()}
        return self._decode(codes, start, past, _Push(tails, count, codes.shape[-1]))

    def _decode(self, codes: Tensor, start: Tensor | int, past: list[list[Tensor]], push: _Push) -> Tensor:
        dec = self.decoder
        latent = dec.quantizer.post_module.step(dec.dequantize(codes), start, past, push.count)
        wav = self._run(dec.decoder.model, self._run(dec.quantizer.upsample, latent, push), push)
        return wav.squeeze(1).float()

    def _with_tail(self, module: nn.Module, x: Tensor, steps: int, push: _Push) -> Tensor:
        """``x`` [B, C, L] preceded by the last ``steps`` input steps ``module`` saw (zeros at first); keeps the
        new last ``steps`` for the next call: of all of ``x``, or in the static form of its real part (``count``
        frames' worth), written into the state tensor."""
        tail = push.tails.get(module)
        if tail is None:
            tail = x.new_zeros(*x.shape[:-1], steps)
        full = torch.cat([tail, x], dim=-1)
        if push.count is None:
            push.tails[module] = full[..., full.shape[-1] - steps :].clone()  # not a view pinning all of ``full``
        else:
            real = push.count.long() * (x.shape[-1] // push.frames)  # input steps per frame at this stage
            tail.copy_(full.index_select(-1, real + torch.arange(steps, device=x.device)))
        return full

    def _run(self, module: nn.Module, x: Tensor, push: _Push) -> Tensor:
        if isinstance(module, nn.Sequential):
            for m in module:
                x = self._run(m, x, push)
            return x
        if isinstance(module, ResidualUnit):
            return x + self._run(module.block, x, push)
        if isinstance(module, DecoderBlock):
            return self._run(module.block, x, push)
        if isinstance(module, ConvNeXt):
            return module.mix(x, self._run(module.dwconv, x, push))
        steps = _tail_steps(module)
        if isinstance(module, CausalConv) and module.stride == 1:
            # The tail replaces the left zero padding: conv over [tail, x] gives exactly len(x) outputs.
            return module.conv(self._with_tail(module, x, steps, push) if steps else x)
        if isinstance(module, CausalConvTranspose):
            if not steps:
                return module(x)
            stride = module.conv.stride[0]
            y = module.full(self._with_tail(module, x, steps, push))
            return y[..., steps * stride : (steps + x.shape[-1]) * stride]
        if isinstance(module, (Snake, nn.Tanh)):
            return module(x)
        raise TypeError(f"streaming decode does not know how to stream {type(module).__name__}")
