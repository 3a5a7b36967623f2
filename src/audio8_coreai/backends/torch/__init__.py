"""The torch backend: PyTorch on CPU or CUDA, eager frames or CUDA graphs, low-precision CPU kernels."""

from .backend import TorchBackend, resolve_device, resolve_dtype
from .codec_streams import CODEC_FILE, TorchCodecStream

__all__ = ["CODEC_FILE", "TorchBackend", "TorchCodecStream", "resolve_device", "resolve_dtype"]
