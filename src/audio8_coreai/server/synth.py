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
import logging
import shutil
import tempfile
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audio import SpeechEncoder, StreamStretcher, encode_speech, time_stretch
from ..engine.stream import SpeechStream
from ..errors import AssetError, Audio8Error, AudioError, PromptError, VoiceExists, VoiceStorageError
from ..plan import Plan
from ..request import CheckedRequest
from ..tts import TTS
from ..voices import Voice, VoiceStore
from .errors import ApiError, api_error, shutting_down, storage
from .metrics import Metrics, Spoken
from .relay import Cancelled, Relay, Stalled
from .workers import Workers

if TYPE_CHECKING:
    from ..settings import ServerSettings

log = logging.getLogger("audio8_coreai.server")

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
    raises :class:`.Audio8Error` when the synthesis fails (an :class:`ApiError` 422, before any byte, when the
    utterance holds no audio), and closing it early stops the synthesis at its next frame and frees its place.
    ``replica``: who makes it (:data:`LOCAL`, or a cluster replica's id); ``tokens``: the text's token count;
    ``warning``: the plan's language warning (an ASCII line, or None); ``frames``: the frames made, and
    ``frame_cap``: :func:`frame_cap_note` (None: every piece ended by the model), ``spoken``: what it adds to the
    counters (:class:`.metrics.Spoken`), all set when the body has ended whole; ``dropped``: set when the
    synthesizer dropped the stream for a client that read nothing for ``stall_s`` (:mod:`.relay`), while its
    response may still wait on a socket that takes nothing: the response is cut then."""

    replica: str
    tokens: int
    warning: str | None = None
    frames: int | None = None
    frame_cap: str | None = None
    spoken: Spoken | None = None
    dropped: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    body: AsyncGenerator[bytes, None] = dataclasses.field(init=False)


class Synthesizer(ABC):
    """What the routes ask of the model side. ``voices``: the voice store the routes list, check and delete in
    (the one the synthesizer speaks from); ``sample_rate``: the model's (Hz); ``fingerprint``: its checkpoint's
    (:meth:`.checkpoint.Checkpoint.fingerprint`, which stored voices must match); ``metrics``: the counters of
    ``/metrics``, which it feeds with the speech it makes."""

    voices: VoiceStore
    sample_rate: int
    fingerprint: str
    metrics: Metrics

    @abstractmethod
    async def open(self, checked: CheckedRequest, output: Output) -> Speech:
        """Admit ``checked``, plan it (:meth:`.tts.TTS.plan`, once) and build its stream, to be made as ``output``
        says. Raises ApiError 503 (with Retry-After) when full, or the Audio8Error that refuses the request (the
        prompt does not fit, a stored voice belongs to another checkpoint...). Cancelling the call gives the place
        back."""

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

    @abstractmethod
    def drain(self) -> None:
        """The server begins to shut down: refuse new requests and those still waiting for a place (ApiError 503
        shutting_down); running ones go on (event loop side)."""

    @abstractmethod
    def cut(self) -> None:
        """The shutdown's grace is over: end what still runs (a whole file not yet sent: 503 shutting_down; a
        stream: cut), the workers stopping at their next frame (event loop side)."""


class _End:
    """The last item of a job's relay: the stream that ran (its statistics) or the error that stopped it."""

    def __init__(self, stream: SpeechStream | None = None, error: BaseException | None = None):
        self.stream, self.error = stream, error


def failed(error: BaseException) -> Audio8Error:
    """A synthesis that failed with ``error``: itself when an Audio8Error, else a 500 that names nothing of the
    server (logged there with its traceback)."""
    if isinstance(error, Audio8Error):
        return error
    log.error("synthesis failed: %s", type(error).__name__, exc_info=error)
    return ApiError(500, f"synthesis failed on the server ({type(error).__name__}; logged there)", code="server_error")


class LocalSynthesizer(Synthesizer):
    """``instances`` (TTS instances of one checkpoint, or the rows of :meth:`.tts.TTS.batched`) of this process,
    each making one utterance at a time on a worker thread, behind a queue of ``settings.max_queue``; the engine's
    counters go to ``metrics`` (frames, audio and compute seconds, time to first audio)."""

    def __init__(self, instances: Sequence[TTS], settings: ServerSettings, metrics: Metrics):
        if not instances:
            raise ValueError("the server needs at least one model instance")
        self.instances, self.settings, self.metrics = list(instances), settings, metrics
        self.workers = Workers(self.instances, settings.max_queue)
        self._relays: dict[Relay, bool] = {}  # the live requests' relays: True once their stream is built
        first = self.instances[0]
        self.voices, self.sample_rate, self.fingerprint = (
            first.voices,
            first.sample_rate,
            first.checkpoint.fingerprint(),
        )

    async def open(self, checked: CheckedRequest, output: Output) -> Speech:
        self.workers.admit()
        settings, metrics = self.settings, self.metrics
        relay = Relay(asyncio.get_running_loop(), settings.stream_buffer_chunks, settings.stall_s)

        def on_frame(step: int) -> None:
            relay.check()
            metrics.frame()

        def job(tts: TTS) -> None:
            try:
                if relay.stopped.is_set():
                    return
                plan = tts.plan(checked, frame_cap=settings.max_frames)  # a ceiling: clipped to what each prompt leaves
                stream = tts.stream(plan, on_frame=on_frame)
                relay.put(plan)  # the stream is built: its token count and warning go to the route
                for chunk in stream:
                    relay.put(chunk)  # waits while the client is not reading (back-pressure)
                metrics.finished(Spoken.of(stream))
                relay.put(_End(stream))
            except Cancelled:
                pass  # the body was closed: nobody reads on
            except Stalled as e:
                log.warning("dropped a stream: its client was not reading for %g s", settings.stall_s)
                relay.put(_End(error=e))
            except BaseException as e:  # delivered to the request, which answers 500 or ends the stream
                relay.put(_End(error=e))

        self._relays[relay] = False
        self.workers.submit(job)
        try:
            item = await relay.get()
        except BaseException:  # cancelled while waiting: the worker stops at its start or next frame
            relay.stop()
            self._relays.pop(relay, None)
            raise
        if not isinstance(item, Plan):  # the stream could not be built (or the server is shutting down)
            self._relays.pop(relay, None)
            raise failed(item.error)
        self._relays[relay] = True
        speech = Speech(LOCAL, item.tokens, item.warning, dropped=relay.dropped)
        speech.body = _body(relay, output, self.sample_rate, speech, lambda: self._relays.pop(relay, None))
        return speech

    async def register_voice(self, name: str, data: bytes, filename: str, transcript: str, replace: bool) -> Voice:
        self.workers.admit()
        suffix = "".join(c for c in Path(filename).suffix[:16] if c.isalnum() or c == ".")
        clip = f"upload-{uuid.uuid4().hex[:12]}{suffix}"  # the server's file: a name no message holds otherwise

        def job(tts: TTS) -> Voice:
            try:
                folder = tempfile.mkdtemp()
            except OSError as e:
                raise storage(e) from None
            path = Path(folder) / clip
            try:
                path.write_bytes(data)
                # its warnings are the answer's (with the upload's name), not lines naming a temporary file
                voice = tts.register_voice(name, path, transcript, replace=replace, warn=False)
            except OSError as e:
                raise storage(e) from None
            except (VoiceExists, VoiceStorageError, AssetError) as e:
                raise api_error(e) from None
            except Audio8Error as e:  # say the uploaded file's name, not the server's temporary path
                message = str(e).replace(str(path), filename).replace(clip, filename)
                field = "audio" if isinstance(e, AudioError) else "transcript" if isinstance(e, PromptError) else None
                field = {"ref_audio": "audio", "ref_text": "transcript"}.get(e.field or "", field)  # the form's names
                raise ApiError(400, message, field, "invalid_voice") from None
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return dataclasses.replace(voice, warnings=tuple(w.replace(clip, filename) for w in voice.warnings))

        return await self.workers.result(job)

    async def health(self) -> dict[str, Any]:
        first = self.instances[0]
        return {
            "model": first.checkpoint.name,  # the hub id or the folder's name: no answer carries a server path
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

    def drain(self) -> None:
        self.workers.drain()
        for relay in [r for r, built in self._relays.items() if not built]:
            relay.interrupt(_End(error=shutting_down()))

    def cut(self) -> None:
        for relay in list(self._relays):
            relay.interrupt(_End(error=shutting_down()))


def frame_cap_note(stream: SpeechStream) -> str | None:
    """One ASCII line saying which pieces of a finished ``stream`` stopped at their frame cap before the model ended
    them (their audio may be cut), or None when none did: the answer's ``X-Audio8-Frame-Cap`` header (a whole
    file) or its SSE ``speech.audio.done`` event's ``audio8_frame_cap``, and the server's log."""
    capped = stream.capped
    if not capped:
        return None
    cap = max(stream.pieces[i].max_frames for i in capped)
    if len(stream.pieces) == 1:
        which, them = "speech", "it"
    else:
        numbers = ", ".join(str(i + 1) for i in capped[:10]) + ("..." if len(capped) > 10 else "")
        which = f"piece{'s' if len(capped) > 1 else ''} {numbers} of {len(stream.pieces)}"
        them = "them" if len(capped) > 1 else "it"
    return (
        f"{which} stopped at the frame cap ({cap} frames) before the model ended {them}: the audio may be cut "
        "(a higher max_frames, up to the server's, or a shorter text)"
    )


async def _body(
    relay: Relay, output: Output, sample_rate: int, speech: Speech, ended: Callable[[], object]
) -> AsyncGenerator[bytes, None]:
    """A job's chunks (float32 at ``sample_rate``) made as ``output`` says: encoded as they come, or as one file at
    the end; ``speech.frames`` set at the end. Raises ApiError 422 no_audio when the utterance ended on its first
    frame (streamed or not: nothing has been sent then), Stalled when the stream was dropped for a client that read
    nothing for ``stall_s`` (:mod:`.relay`). ``finally`` tells the worker to stop at its next frame when the body is
    closed early, and calls ``ended``."""
    encoder = _ChunkEncoder(output, sample_rate) if output.stream else None
    try:
        chunks = []
        while not isinstance(item := await relay.get(), _End):
            if encoder is None:
                chunks.append(item)
            elif data := encoder.write(item):
                yield data
        if isinstance(item.error, Stalled):
            raise item.error
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
        if encoder is not None:
            data = encoder.close()
        else:  # off the event loop: a long mp3 or opus takes a noticeable time to encode (and a stretch to compute)
            audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
            data = await asyncio.to_thread(_encode_whole, audio, sample_rate, output)
        speech.frames, speech.frame_cap = item.stream.frames, frame_cap_note(item.stream)
        speech.spoken = Spoken.of(item.stream)
        if speech.frame_cap:
            log.warning("an answer's %s", speech.frame_cap)
        if data:
            yield data
    finally:
        relay.stop()
        ended()
        if encoder is not None:
            encoder.discard()  # a client that left: closed here, not by the garbage collector


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

    def discard(self) -> None:
        self.encoder.discard()
