"""Where the routes' speech and voices are made: the :class:`Synthesizer` interface, and :class:`LocalSynthesizer`,
model instances of this process behind :class:`.workers.Workers`.

The app (:func:`.app.create_app`) takes any synthesizer: the local one (``audio8 serve``) or one that forwards to
a cluster (:class:`.ray_app.RaySynthesizer`, ``audio8 serve --ray``). Routes, validation, errors and formats stay
the app's; a synthesizer admits a request (or refuses it with a 503), builds its stream (or raises the error that
refuses it) and makes its bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audio import SpeechEncoder, StreamStretcher, encode_speech, time_stretch
from ..engine.stream import SpeechStream
from ..errors import Audio8Error
from ..request import CheckedRequest
from ..tts import TTS
from ..voices import Voice, VoiceStore
from .errors import ApiError
from .metrics import Metrics
from .workers import Workers

if TYPE_CHECKING:
    from .state import ServerSettings

LOCAL = "local"  # the replica id of a synthesizer in the app's own process (the X-Replica header)


@dataclass(frozen=True)
class Output:
    """How a speech's body is made: ``format`` (one of :data:`.audio.SPEECH_FORMATS`) at ``rate`` Hz
    (:func:`.audio.output_rate`), at ``speed`` (a time stretch, pitch kept; 1.0: none), ``stream``ed as it is made
    or whole."""

    format: str
    rate: int
    speed: float
    stream: bool


@dataclass(eq=False)
class Speech:
    """An utterance whose stream is built (the route can still refuse it: no byte is sent yet).

    ``body``: the response's bytes, encoded chunks as they are made (streamed) or the whole file as one item; it
    raises :class:`.Audio8Error` when the synthesis fails (an :class:`ApiError` 422 when a whole file would hold no
    audio), and closing it early stops the synthesis at its next frame and frees its place. ``replica``: who makes
    it (:data:`LOCAL`, or a cluster replica's id); ``tokens``: the text's token count; ``frames``: the frames made,
    set when the body has ended whole."""

    replica: str
    tokens: int
    frames: int | None = None
    body: AsyncGenerator[bytes, None] = dataclasses.field(init=False)


class Synthesizer(ABC):
    """What the routes ask of the model side. ``voices``: the voice store the routes list, check and delete in
    (the one the synthesizer speaks from); ``sample_rate``: the model's (Hz); ``fingerprint``: its checkpoint's
    (:meth:`.checkpoint.Checkpoint.fingerprint`, which stored voices must match)."""

    voices: VoiceStore
    sample_rate: int
    fingerprint: str

    @abstractmethod
    async def open(self, checked: CheckedRequest, output: Output) -> Speech:
        """Admit ``checked`` and build its stream, to be made as ``output`` says. Raises ApiError 503 (with
        Retry-After) when full, or the Audio8Error that refuses the request (the prompt does not fit, a stored
        voice is damaged...). Cancelling the call gives the place back."""

    @abstractmethod
    async def register_voice(self, name: str, data: bytes, filename: str, transcript: str, replace: bool) -> Voice:
        """Encode the uploaded clip ``data`` (the client's file ``filename``, named in messages) and store it as
        voice ``name``. Raises ApiError (503 when full, 400 for a clip that cannot be used) or VoiceError."""

    @abstractmethod
    async def health(self) -> dict[str, Any]:
        """``GET /health``'s fields: model, backend, device, sample_rate, workers, running, queued, max_queue."""

    @abstractmethod
    def load(self) -> tuple[int, int]:
        """(requests running, requests waiting) as this process sees them (``/metrics``)."""

    @abstractmethod
    def close(self) -> None:
        """Stop taking work (the app's shutdown)."""


class _Cancelled(Exception):
    """Raised in a worker's frame loop when the speech's body was closed (its client has gone)."""


_STARTED = object()  # a job's first item when its stream is built


class _End:
    """The last item of a job's queue: the stream that ran (its statistics) or the error that stopped it."""

    def __init__(self, stream: SpeechStream | None = None, error: BaseException | None = None):
        self.stream, self.error = stream, error


def failed(error: BaseException) -> Audio8Error:
    """A synthesis that failed with ``error``: itself when an Audio8Error, else said as a 500."""
    if isinstance(error, Audio8Error):
        return error
    return ApiError(500, f"synthesis failed: {type(error).__name__}: {error}", code="server_error")


class LocalSynthesizer(Synthesizer):
    """``instances`` (TTS instances of one checkpoint, or the rows of :meth:`.tts.TTS.batched`) of this process,
    each making one utterance at a time on a worker thread, behind a queue of ``settings.max_queue``; the engine's
    counters go to ``metrics`` (frames, audio and compute seconds, time to first audio)."""

    def __init__(self, instances: Sequence[TTS], settings: ServerSettings, metrics: Metrics):
        if not instances:
            raise ValueError("the server needs at least one model instance")
        self.instances, self.settings, self.metrics = list(instances), settings, metrics
        self.workers = Workers(self.instances, settings.max_queue)
        first = self.instances[0]
        self.voices, self.sample_rate, self.fingerprint = (
            first.voices,
            first.sample_rate,
            first.checkpoint.fingerprint(),
        )

    async def open(self, checked: CheckedRequest, output: Output) -> Speech:
        self.workers.admit()
        loop = asyncio.get_running_loop()
        items: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        metrics = self.metrics

        def on_frame(step: int) -> None:
            if cancel.is_set():
                raise _Cancelled
            metrics.frame()

        def job(tts: TTS) -> None:
            put = loop.call_soon_threadsafe
            try:
                if cancel.is_set():
                    return
                speech = tts.stream(
                    checked.text,
                    voice=checked.voice,
                    on_frame=on_frame,
                    frame_cap=self.settings.max_frames,  # a ceiling: clipped to what each prompt leaves
                    **checked.stream_options(),
                )
                put(items.put_nowait, _STARTED)
                for chunk in speech:
                    put(items.put_nowait, chunk)
                metrics.finished(speech)
                put(items.put_nowait, _End(speech))
            except _Cancelled:
                pass  # the body was closed: nobody reads on
            except BaseException as e:  # delivered to the request, which answers 500 or ends the stream
                put(items.put_nowait, _End(error=e))

        self.workers.submit(job)
        try:
            item = await items.get()
        except BaseException:  # cancelled while waiting: the worker stops at its start or next frame
            cancel.set()
            raise
        if item is not _STARTED:  # the stream could not be built
            raise failed(item.error)
        speech = Speech(LOCAL, len(self.instances[0].prompts.encode(checked.text)))
        speech.body = _body(items, cancel, output, self.sample_rate, speech)
        return speech

    async def register_voice(self, name: str, data: bytes, filename: str, transcript: str, replace: bool) -> Voice:
        self.workers.admit()
        suffix = Path(filename).suffix[:16]

        def job(tts: TTS) -> Voice:
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / ("clip" + suffix)
                path.write_bytes(data)
                try:
                    voice = tts.register_voice(name, path, transcript, replace=replace)
                except Audio8Error as e:  # say the uploaded file's name, not the server's temporary path
                    raise ApiError(
                        400, str(e).replace(str(path), filename).replace(path.name, filename), None, "invalid_voice"
                    ) from None
            warnings = tuple(w.replace("clip" + suffix, filename) for w in voice.warnings)
            return dataclasses.replace(voice, warnings=warnings)

        return await self.workers.submit(job)

    async def health(self) -> dict[str, Any]:
        first = self.instances[0]
        return {
            "model": str(first.checkpoint.path),
            "backend": first.backend.description,
            "device": first.backend.device_name,
            "sample_rate": first.sample_rate,
            "workers": len(self.instances),
            "running": self.workers.running,
            "queued": self.workers.queued,
            "max_queue": self.settings.max_queue,
        }

    def load(self) -> tuple[int, int]:
        return self.workers.running, self.workers.queued

    def close(self) -> None:
        self.workers.shutdown()


async def _body(
    items: asyncio.Queue, cancel: threading.Event, output: Output, sample_rate: int, speech: Speech
) -> AsyncGenerator[bytes, None]:
    """A job's chunks (float32 at ``sample_rate``) made as ``output`` says: as they come, or as one file at the end;
    ``speech.frames`` set at the end. ``finally`` tells the worker to stop at its next frame when the body is closed
    early."""
    try:
        if output.stream:
            encoder = _ChunkEncoder(output, sample_rate)
            while not isinstance(item := await items.get(), _End):
                if data := encoder.write(item):
                    yield data
            if item.error is not None:
                raise failed(item.error)
            if data := encoder.close():
                yield data
            speech.frames = item.stream.frames
            return
        chunks = []
        while not isinstance(item := await items.get(), _End):
            chunks.append(item)
        if item.error is not None:
            raise failed(item.error)
        if item.stream.frames == 0:  # not an empty file: a client would play silence and not know why
            raise ApiError(
                422,
                "the model ended the utterance at once (eos on the first frame): no audio to send; "
                "send the request again without a seed, or with another one",
                "seed",
                "no_audio",
            )
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        # Off the event loop: a long mp3 or opus takes a noticeable time to encode (and a stretch to compute).
        data = await asyncio.to_thread(_encode_whole, audio, sample_rate, output)
        speech.frames = item.stream.frames
        yield data
    finally:
        cancel.set()


def _encode_whole(audio: np.ndarray, sample_rate: int, output: Output) -> bytes:
    """A whole utterance (float32 at ``sample_rate``) at ``output.speed`` (pitch kept), encoded as ``output`` says."""
    return encode_speech(time_stretch(audio, sample_rate, output.speed), sample_rate, output.format, output.rate)


class _ChunkEncoder:
    """An utterance's chunks (float32 at ``sample_rate``) at ``output.speed`` (a streaming time stretch, pitch
    kept), encoded as ``output`` says as they come: ``write(chunk)`` and ``close()`` give the bytes ready to send."""

    def __init__(self, output: Output, sample_rate: int):
        self.stretcher = StreamStretcher(sample_rate, output.speed)
        self.encoder = SpeechEncoder(output.format, sample_rate, output.rate)

    def write(self, chunk: np.ndarray) -> bytes:
        return self.encoder.write(self.stretcher.write(chunk))

    def close(self) -> bytes:
        return self.encoder.write(self.stretcher.close()) + self.encoder.close()
