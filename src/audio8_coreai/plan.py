"""A checked request made ready to speak on one model, once: :class:`Plan`, made by :meth:`.tts.TTS.plan`.

:func:`.request.check_request` checks what needs no weights (the CLI before loading a model, the servers before
taking a worker); :func:`make_plan` then does what needs the model's tokenizer, context and generation config: the
text cut into pieces, each piece's prompt and frame cap, the token count, the sampling settings. Nothing downstream
(generate, stream, the frame loop) checks the request again.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass

from .config import GenerationConfig, ModelConfig, SamplingParams
from .engine.loop import frame_budget
from .engine.stream import Piece
from .errors import DamagedVoice, EngineError, PromptError
from .request import CheckedRequest
from .settings import DEFAULTS
from .text import PromptBuilder, language_warning
from .text.prompt import PromptHead
from .text.split import split_checked
from .values import check_int
from .voices import Voice


@dataclass(frozen=True)
class Plan:
    """What a checked request is, decided once against one model (:meth:`.tts.TTS.plan`); ``generate``, ``stream``,
    ``synthesize`` and ``generate_batch`` speak it as it is.

    ``text``: the cleaned text; ``voice``: the voice it is spoken in, read and checked against the checkpoint (None:
    the model's own); ``pieces``: its utterances in order (:class:`.engine.stream.Piece`: text, prompt int64 [1+C, P],
    frame cap), one unless the text was split; ``params``: the checkpoint's sampling settings with the request's
    overrides; ``seed``; ``tokens``: the text's token count (what a server reports as input tokens);
    ``chunk_frames`` and ``first_chunk_frames``: a stream's chunk sizes in frames; ``warning``: one ASCII line when
    the text is not in the model's languages (:func:`.text.language_warning`), else None: the caller tells it (the
    CLI on stderr, the HTTP server in a header, Wyoming in its log, the keyword API as a Python warning);
    ``checkpoint``: the fingerprint of the checkpoint it was made for (its prompts and voice hold for that one alone).
    """

    text: str
    voice: Voice | None
    pieces: tuple[Piece, ...]
    params: SamplingParams
    seed: int
    tokens: int
    chunk_frames: int
    first_chunk_frames: int
    warning: str | None
    checkpoint: str

    @property
    def max_frames(self) -> int:
        """The most frames the plan can make (its pieces' caps together)."""
        return sum(p.max_frames for p in self.pieces)

    def reused(self, fingerprint: str, given: dict[str, object]) -> Plan:
        """This plan, given to speak on the checkpoint of ``fingerprint`` with the keywords ``given`` (name: value);
        raises TypeError when any of them is not None (a plan holds its request), EngineError when it was made for
        another checkpoint (its prompts and voice hold for that one alone)."""
        named = [k for k, v in given.items() if v is not None]
        if named:
            raise TypeError(f"a Plan holds its request: give it alone, or give the text with {', '.join(named)}")
        if self.checkpoint != fingerprint:
            raise EngineError(
                "this plan was made for another checkpoint (its prompts and voice hold for that one alone): "
                "plan the request with this model, tts.plan(check_request(...))"
            )
        return self


def sampling_defaults(generation: GenerationConfig, baked: SamplingParams | None) -> GenerationConfig:
    """The sampling a request that sets none gets: the checkpoint's ``generation``, or the settings a backend's
    graphs bake in (``baked``: Core AI assets converted with other sampling than the checkpoint has now, which is
    all they can draw with). Greedy assets stay refused for speech (the backend says why)."""
    if baked is None or not baked.do_sample:
        return generation
    baked_fields = {"temperature": baked.temperature, "top_k": baked.top_k, "top_p": baked.top_p, "do_sample": True}
    return dataclasses.replace(generation, **baked_fields)


def make_plan(
    checked: CheckedRequest,
    voice: Voice | None,
    prompts: PromptBuilder,
    cfg: ModelConfig,
    generation: GenerationConfig,
    fingerprint: str,
    *,
    split: bool = True,
    frame_cap: int | None = None,
) -> Plan:
    """The plan of ``checked`` spoken in ``voice`` (resolved by the caller), with the tokenizer of ``prompts``, the
    context of ``cfg`` and the defaults of ``generation``, for the checkpoint of ``fingerprint``: see
    :meth:`.tts.TTS.plan`, which raises what this does."""
    ids = _Tokens(prompts)
    try:
        head = prompts.head() if voice is None else prompts.head(voice.transcript, voice.codes)
    except PromptError as e:  # a stored voice whose file passed its checks (a hand-edited one): damaged, by name
        if voice is None or not voice.name:
            raise
        said = f"voice {voice.name!r} is damaged ({e}); remove it (`audio8 voice rm {voice.name}`) and add it again"
        raise DamagedVoice(said, voice.name) from None
    texts = _split(checked, voice is not None, prompts.around(head), cfg, generation, ids) if split else [checked.text]
    default_frames = generation.max_new_tokens
    if frame_cap is not None:
        default_frames = min(default_frames, check_int(frame_cap, "frame_cap"))
    pieces = tuple(_pieces(texts, head, prompts, cfg, checked.max_frames, default_frames, ids))
    overrides = {"temperature": checked.temperature, "top_k": checked.top_k, "top_p": checked.top_p}
    gen = dataclasses.replace(generation, **{k: v for k, v in overrides.items() if v is not None})
    first = checked.first_chunk_frames
    return Plan(
        checked.text,
        voice,
        pieces,
        SamplingParams.from_configs(cfg, gen),  # the overrides were checked by check_request, the rest at load
        checked.seed,
        len(ids(checked.text)),
        checked.chunk_frames,
        min(DEFAULTS.speech.first_chunk_frames, checked.chunk_frames) if first is None else first,
        language_warning(checked.text),
        fingerprint,
    )


class _Tokens:
    """The token ids of the texts of one plan, each text encoded once (the splitter counts, the prompts hold them,
    the frame caps and the server's usage count them)."""

    def __init__(self, prompts: PromptBuilder):
        self.prompts = prompts
        self.seen: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        if text not in self.seen:
            self.seen[text] = self.prompts.encode(text)
        return self.seen[text]


def piece_tokens(overhead: int, cfg: ModelConfig, generation: GenerationConfig) -> int:
    """The most text tokens one piece of a split text holds when the prompt around its text takes ``overhead``
    columns: its tokens and their estimated speech (DEFAULTS.speech.split_frames_per_token frames a token) fit the
    context, and that speech the default frame budget."""
    per_token = DEFAULTS.speech.split_frames_per_token
    return min((cfg.max_seq_len - overhead) // (1 + per_token), generation.max_new_tokens // per_token)


def _split(
    checked: CheckedRequest, cloned: bool, overhead: int, cfg: ModelConfig, generation: GenerationConfig, ids: _Tokens
) -> list[str]:
    """The request's text as the pieces a stream speaks (:func:`.text.split.split_checked`, at its blocks too): each
    one's prompt (``overhead`` columns besides its tokens) plus its estimated speech
    (DEFAULTS.speech.split_frames_per_token frames per text token) fits the context, and its frames the default
    frame budget. Raises PromptError for a run of text that cannot be split to fit."""
    max_tokens = piece_tokens(overhead, cfg, generation)
    if max_tokens < 1:  # said with the numbers, not as a count below 1
        raise PromptError(
            f"no room for text: the prompt around it takes {overhead} of the context's {cfg.max_seq_len} positions "
            "(the checkpoint's max_seq_len, or Core AI assets' --context: convert with a larger one), which leaves "
            "too little for any words and their speech"
            + ("; a voice made from a shorter clip leaves more" if cloned else "")
        )
    try:
        return split_checked(checked.text, max_tokens, lambda words: len(ids(words)), checked.breaks)
    except PromptError as e:
        if not cloned:
            raise
        raise PromptError(
            f"{e}; here the prompt around the text (the voice's reference clip and transcript "
            f"included) takes {overhead} of the context's {cfg.max_seq_len} positions, so a "
            "voice made from a shorter clip leaves room for longer pieces",
            e.field,
        ) from None


def _pieces(
    texts: list[str],
    head: PromptHead,
    prompts: PromptBuilder,
    cfg: ModelConfig,
    max_frames: int | None,
    default_frames: int,
    ids: _Tokens,
) -> Iterator[Piece]:
    """Each of ``texts`` as a Piece: its prompt after ``head`` and its frame cap (:func:`.engine.loop.frame_budget`,
    the text's own cap included). Raises PromptTooLong (a prompt that fills the context) or EngineError (an
    explicit ``max_frames`` that does not fit; of a split text, naming the piece)."""
    for index, words in enumerate(texts):
        build = functools.partial(prompts.build, head, ids(words))
        try:
            budget = frame_budget(cfg, build().shape[1], max_frames, default_frames, len(ids(words)))
        except EngineError as e:
            if len(texts) == 1:
                raise
            start = words if len(words) <= 40 else words[:40] + "..."
            raise EngineError(f"piece {index + 1} of {len(texts)} ({start!r}): {e}", e.field) from None
        yield Piece(words, budget, build)
