"""Voice cloning in the API: a voice from a reference clip, stored voices, the check that a voice leaves room."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from .audio import read_reference
from .backends.base import Backend
from .checkpoint import Checkpoint
from .config import ModelConfig
from .errors import ClipWarning, PromptTooLong, VoiceError
from .plan import piece_tokens
from .request import CheckedRequest
from .settings import DEFAULTS
from .text import PromptBuilder, check_text
from .values import check_switch
from .voices import Voice, VoiceStore, check_name, now_utc

# Fewer text tokens than this a piece (about a sentence) after a voice's prompt: its clip is worth a warning.
FEW_PIECE_TOKENS = 24


def warn_clip(voice: Voice, stacklevel: int) -> None:
    """Tell each of the clip's warnings (``voice.warnings``) as a ClipWarning; ``stacklevel`` as the calling
    function would give it to :func:`warnings.warn` (2: the line that called it)."""
    for said in voice.warnings:
        warnings.warn(said, ClipWarning, stacklevel=stacklevel + 1)


class VoiceCloning:
    """The voice calls of :class:`.tts.TTS` (its ``checkpoint``, ``backend``, ``prompts``, ``config``, ``voices``
    and ``sample_rate``)."""

    checkpoint: Checkpoint
    backend: Backend
    prompts: PromptBuilder
    config: ModelConfig
    voices: VoiceStore
    sample_rate: int

    def voice_from_clip(self, audio: str | Path, text: str, name: str = "") -> Voice:
        """A voice from a reference clip file and its transcript, not stored (see :meth:`register_voice`).

        The clip is read by :func:`.audio.read_reference` (any libsndfile format and rate, mixed to mono,
        resampled to 44.1 kHz, 0.5-30 s; its warnings, and one for a voice whose prompt leaves fewer than
        :data:`FEW_PIECE_TOKENS` text tokens a piece, land in ``Voice.warnings`` and are told as ClipWarnings) and
        encoded by this
        checkpoint's codec into codes int64 [num_codebooks, ceil(N / 2048)].
        Raises AudioError (unusable clip), PromptError (empty transcript), VoiceError (the clone prompt
        would leave fewer than DEFAULTS.speech.min_voice_frames frames of the context; the message gives the numbers).
        """
        voice = self._clip_voice(audio, check_text(text, "reference text", "ref_text"), name)
        warn_clip(voice, stacklevel=2)
        return voice

    def _clip_voice(self, audio: str | Path, transcript: str, name: str = "") -> Voice:
        """:meth:`voice_from_clip` of a checked ``transcript``."""
        samples, info = read_reference(audio)
        self._check_voice_room(-(-len(samples) // self.checkpoint.codec_config.frame_length), transcript)
        codes = self.backend.encode(samples)
        generation = self.checkpoint.generation
        tokens = piece_tokens(self.prompts.around(self.prompts.head(transcript, codes)), self.config, generation)
        if tokens < FEW_PIECE_TOKENS:  # the voice's prompt fills most of the context
            info.warnings.append(
                f"{info.path.name} leaves room for {tokens} tokens of text a piece in this model's context of "
                f"{self.config.max_seq_len} positions (a few words): long texts will be spoken in many short "
                "pieces, with a pause between each; a shorter clip (about 10 s) leaves more"
            )
        return Voice(
            codes,
            transcript,
            info.sample_rate,
            info.duration_s,
            self.checkpoint.fingerprint(),
            now_utc(),
            name,
            str(info.path.resolve()),
            tuple(info.warnings),
            self.config.num_codebooks,
            self.config.codebook_size,
        )

    def register_voice(
        self,
        name: str,
        audio: str | Path,
        text: str,
        *,
        store: VoiceStore | str | Path | None = None,
        replace: bool = False,
        warn: bool = True,
    ) -> Voice:
        """Encode the clip ``audio`` with its transcript ``text`` and save it as voice ``name``.

        ``store``: a VoiceStore or its folder (default :attr:`voices`); ``replace`` overwrites a voice of
        that name (atomically); ``warn`` tells the clip's warnings as ClipWarnings (False: for a caller that says
        ``Voice.warnings`` its own way, as the server does). The name is checked before any work. Returns the stored
        :class:`Voice`.
        Raises VoiceError (bad or taken name, unwritable store, reference too long for the context),
        AudioError, PromptError as :meth:`voice_from_clip`, ConfigError for ``replace`` or ``warn`` not True or
        False.
        """
        warn = check_switch("warn", warn)
        if store is None:
            store = self.voices
        elif not isinstance(store, VoiceStore):
            store = VoiceStore(store)
        name = check_name(name)
        store.check_new(name, replace)
        voice = self._clip_voice(audio, check_text(text, "reference text", "ref_text"), name)
        if warn:
            warn_clip(voice, stacklevel=2)
        store.save(voice, replace=replace)
        return voice

    def _voice(self, checked: CheckedRequest) -> Voice | None:
        """The voice ``checked`` asks for (None: the plain prompt): its clip encoded, or its stored voice read, once,
        and checked against this checkpoint. Raises VoiceError (unknown, damaged or another checkpoint's voice),
        AudioError (an unusable clip)."""
        if checked.ref_audio is not None:
            return self._clip_voice(checked.ref_audio, checked.ref_text)
        if isinstance(checked.voice, str):
            return self.voices.load(checked.voice, self.checkpoint.fingerprint())
        if checked.voice is not None:
            checked.voice.check_checkpoint(self.checkpoint.fingerprint())
        return checked.voice

    def _check_voice_room(self, frames: int, transcript: str) -> None:
        """Raise VoiceError unless the clone prompt for a reference of ``frames`` code frames and a one-word
        text leaves at least DEFAULTS.speech.min_voice_frames frames of ``max_seq_len`` (the slow AR's context holds
        prompt and frames). Checked before encoding, from the sample count: a refusal costs no codec time."""
        # The prompt's length without the reference: the template, the transcript and a one-token target.
        one_frame = np.zeros((self.config.num_codebooks, 1), dtype=np.int64)
        context = self.config.max_seq_len
        try:
            overhead = self.prompts.clone("a", transcript, one_frame).shape[1] - 1
        except PromptTooLong:  # the transcript alone overfills the context
            tokens = len(self.prompts.encode(transcript))
            raise VoiceError(
                f"the reference transcript is too long for this model: {tokens} tokens, while the "
                f"model's context holds {context} positions for the whole prompt (reference and "
                f"transcript included) and at least {DEFAULTS.speech.min_voice_frames} frames of speech; "
                "use a shorter clip (0.5-30 s) with its transcript",
                "ref_text",
            ) from None
        room = context - overhead - frames
        if room >= DEFAULTS.speech.min_voice_frames:
            return
        seconds = self.checkpoint.codec_config.frame_length / self.sample_rate
        longest = max(0, context - overhead - DEFAULTS.speech.min_voice_frames)
        raise VoiceError(
            f"the reference clip is too long for this model: its {frames} frames ({frames * seconds:.1f} "
            f"s) and the {overhead} tokens of prompt text leave {max(room, 0)} of the context's "
            f"{context} positions for speech, under the {DEFAULTS.speech.min_voice_frames} a voice must leave; use a "
            f"clip of at most {longest * seconds:.1f} s (or a shorter transcript)",
            "ref_audio",
        )
