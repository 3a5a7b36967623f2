"""THE weights-free check of a request (text, voice, sampling, seed, frame cap, chunks): the CLI runs it before
loading a model, the servers before taking a worker, the keyword API on every call; :meth:`.tts.TTS.plan` then
takes the checked request, never unpacked or checked again."""

from __future__ import annotations

import dataclasses
import inspect
import numbers
import secrets
from dataclasses import dataclass
from pathlib import Path

from .config import GenerationConfig
from .errors import Audio8Error, ConfigError, EngineError, PromptError, VoiceError
from .settings import DEFAULTS
from .text import check_text
from .text.split import block_starts
from .values import check_int, check_number
from .voices import Voice, check_name, check_voice_choice

MAX_SEED = 2**53 - 1
"""The largest seed taken: the largest whole number every JSON client (JavaScript's Number included) reads exactly,
so a seed told back (the ``X-Seed`` header, the CLI's summary) replays the same audio from any client."""


def check_seed(seed: int | None) -> int:
    """``seed``, or a fresh one (0 .. 2**31 - 1) when None; raises ConfigError unless a whole number from 0 to
    :data:`MAX_SEED`."""
    if seed is None:
        return secrets.randbelow(2**31)
    seed = check_int(seed, "seed", minimum=0)
    if seed > MAX_SEED:
        raise ConfigError(f"seed must be at most {MAX_SEED} (2**53 - 1), got {seed}: use a smaller one", "seed")
    return seed


@dataclass(frozen=True)
class CheckedRequest:
    """A request that passed :func:`check_request`: cleaned ``text``, the voice asked for (a checked name, a
    :class:`Voice`, or a one-off clip ``ref_audio`` with its cleaned ``ref_text``), the ``seed`` (drawn when none
    was given), sampling overrides (None: the checkpoint's), the frame cap (None: the model's budget) and the
    stream's chunk sizes in frames; ``breaks``: where the text's blocks (paragraphs, list items) began, in ``text``
    (:func:`.text.split.block_starts`: a long text's pieces start there, never end with an item's number)."""

    text: str
    voice: str | Voice | None
    ref_audio: str | Path | None
    ref_text: str | None
    seed: int
    temperature: float | None
    top_k: int | None
    top_p: float | None
    max_frames: int | None
    chunk_frames: int
    first_chunk_frames: int | None
    breaks: tuple[int, ...] = ()


def check_request(
    text: str,
    *,
    voice: str | Voice | None = None,
    ref_audio: str | Path | None = None,
    ref_text: str | None = None,
    seed: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    max_frames: int | None = None,
    chunk_frames: int | None = None,
    first_chunk_frames: int | None = None,
    text_field: str = "text",
) -> CheckedRequest:
    """Check a request without weights, files or a tokenizer, before a model is loaded or a worker taken; return
    its normalised values (:class:`CheckedRequest`). What needs the checkpoint (the prompt's fit in the context,
    a stored voice's file and checkpoint) is decided once by :meth:`.tts.TTS.plan`.

    Raises PromptError (no words to speak in ``text`` or ``ref_text``), VoiceError (a voice and a clip both, a
    clip without its transcript, a bad voice name), ConfigError naming the setting (sampling settings out of
    range, as ``generation_config.json``'s rules; ``seed`` < 0; ``max_frames`` < 1; ``chunk_frames`` < 1 (None:
    ``DEFAULTS.speech.chunk_frames``); ``first_chunk_frames`` outside 1 to ``chunk_frames``; any of them not a number
    of the right kind). ``text_field``: what the errors call the text (the HTTP body's ``input``).
    """
    cleaned = check_text(text, text_field, text_field)
    check_voice_choice(voice, ref_audio, ref_text)
    if ref_audio is not None:
        ref_text = check_text(ref_text, "reference text", "ref_text")
    elif isinstance(voice, str):
        voice = check_name(voice)
    elif voice is not None and not isinstance(voice, Voice):
        raise VoiceError(f"voice must be a name or a Voice, got {type(voice).__name__}")
    gen = sampling_config(GenerationConfig(), temperature, top_k, top_p)  # the overrides against the publisher's rules
    if max_frames is not None:
        max_frames = check_int(max_frames, "max_frames")
    chunk_frames = DEFAULTS.speech.chunk_frames if chunk_frames is None else chunk_frames
    chunk_frames, first_chunk_frames = check_chunks(chunk_frames, first_chunk_frames)
    return CheckedRequest(
        cleaned,
        voice,
        ref_audio,
        ref_text,
        check_seed(seed),
        None if temperature is None else gen.temperature,
        None if top_k is None else gen.top_k,
        None if top_p is None else gen.top_p,
        max_frames,
        chunk_frames,
        first_chunk_frames,
        block_starts(text),
    )


REQUEST_KEYWORDS = tuple(
    name
    for name, p in inspect.signature(check_request).parameters.items()
    if p.kind is p.KEYWORD_ONLY and name != "text_field"
)
"""What a request sets beside its text (:func:`check_request`'s keywords; the keyword API's)."""


def check_batch(texts: object, seeds: object) -> list[int | None]:
    """The seeds of a batch of ``texts`` (:meth:`.tts.TTS.generate_batch`): ``seeds`` as a list, or one None (drawn)
    per text when None. Raises ConfigError when ``texts`` is no list or tuple (one string, a set, a generator) or
    ``seeds`` is not a list of one seed per text."""
    if isinstance(texts, str):  # a str is a sequence too: its characters would become texts
        raise ConfigError(
            "texts must be a list of strings, not one string: use generate() for one text, or generate_batch([text])",
            "texts",
        )
    if not isinstance(texts, (list, tuple)):  # a set or dict has no order to keep; a generator no length
        raise ConfigError(f"texts must be a list of strings, got {type(texts).__name__}", "texts")
    if seeds is None:
        return [None] * len(texts)
    if not isinstance(seeds, (list, tuple)) or len(seeds) != len(texts):
        shown = repr(seeds) if len(repr(seeds)) <= 80 else f"{repr(seeds)[:77]}..."
        said = f"{len(texts)} texts but seeds {shown}: give a list of one seed per text (or none)"
        raise ConfigError(said, "seeds")
    return list(seeds)


def in_batch(error: PromptError | EngineError | ConfigError, index: int) -> Audio8Error:
    """``error`` about text ``index`` of a batch, said first: ``texts[i]: ...`` for a text refused (PromptError) or
    whose prompt leaves too little room for the frames asked (EngineError), ``seeds[i]: ...`` for its seed
    (ConfigError of ``seed``); any other setting is the whole batch's, unchanged."""
    if isinstance(error, ConfigError):
        if error.field == "seed":
            error.args = (f"seeds[{index}]: {error}",)
    else:
        error.args = (f"texts[{index}]: {error}",)
    return error


def check_chunks(chunk_frames: int, first_chunk_frames: int | None) -> tuple[int, int | None]:
    """The chunk sizes as ints; ConfigError (``field`` the wrong one) unless whole numbers with ``chunk_frames`` >= 1
    and ``first_chunk_frames`` None or 1 to ``chunk_frames``. Named as ``audio8 say`` and ``serve`` set them."""

    def whole(value: object) -> bool:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if not whole(chunk_frames) or chunk_frames < 1:
        wrong = "chunk_frames"
    elif first_chunk_frames is not None and (
        not whole(first_chunk_frames) or not 1 <= first_chunk_frames <= chunk_frames
    ):
        wrong = "first_chunk_frames"
    else:
        return int(chunk_frames), None if first_chunk_frames is None else int(first_chunk_frames)
    raise ConfigError(
        f"--chunk-frames must be >= 1 and --first-chunk-frames 1 to --chunk-frames (whole numbers; chunk_frames and "
        f"first_chunk_frames through the API); got {chunk_frames!r} and "
        f"{'the default' if first_chunk_frames is None else repr(first_chunk_frames)}",
        wrong,
    )


def sampling_config(
    gen: GenerationConfig, temperature: float | None, top_k: int | None, top_p: float | None
) -> GenerationConfig:
    """``gen`` with the given overrides; raises ConfigError (its ``field`` the setting) for a wrong type or a value
    out of range (:meth:`.config.GenerationConfig.check`)."""
    over = {}
    if temperature is not None:
        over["temperature"] = check_number(temperature, "temperature")
    if top_k is not None:
        over["top_k"] = check_int(top_k, "top_k")
    if top_p is not None:
        over["top_p"] = check_number(top_p, "top_p")
    gen = dataclasses.replace(gen, **over)
    gen.check("sampling settings")
    return gen


def check_callback(name: str, value: object) -> object:
    """``value`` of the callback keyword ``name`` (``on_frame``, ``on_start``): a callable or None. Raises
    ConfigError before any frame (a number failed after the prefill, as "'int' object is not callable")."""
    if value is None or callable(value):
        return value
    raise ConfigError(f"{name} must be a function or None, not {type(value).__name__}", name)
