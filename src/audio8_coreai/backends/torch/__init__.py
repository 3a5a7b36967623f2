"""The torch backend: PyTorch on CPU or CUDA, eager frames or CUDA graphs, low-precision CPU kernels."""

from .backend import TorchBackend, resolve_codec_dtype, resolve_device
from .codec_streams import CODEC_FILE, TorchCodecStream

__all__ = ["CODEC_FILE", "TorchBackend", "TorchCodecStream", "resolve_device", "resolve_codec_dtype"]
