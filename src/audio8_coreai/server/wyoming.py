"""Home Assistant's Wyoming protocol (TCP; JSON lines, PCM after them) over the TTS API: ``audio8 wyoming``.

Events served (the ``wyoming`` package's own classes, its :class:`AsyncServer` and :class:`AsyncEventHandler`):

* ``describe`` -> ``info``: one TTS program whose voices are the model's own voice (listed as
  the settings' ``voice``) and the stored voices made with this checkpoint, each speaking :data:`LANGUAGES`; a
  voice's description, which Home Assistant shows as its name, is its name and then what it is
  (``ana: cloned from a 3.3 s clip``).
* ``synthesize`` -> ``audio-start`` (44.1 kHz, 16-bit, mono: the model's rate), ``audio-chunk`` as the audio is
  made (chunks of :meth:`.tts.TTS.stream`), ``audio-stop``.
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
stops its utterance at the next frame. Its frames run at most ``DEFAULTS.server.stream_buffer_chunks`` chunks ahead of
what the client reads, and a client that reads nothing for ``DEFAULTS.server.stall_s`` seconds is dropped: its utterance
stopped, its connection reset, one line logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from .. import __version__
from ..audio import encode_speech
from ..checkpoint import DEFAULT_MODEL
from ..errors import Audio8Error, ConfigError, NoAudio, PromptError, ProtocolError, VoiceError
from ..request import CheckedRequest, check_request, check_seed
from ..settings import DEFAULTS, WyomingSettings
from ..text import LANGUAGES, check_text
from ..text.split import complete_sentences
from ..tts import TTS
from ..voices import Voice
from .connections import reset
from .relay import Cancelled, Relay, Stalled
from .wyoming_events import parse, read_event, refusal

log = logging.getLogger(__name__)

SAMPLE_WIDTH = 2  # bytes: 16-bit signed little-endian PCM
CHANNELS = 1
_ATTRIBUTION = Attribution(name="Audio8", url=f"https://huggingface.co/{DEFAULT_MODEL}")


class _NotReading(Exception):
    """The client read nothing for ``DEFAULTS.server.stall_s`` seconds: its connection is reset (its utterance
    stopped)."""


@dataclass
class _End:
    """The last item of an utterance's queue: the frames it made, or the error that stopped it."""

    frames: int = 0
    error: BaseException | None = None


class Speaker:
    """One :class:`.tts.TTS` behind one model thread: utterances queue for it and run one at a time, served as
    ``settings`` says (:class:`..settings.WyomingSettings`: ``DEFAULTS.wyoming`` with the command's options)."""

    def __init__(self, tts: TTS, settings: WyomingSettings):
        self.tts = tts
        self.settings = settings
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="audio8-wyoming")
        self._live: set[Relay] = set()  # the relays of utterances given to the model thread

    def info(self) -> Info:
        """The ``info`` answer: the model's own voice, then the stored voices this checkpoint can speak in."""
        store, fingerprint = self.tts.voices, self.tts.checkpoint.fingerprint()
        voices = [_voice(self.settings.voice, "the model's own voice")]
        for name in store.names():
            try:
                stored = store.load(name, fingerprint)
            except VoiceError:  # damaged, or made with another checkpoint: it could not speak
                continue
            if name != self.settings.voice:  # the own voice's name means the model's own voice
                voices.append(_voice(name, f"cloned from a {stored.duration_s:.1f} s clip"))
        program = TtsProgram(
            name="audio8",
            attribution=_ATTRIBUTION,
            installed=True,
            description=f"Audio8-TTS-Preview-0.6b (audio8-coreai {__version__})",
            version=__version__,
            voices=voices,
            supports_synthesize_streaming=True,
        )
        return Info(tts=[program])

    def voice(self, name: str | None) -> Voice | None:
        """The voice a request names: None for no name or the own voice's name, else the stored voice (raises
        VoiceError when there is none of that name, or it cannot be read or belongs to another checkpoint)."""
        if name is None or name == self.settings.voice:
            return None
        if self.tts.voices.find(name) is None:
            raise VoiceError(
                f"no voice named {name!r}: describe lists the voices (the model's own is {self.settings.voice!r})"
            )
        return self.tts.voices.load(name, self.tts.checkpoint.fingerprint())

    def seed(self, voice: Voice | None) -> int | None:
        """The seed of a request in ``voice``: the server's ``--seed``; else, in the model's own voice,
        DEFAULTS.server.default_voice_seed (one steady speaker, as the HTTP server's default voice); else None
        (drawn)."""
        if self.settings.seed is None and voice is None:
            return DEFAULTS.server.default_voice_seed
        return self.settings.seed

    def check(self, text: str, voice: Voice | None, seed: int | None) -> CheckedRequest:
        """``text`` in ``voice`` checked as every request is (:func:`...request.check_request`) and against the
        input cap; raises ConfigError (too long) or what check_request raises."""
        if len(text) > self.settings.max_input_chars:
            raise ConfigError(
                f"text is {len(text)} characters; this server speaks at most {self.settings.max_input_chars} "
                "per request (or per sentence, streamed): split the text",
                "text",
            )
        return check_request(
            text,
            voice=voice,
            seed=seed,
            temperature=self.settings.temperature,
            top_k=self.settings.top_k,
            top_p=self.settings.top_p,
        )

    async def speak(self, checked: CheckedRequest, send: Callable[[np.ndarray], Awaitable[None]]) -> int:
        """Speak ``checked`` on the model thread, awaiting ``send(chunk)`` (float32 [n], 44.1 kHz) for each chunk as
        it is made, at most ``DEFAULTS.server.stream_buffer_chunks`` chunks ahead of it (:class:`.relay.Relay`: the
        frames wait for a client that reads slowly); returns the frames made. Its plan's language warning goes to the
        log. Raises what :meth:`.tts.TTS.plan` and :meth:`.tts.TTS.stream` raise;
        leaving early (an error in ``send``, a cancelled task) stops the utterance at its next frame."""
        relay = Relay(asyncio.get_running_loop(), DEFAULTS.server.stream_buffer_chunks, DEFAULTS.server.stall_s)

        def job() -> None:
            try:
                if relay.stopped.is_set():
                    return
                plan = self.tts.plan(checked, frame_cap=self.settings.max_frames)
                if plan.warning:
                    log.warning("wyoming: %s", plan.warning)
                stream = self.tts.stream(plan, on_frame=lambda step: relay.check())
                for chunk in stream:
                    relay.put(chunk)
                relay.put(_End(stream.frames))
            except Cancelled:
                pass  # the connection has stopped reading the utterance: nobody reads on
            except BaseException as e:  # Stalled included:  # handed to the connection, which says it as an error event
                relay.put(_End(error=e))

        self._live.add(relay)
        asyncio.get_running_loop().run_in_executor(self._pool, job)
        try:
            while not isinstance(item := await relay.get(), _End):
                await send(item)
        finally:
            relay.stop()
            self._live.discard(relay)
        if isinstance(item.error, Stalled):
            raise _NotReading from None
        if item.error is not None:
            raise item.error
        return item.frames

    async def close(self) -> None:
        """Drop queued utterances, stop the running one at its next frame and wait for the model thread to end."""
        for relay in self._live:
            relay.stop()
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._pool.shutdown(cancel_futures=True))


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


def _voice(name: str, what: str) -> TtsVoice:
    """The voice ``name`` as ``info`` lists it: described as ``NAME: WHAT`` (Home Assistant shows the description as
    the voice's name, so each stays distinct), speaking :data:`LANGUAGES` (ISO 639-1 codes)."""
    return TtsVoice(
        name=name,
        attribution=_ATTRIBUTION,
        installed=True,
        description=f"{name}: {what}",
        version=None,
        languages=list(LANGUAGES),
    )


class WyomingHandler(AsyncEventHandler):
    """One client connection: answers its events in order (see the module's docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, speaker: Speaker):
        super().__init__(reader, writer)
        self.speaker = speaker
        self.stream: _Stream | None = None

    async def run(self) -> None:
        """Answer the client's events until it closes, one refuses, or :meth:`stop`: the package's loop, with each
        event read under the byte and idle bounds (:func:`.wyoming_events.read_event`); an event that breaks them
        or the format is answered with an ``error`` event and logged in one line, and the connection closed."""
        self._is_running = True
        try:
            while self._is_running:
                try:
                    event = await read_event(
                        self.reader, self.speaker.settings.max_event_bytes, self.speaker.settings.idle_s
                    )
                except ProtocolError as e:
                    log.warning("wyoming client refused: %s", e)
                    with contextlib.suppress(ConnectionError):
                        await self.write_event(refusal(e).event())
                    break
                if event is None or not await self.handle_event(event):
                    break
        except _NotReading:
            log.warning("dropped a wyoming client: it read nothing for %g s", DEFAULTS.server.stall_s)
            reset(self.writer.transport)  # what it was not reading is discarded, not held for it
        finally:
            await self.disconnect()
            self.writer.close()

    async def write_event(self, event: Event) -> None:
        """Send ``event``, waiting while the client reads slowly; raises _NotReading when it takes nothing for
        ``DEFAULTS.server.stall_s`` seconds (a full socket would otherwise hold the connection and its audio for
        ever)."""
        try:
            await asyncio.wait_for(super().write_event(event), DEFAULTS.server.stall_s)
        except TimeoutError:
            raise _NotReading from None

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
        except _NotReading:
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
        checked = self.speaker.check(request.text, voice, self.speaker.seed(voice))
        audio = _Audio(self.write_event, self.speaker.tts.sample_rate)
        if not await self.speaker.speak(checked, audio.send):
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
            await self._say(sentence)
        if len(self.stream.pending) > self.speaker.settings.max_input_chars:
            raise ConfigError(
                f"over {self.speaker.settings.max_input_chars} characters streamed without a sentence end: "
                "end sentences with punctuation",
                "text",
            )

    async def _say(self, sentence: str) -> None:
        """Speak one sentence of the open stream, after the stream's pause when audio came before it."""
        stream = self.stream
        checked = self.speaker.check(sentence, stream.voice, stream.seed)
        stream.tried += 1
        pause = np.zeros(round(DEFAULTS.speech.pause_s * stream.audio.rate), np.float32)
        before = stream.audio.samples

        async def send(chunk: np.ndarray) -> None:
            if before and stream.audio.samples == before:
                await stream.audio.send(pause)
            await stream.audio.send(chunk)

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
            await self._say(rest)
        if stream.tried and not stream.audio.samples:
            raise NoAudio(
                "the model ended each sentence at once (eos on its first frame): no audio to send; "
                "send it again (with another --seed, if the server has one)"
            )
        if stream.audio.samples:
            await stream.audio.stop()
        self.stream = None
        await self.write_event(SynthesizeStopped().event())


async def serve(speaker: Speaker, server: AsyncServer) -> None:
    """Serve ``speaker`` on ``server`` (e.g. ``AsyncTcpServer(host, port)``) until it stops."""
    try:
        await server.run(lambda reader, writer: WyomingHandler(reader, writer, speaker))
    finally:
        await speaker.close()
