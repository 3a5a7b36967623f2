"""The Wyoming server's model side (:mod:`.wyoming`): one :class:`.tts.TTS` behind one model thread, its ``info``
answer, the voice, seed and checks of a request, and an utterance spoken into a bounded per-connection buffer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from wyoming.info import Attribution, Info, TtsProgram, TtsVoice

from .. import __version__
from ..checkpoint import DEFAULT_MODEL
from ..errors import ConfigError, VoiceError
from ..request import CheckedRequest, check_request
from ..settings import DEFAULTS, WyomingSettings
from ..text import LANGUAGES
from ..tts import TTS
from ..voices import Voice
from .relay import Cancelled, Relay, Stalled

log = logging.getLogger(__name__)

_ATTRIBUTION = Attribution(name="Audio8", url=f"https://huggingface.co/{DEFAULT_MODEL}")


class NotReading(Exception):
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
            description=f"{self.tts.checkpoint.name} (audio8-coreai {__version__})",
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
        it is made, at most ``settings.buffer_s`` seconds of audio ahead of it (:class:`.relay.Relay`; so a client
        that reads slowly, or not at all, holds the model thread only for utterances longer than that); returns the
        frames made. Its plan's language warning goes to the log. Raises what :meth:`.tts.TTS.plan` and
        :meth:`.tts.TTS.stream` raise; leaving early (an error in ``send``, a cancelled task) stops the utterance at
        its next frame."""
        held = round(self.settings.buffer_s * self.tts.sample_rate)
        relay = Relay(asyncio.get_running_loop(), held, DEFAULTS.server.stall_s, per_sample=True)

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
            raise NotReading from None
        if item.error is not None:
            raise item.error
        return item.frames

    async def close(self) -> None:
        """Drop queued utterances, stop the running one at its next frame and wait for the model thread to end."""
        for relay in self._live:
            relay.stop()
        await asyncio.get_running_loop().run_in_executor(None, lambda: self._pool.shutdown(cancel_futures=True))


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
