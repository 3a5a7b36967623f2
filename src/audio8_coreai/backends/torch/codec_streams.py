"""The torch backend's codec streams: one utterance's incremental decode in this process, or checked from the
codec process."""

from __future__ import annotations

import numpy as np
import torch

from ...checkpoint import require_finite
from ...model.codec import CodecDecoder, StreamingDecoder
from .codec_worker import WorkerStream
from .cudnn import convolutions
from .threads import running_on

# Named in the error a damaged codec raises (NaN or inf out of it).
CODEC_FILE = "the codec file (codec.pth or codec.safetensors)"


class TorchCodecStream:
    """One utterance's streaming codec on the backend's decoder: :class:`.model.codec.StreamingDecoder` with
    NumPy in and out. ``push(codes int [C, n])`` (the next n frames) -> float32 audio [n * frame_length], the
    samples :meth:`TorchBackend.decode_window` gives for those frames of the whole utterance (to float
    rounding). Raises ValueError past the decoder's ``max_frames`` (the model's context) in one utterance. Each push
    runs on ``threads`` intra-op threads (:func:`.threads.running_on`), whichever OS thread calls it, so its audio
    does not depend on the caller's own count; its convolutions in TF32 with ``tf32`` (the ``tf32`` codec on CUDA),
    else in fp32, whatever the process's switch (:func:`.cudnn.convolutions`)."""

    def __init__(self, decoder: CodecDecoder, threads: int, tf32: bool = False):
        self._stream = StreamingDecoder(decoder)
        self._device = next(decoder.parameters()).device
        self._threads = threads
        self._tf32 = tf32

    def push(self, codes: np.ndarray) -> np.ndarray:
        return self.push_rows(np.asarray(codes)[None])[0]

    @torch.inference_mode()
    def push_rows(self, codes: np.ndarray) -> np.ndarray:
        """A batch: codes int [B, C, n] -> float32 audio [B, n * frame_length]."""
        t = torch.as_tensor(np.asarray(codes, dtype=np.int64), device=self._device)
        with running_on(self._threads), convolutions(self._tf32):
            audio = self._stream.push(t).cpu().numpy()
        return require_finite(audio, "codec", CODEC_FILE)


class FiniteStream:
    """A codec stream whose audio is checked finite (CheckpointError naming the codec file, as in-process)."""

    def __init__(self, stream: WorkerStream):
        self._stream = stream

    def push(self, codes: np.ndarray) -> np.ndarray:
        return require_finite(self._stream.push(codes), "codec", CODEC_FILE)

    def push_rows(self, codes: np.ndarray) -> np.ndarray:
        return require_finite(self._stream.push_rows(codes), "codec", CODEC_FILE)
