"""The DAC-style codec of Audio8-TTS (the publisher's ``ArkttsCodec``, SPEC.md sections 3.2, 8 and 10).

44.1 kHz mono audio <-> 10 codebooks per 2048-sample frame (1 semantic codebook, 9 residual ones).

* :class:`CodecDecoder`: codes ``[B, 10, T]`` -> waveform ``[B, 2048 T]``: sum of the codebook vectors
  projected to the latent (after clamping the codes), the window-128 ``post_module`` transformer, a 4x
  ConvNeXt upsample and the SEANet decoder (transposed convs 8, 8, 4, 2, tanh at the end).
* :class:`CodecEncoder`: audio ``[B, 1, N]`` -> codes ``[B, 10, N / 2048]``: the SEANet encoder (strides
  2, 4, 8, 8, a window-512 transformer in its last block), a 2x2 ConvNeXt downsample, the window-128
  ``pre_module`` transformer and residual vector quantisation by cosine similarity.

Every convolution is causal, so a prefix of frames decodes to the prefix of the audio. The modules hold
plain ``nn.Conv1d`` weights: the publisher's weight norm is folded when a checkpoint is loaded. Module
names mirror the publisher's key names (minus the weight-norm suffixes), so loading is a rename-free copy.
Shapes are static: the RoPE tables and window masks are precomputed buffers sized by ``max_frames`` (no trig
and no comparison chain in a traced graph, as the Core AI GPU delegate needs), so the modules can be traced
by ``torch.export``; export at a fixed bucket with ``max_frames`` equal to the bucket to embed no surplus.
"""

from .decoder import CodecDecoder
from .encoder import CodecEncoder
from .layers import DEFAULT_MAX_FRAMES
from .streaming import StreamingDecoder
from .weights import codec_param_shapes, normalize_codec_state_dict

__all__ = [
    "DEFAULT_MAX_FRAMES",
    "CodecDecoder",
    "CodecEncoder",
    "StreamingDecoder",
    "codec_param_shapes",
    "normalize_codec_state_dict",
]
