"""Home Assistant's Wyoming protocol (TCP; JSON lines, PCM after them) over the TTS API: ``audio8 wyoming``.

Events served (the ``wyoming`` package's own classes, its :class:`AsyncServer` and :class:`AsyncEventHandler`):

* ``describe`` -> ``info``: one TTS program whose voices are the model's own voice (listed as
  the settings' ``voice``) and the stored voices made with this checkpoint, each speaking :data:`LANGUAGES`; a
  voice's description, which Home Assistant shows as its name, is its name and then what it is
  (``ana: cloned from a 3.3 s clip``).
* ``synthesize`` -> ``audio-start`` (44.1 kHz, 16-bit, mono: the model's rate), ``audio-chunk`` as the audio is
  made (chunks of :meth:`.tts.TTS.stream`), ``audio-stop``. A text over ``max_input_chars`` (a long assistant
  reply from a client that does not stream) is spoken in parts of at most that many characters, cut at sentence
  ends (:func:`..text.split.split_text`), in one seed and joined by the stream's pause.
* ``synthesize-start``, ``synthesize-chunk``..., ``synthesize-stop`` -> one ``audio-start``, the audio of each
  sentence spoken as soon as it is complete (:func:`..text.split.complete_sentences`; the rest at the stop),
  joined by the stream's pause, then ``audio-stop`` and ``synthesize-stopped``. The ``synthesize`` a streaming
  client also sends (for servers that do not stream) is ignored while a stream is open; a ``synthesize-start`` in
  an open stream ends that one first, as its ``synthesize-stop`` would.

A voice is chosen by name (``voice.name``); a language asks for nothing (the model reads the text it is given).
Events are read bounded in bytes and time (:mod:`.wyoming_events`). Every refusal is an ``error`` event whose
text says what to change and whose code is the error's class
(:mod:`..errors`; ``no_audio`` when the model ends the utterance on its first frame), never a traceback; the
connection is then closed, as wyoming-piper does, so a client that waits for ``audio-stop`` without reading
``error`` events (as Home Assistant's non-streaming one has) sees the end instead of waiting for ever. The model runs
on one thread of its own, one utterance at a time, so the event loop keeps serving; a client that disconnects
stops its utterance at the next frame. Its frames run at most ``buffer_s`` seconds of audio ahead of what the client
reads (so a client that reads slowly, or not at all, holds the model only in utterances longer than that), and a
client that reads nothing for ``DEFAULTS.server.stall_s`` seconds is dropped: its utterance stopped, its connection
reset, one line logged. At most ``max_connections`` clients are connected at once (each holds at most ``buffer_s``
of audio); one more gets a ``busy`` error. Misbehaving clients' warnings are logged at most ten a minute.
On a stop (SIGTERM, SIGINT, SIGHUP) no connection is taken and idle ones are closed; an answer running gets
``shutdown_s`` seconds to end whole, then an ``error`` event (``shutting_down``) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from ..audio import encode_speech
from ..errors import Audio8Error, ConfigError, NoAudio, PromptError, ProtocolError
from ..request import CheckedRequest, check_seed
from ..settings import DEFAULTS
from ..text import check_text
from ..text.split import block_starts, complete_sentences, split_checked, with_line_breaks
from ..voices import Voice
from .connections import reset
from .wyoming_events import parse, read_event, refusal
from .wyoming_speaker import NotReading, Speaker

log = logging.getLogger(__name__)

STOPPING = Error(text="the server is shutting down: send it again once it is back", code="shutting_down")
SAMPLE_WIDTH = 2  # bytes: 16-bit signed little-endian PCM
CHANNELS = 1


class _Audio:
    """The audio events of one answer: ``audio-start`` before the first samples, chunks with their timestamps
    (milliseconds from the start), ``audio-stop``."""

    def __init__(self, write: Callable[[Event], Awaitable[None]], sample_rate: int):
        self.write, self.rate, self.samples = write, sample_rate, 0

    async def send(self, audio: np.ndarray) -> None:
        if not self.samples:
            await self.write(AudioStart(rate=self.rate, width=SAMPLE_WIDTH, channels=CHANNELS).event())
        data = encode_speech(audio, self.rate, "pcm")
        stamp = self.samples * 1000 // self.rate
        self.samples += len(audio)
        await self.write(
            AudioChunk(rate=self.rate, width=SAMPLE_WIDTH, channels=CHANNELS, audio=data, timestamp=stamp).event()
        )

    async def stop(self) -> None:
        await self.write(AudioStop(timestamp=self.samples * 1000 // self.rate).event())


@dataclass
class _Stream:
    """An open streaming request: its voice, its seed (every sentence's), the text not yet spoken, its audio, and
    the sentences tried so far."""

    voice: Voice | None
    seed: int
    audio: _Audio
    pending: str = ""
    tried: int = 0


def _parts(text: str, cap: int) -> list[str]:
    """``text`` cut into parts of at most ``cap`` characters (:func:`..text.split.split_checked`), each keeping a
    line break before its list items (:func:`..text.split.with_line_breaks`: its own split then starts pieces
    there); raises PromptError (no words) or ConfigError (a run of over ``cap`` characters with nowhere to cut)."""
    cleaned, breaks = check_text(text), block_starts(text)
    try:
        return with_line_breaks(split_checked(cleaned, cap, len, breaks), breaks)
    except PromptError:
        raise ConfigError(
            f"text holds a run of over {cap} characters with no sentence end, clause mark or space to cut it at, "
            f"and this server speaks at most {cap} at once: add punctuation or spaces",
            "text",
        ) from None


class _Throttled:
    """A logger's warnings about clients, at most ``per_minute`` in a minute's window; those held back are counted in
    a line of their own before the next window's first (thousands of misbehaving connections give a few lines)."""

    def __init__(self, logger: logging.Logger, per_minute: int = 10):
        self._log, self._per_minute = logger, per_minute
        self._window, self._said, self._held = -math.inf, 0, 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window >= 60:
            if self._held:
                self._log.warning(
                    "%d more warnings about wyoming clients were not logged (at most %d a minute)",
                    self._held,
                    self._per_minute,
                )
            self._window, self._said, self._held = now, 0, 0
        if self._said >= self._per_minute:
            self._held += 1
            return
        self._said += 1
        self._log.warning(message, *args)


class Doors:
    """The connections open at once, at most ``cap`` (``max_connections``): past it one is refused as busy;
    connections' warnings go through one :class:`_Throttled` log."""

    def __init__(self, cap: int):
        self.cap, self.open = cap, 0
        self.log = _Throttled(log)
        self.busy = (
            f"this server has its most connections open ({cap}): try again shortly, or raise its max_connections "
            "(AUDIO8_WYOMING__MAX_CONNECTIONS)"
        )

    def enter(self) -> bool:
        """Whether a new connection may be served (then counted open until :meth:`leave`)."""
        if self.open >= self.cap:
            self.log.warning("refused a wyoming client: %d connections open, the most (max_connections)", self.open)
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class WyomingHandler(AsyncEventHandler):
    """One client connection: answers its events in order (see the module's docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, speaker: Speaker, doors: Doors):
        super().__init__(reader, writer)
        self.speaker, self.doors = speaker, doors
        self.stream: _Stream | None = None
        self.answering = False  # an event is being answered (a synthesis, queued or speaking)
        self._stopping = False  # the server stops: no new answer is begun
        self._cut = False  # the server stops: the answer running was cancelled, an error event then ends it

    @property
    def busy(self) -> bool:
        """An answer is under way: an event being answered, or a stream open (its chunks still to come)."""
        return self.answering or self.stream is not None

    async def stop(self) -> None:
        """Stop after the answer under way, if one is (:meth:`cut` ends it sooner); an idle connection at once."""
        self._stopping = True
        if not self.busy:
            self.reader.feed_eof()

    def cut(self, task: asyncio.Task) -> None:
        """End the answer running in ``task`` (this connection's) now, with a ``shutting_down`` error event."""
        self._cut = True
        task.cancel()

    async def run(self) -> None:
        """Answer the client's events until it closes, one refuses, or :meth:`stop` (after the answer under way):
        the package's loop, with each event read under the byte and idle bounds (:func:`.wyoming_events.read_event`);
        an event that breaks them or the format is answered with an ``error`` event and logged in one line, and the
        connection closed. A connection past ``max_connections`` gets a ``busy`` error and is closed at once."""
        if not self.doors.enter():
            with contextlib.suppress(ConnectionError, NotReading):
                await self.write_event(Error(text=self.doors.busy, code="busy").event())
            self.writer.close()
            return
        try:
            while not (self._stopping and not self.busy):
                try:
                    event = await read_event(
                        self.reader, self.speaker.settings.max_event_bytes, self.speaker.settings.idle_s
                    )
                except ProtocolError as e:
                    if self._stopping:  # the stop's end of input cut an event the client was sending: not its fault
                        answer = STOPPING
                    else:
                        self.doors.log.warning("wyoming client refused: %s", e)
                        answer = refusal(e)
                    with contextlib.suppress(ConnectionError):
                        await self.write_event(answer.event())
                    break
                self.answering = True
                try:
                    if event is None or not await self.handle_event(event):
                        break
                finally:
                    self.answering = False
        except asyncio.CancelledError:
            if not self._cut:
                raise
            with contextlib.suppress(ConnectionError, NotReading, TimeoutError):
                await asyncio.wait_for(self.write_event(STOPPING.event()), 1.0)
        except NotReading:
            self.doors.log.warning("dropped a wyoming client: it read nothing for %g s", DEFAULTS.server.stall_s)
            reset(self.writer.transport)  # what it was not reading is discarded, not held for it
        finally:
            self.doors.leave()
            await self.disconnect()
            self.writer.close()

    async def write_event(self, event: Event) -> None:
        """Send ``event``, waiting while the client reads slowly; raises NotReading when it takes nothing for
        ``DEFAULTS.server.stall_s`` seconds (a full socket would otherwise hold the connection and its audio for
        ever)."""
        try:
            await asyncio.wait_for(super().write_event(event), DEFAULTS.server.stall_s)
        except TimeoutError:
            raise NotReading from None

    async def handle_event(self, event: Event) -> bool:
        try:
            if Describe.is_type(event.type):
                await self.write_event(self.speaker.info().event())
            elif Synthesize.is_type(event.type):
                if self.stream is None:  # else the copy a streaming client sends for servers that do not stream
                    await self._synthesize(parse(event, Synthesize))
            elif SynthesizeStart.is_type(event.type):
                start = parse(event, SynthesizeStart)
                if self.stream is not None:  # a new stream in an open one: the open one ends first, whole
                    await self._finish()
                voice = self.speaker.voice(start.voice.name if start.voice else None)
                audio = _Audio(self.write_event, self.speaker.tts.sample_rate)
                self.stream = _Stream(voice, check_seed(self.speaker.seed(voice)), audio)
            elif SynthesizeChunk.is_type(event.type):
                await self._add(parse(event, SynthesizeChunk).text)
            elif SynthesizeStop.is_type(event.type):
                await self._finish()
        except NotReading:
            raise
        except ConnectionError:  # the client has gone: nothing to tell it
            return False
        except Audio8Error as e:
            await self.write_event(refusal(e).event())
            return False
        except Exception as e:  # a bug: its traceback goes to the server's log, not to the client
            log.exception("synthesis failed")
            failed = f"synthesis failed ({type(e).__name__}): the server's log has the details"
            await self.write_event(Error(text=failed, code="server_error").event())
            return False
        return True

    async def _synthesize(self, request: Synthesize) -> None:
        if not isinstance(request.text, str):
            raise ProtocolError(f"synthesize's text must be a string, got {type(request.text).__name__}")
        voice = self.speaker.voice(request.voice.name if request.voice else None)
        cap, seed = self.speaker.settings.max_input_chars, self.speaker.seed(voice)
        parts = [request.text]
        if len(request.text) > cap:  # in parts, as a stream's sentences, one speaker (one seed) for them all
            parts, seed = _parts(request.text, cap), check_seed(seed)
        checked = [self.speaker.check(part, voice, seed) for part in parts]  # each refused before any audio
        audio = _Audio(self.write_event, self.speaker.tts.sample_rate)
        for part in checked:
            await self._say(part, audio)
        if not audio.samples:
            raise NoAudio(
                "the model ended the utterance at once (eos on its first frame): no audio to send; "
                "send it again (with another --seed, if the server has one)"
            )
        await audio.stop()

    async def _add(self, text: str) -> None:
        """Add streamed ``text``; speak each sentence it completes."""
        if self.stream is None:
            raise ProtocolError("synthesize-chunk without synthesize-start: start a stream first")
        if not isinstance(text, str):
            raise ProtocolError(f"synthesize-chunk's text must be a string, got {type(text).__name__}")
        sentences, self.stream.pending = complete_sentences(self.stream.pending + text)
        for sentence in sentences:
            await self._say_streamed(sentence)
        if len(self.stream.pending) > self.speaker.settings.max_input_chars:
            raise ConfigError(
                f"over {self.speaker.settings.max_input_chars} characters streamed without a sentence end: "
                "end sentences with punctuation",
                "text",
            )

    async def _say_streamed(self, sentence: str) -> None:
        """Speak one sentence of the open stream."""
        stream = self.stream
        checked = self.speaker.check(sentence, stream.voice, stream.seed)
        stream.tried += 1
        await self._say(checked, stream.audio)

    async def _say(self, checked: CheckedRequest, audio: _Audio) -> None:
        """Speak ``checked`` into ``audio``, after the stream's pause when audio came before it."""
        pause = np.zeros(round(DEFAULTS.speech.pause_s * audio.rate), np.float32)
        before = audio.samples

        async def send(chunk: np.ndarray) -> None:
            if before and audio.samples == before:
                await audio.send(pause)
            await audio.send(chunk)

        await self.speaker.speak(checked, send)

    async def _finish(self) -> None:
        """Speak what is left of the open stream, then ``audio-stop`` and ``synthesize-stopped``; a stream that held no
        words (an assistant's empty reply) is only ``synthesize-stopped``, as a stream of nothing to say."""
        stream = self.stream
        if stream is None:
            raise ProtocolError("synthesize-stop without synthesize-start: start a stream first")
        try:
            rest = check_text(stream.pending)
        except PromptError:
            rest = None  # punctuation after the last sentence, or a stream that held no words (an empty reply)
        if rest is not None:
            await self._say_streamed(rest)
        if stream.tried and not stream.audio.samples:
            raise NoAudio(
                "the model ended each sentence at once (eos on its first frame): no audio to send; "
                "send it again (with another --seed, if the server has one)"
            )
        if stream.audio.samples:
            await stream.audio.stop()
        self.stream = None
        await self.write_event(SynthesizeStopped().event())
