"""AAC in ADTS (``response_format: aac``, as OpenAI's) through PyAV: FFmpeg's native AAC encoder. PyAV (``av``)
is imported when aac is asked for (:func:`pyav`), not with this module."""

from __future__ import annotations

import io
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from ..errors import AudioError
from ..packages import require

if TYPE_CHECKING:
    import av

# The AAC sampling-frequency table (ISO/IEC 14496-3) from 8 to 48 kHz: the rates an ADTS header can carry.
AAC_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


def pyav() -> ModuleType:
    """The ``av`` module; raises AudioError naming its install when it cannot be imported."""
    return require("av", AudioError)


class AacWriter:
    """Mono float32 audio in, ADTS AAC bytes out as they are made: ``write(chunk)`` and ``close()`` return the
    bytes ready to send (ADTS frames stand alone, so the bytes of all calls joined are one playable file).
    ``sample_rate`` one of AAC_RATES (else av's ValueError). 128 kbit/s, as a typical speech AAC. Raises AudioError
    as :func:`pyav`."""

    def __init__(self, sample_rate: int):
        self._av = pyav()
        self.sample_rate = sample_rate
        self._sink = io.BytesIO()
        self._sent = 0
        self._container = self._av.open(self._sink, "w", format="adts")
        self._stream = self._container.add_stream("aac", rate=sample_rate, layout="mono")
        self._stream.bit_rate = 128_000

    def _take(self) -> bytes:
        data = self._sink.getbuffer()[self._sent :].tobytes()
        self._sent += len(data)
        return data

    def _encode(self, frame: av.AudioFrame | None) -> bytes:
        for packet in self._stream.encode(frame):  # PyAV re-frames to the codec's 1024 samples
            self._container.mux(packet)
        return self._take()

    def write(self, chunk: np.ndarray) -> bytes:
        chunk = np.ascontiguousarray(chunk, dtype=np.float32).reshape(1, -1)
        if chunk.shape[1] == 0:
            return b""
        frame = self._av.AudioFrame.from_ndarray(chunk, format="fltp", layout="mono")
        frame.sample_rate = self.sample_rate
        return self._encode(frame)

    def close(self) -> bytes:
        data = self._encode(None)  # flush the encoder's last frames
        self._container.close()
        return data + self._take()
