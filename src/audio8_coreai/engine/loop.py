"""THE frame loop: prefill, frame 0, later frames, the RAS push, the next column and the stop rule.

The loop is backend-agnostic: it owns the host-side state the frame takes as inputs (the noise stream and the
RAS window) and the stop rule, exactly as the publisher's ``generate`` loop (SPEC.md section 6): frame t is
sampled from the slow AR's output for column t-1, eos emits no frame and stops, and the RAS window skips the
step-0 token. :class:`Utterance` is that state for one utterance; :func:`frame_steps` drives it on a backend one
step at a time, and every caller (generate, streaming, batching, parity, agreement, bench, the gate) goes through
them (gpt-fast's ``prefill``/``decode_one_token``/``decode_n_tokens`` are the model).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backends.base import Backend, FrameResult, StepInputs
from ..config import ModelConfig, SamplingParams
from ..errors import EngineError
from ..sampling import RasWindow
from ..settings import DEFAULTS
from ..values import check_int
from .noise import NoiseAhead, NoiseLike, seeded_noise


@dataclass
class Utterance:
    """The host side of one utterance's frame loop: ``prompt_length`` (columns), frame cap ``max_frames``, its
    noise stream and RAS window, the frames made so far (``codes``: int64 [C] each) and, once ``done``,
    ``reached_eos`` (False: the cap). ``forced`` (teacher forcing): the column int64 [1+C] kept at each step
    instead of the draws; ``logits``: each step's result carries the logits and hidden (tools).

    Raises EngineError when the prompt and ``max_frames`` frames do not fit the context, ConfigError for a
    ``max_frames`` that is no whole number >= 1: the loop's one guard, for every caller (a planned request's budget
    already fits, :func:`frame_budget`; a tool's prompt may not).
    """

    cfg: ModelConfig
    prompt_length: int
    max_frames: int
    noise: NoiseLike
    forced: Sequence[np.ndarray] | None = None
    logits: bool = False
    window: RasWindow = field(init=False)
    codes: list[np.ndarray] = field(default_factory=list)
    column: np.ndarray | None = None
    done: bool = False
    reached_eos: bool = False

    def __post_init__(self) -> None:
        self.max_frames = check_int(self.max_frames, "max_frames")
        if self.prompt_length + self.max_frames > self.cfg.max_seq_len:
            raise EngineError(
                f"prompt {self.prompt_length} + {self.max_frames} frames exceeds the context {self.cfg.max_seq_len}"
            )
        self.window = RasWindow(self.cfg.ras_window_size)

    @property
    def steps(self) -> int:
        """Frame-loop steps taken (frames made, plus the eos step once it came)."""
        return len(self.codes) + int(self.reached_eos)

    def next_inputs(self) -> StepInputs:
        """The inputs of this utterance's next step (draws its noise)."""
        noise_slow, noise_fast = self.noise.next_frame()
        forced = None if self.forced is None else self.forced[self.steps]
        pos = self.prompt_length + self.steps - 1
        ahead = self.noise.ahead if isinstance(self.noise, NoiseAhead) else None
        return StepInputs(self.column, pos, noise_slow, self.window.current(), noise_fast, forced, self.logits, ahead)

    def record(self, res: FrameResult) -> None:
        """Apply one step's result: the publisher's stop rule, RAS push and next column."""
        if res.semantic == self.cfg.eos_token_id:
            self.reached_eos = self.done = True
            return
        self.codes.append(res.codes)
        self.window.push(res.semantic)
        self.column = np.concatenate([[res.semantic], res.codes])
        self.done = self.steps >= self.max_frames

    def frames(self) -> np.ndarray:
        """The frames made, int64 [C, T]."""
        if not self.codes:
            return np.zeros((self.cfg.num_codebooks, 0), dtype=np.int64)
        return np.stack(self.codes, axis=1)


def frame_steps(backend: Backend, utterance: Utterance, params: SamplingParams) -> Iterator[FrameResult]:
    """The frame loop of ``utterance`` after ``backend.prefill`` of its prompt, one step at a time, each result
    recorded in ``utterance`` (its frames, RAS window, stop rule: what a caller reads when the loop ends).

    Yields each step's :class:`FrameResult` as soon as the backend returns it: frames 0, 1, ... and, when the
    model ends the utterance, the eos step last (its ``semantic`` is ``cfg.eos_token_id`` and its codes are not
    a frame); stops after the utterance's ``max_frames`` steps otherwise. Each step takes one
    ``noise.next_frame()`` (see :class:`Utterance` for forcing and logits). The caller owns the pace (streaming
    decodes between steps) and may stop early by closing the generator; the backend's KV state is then left
    mid-utterance until its next prefill.
    """
    while not utterance.done:
        res = backend.frame(params, utterance.next_inputs())
        utterance.record(res)
        yield res


@dataclass
class Generation:
    """What one frame loop produced.

    ``codes`` int64 [num_codebooks, T] (T frames of 2048 samples), ``reached_eos`` False when the loop
    stopped at the frame cap, ``prompt_length`` in columns, times in seconds.
    """

    codes: np.ndarray
    reached_eos: bool
    prompt_length: int
    max_frames: int
    prefill_s: float = 0.0
    frames_s: float = 0.0
    frame_results: list[FrameResult] = field(default_factory=list, repr=False)

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])


def generate(
    backend: Backend,
    prompt: np.ndarray,
    params: SamplingParams,
    seed: int,
    max_frames: int,
    on_frame: Callable[[int], None] | None = None,
    keep_results: bool = False,
    noise: NoiseLike | None = None,
    forced: Sequence[np.ndarray] | None = None,
    on_codes: Callable[[np.ndarray], None] | None = None,
) -> Generation:
    """Prefill ``prompt`` int64 [1+C, P], then run the frame loop until eos or ``max_frames`` frames.

    Noise comes from ``NoiseSource(seed)`` (one [2, V+1] and one [C-1, codebook_size] uniform draw per step, eos
    step included; drawn ahead where the backend says, :mod:`.noise`), so the same seed gives the same codes.
    ``on_frame(t)`` is called after every step (progress bars). ``keep_results`` keeps every :class:`FrameResult`,
    with its logits (parity, gate).
    ``noise`` replaces the seeded source (parity replays recorded uniforms); ``forced`` as :func:`frame_steps`.
    ``on_codes(codes)`` gets each frame's codes int64 [C] as it is made (a decode beside the loop).
    Holds the backend's lease for the whole call. Raises EngineError when the prompt and frames do not fit.
    """
    cfg, p_len = backend.cfg, check_prompt(backend.cfg, prompt)
    noise = seeded_noise(backend, seed) if noise is None else noise
    utterance = Utterance(cfg, p_len, max_frames, noise, forced, keep_results)
    results: list[FrameResult] = []
    with backend.lease.hold():  # other threads' utterances on this backend wait; a paused stream is overtaken
        t0 = time.perf_counter()
        backend.prefill(prompt)
        t1 = time.perf_counter()
        for n, res in enumerate(frame_steps(backend, utterance, params)):
            if keep_results:
                results.append(res)
            if on_frame is not None:
                on_frame(n)
            if on_codes is not None and res.semantic != cfg.eos_token_id:
                on_codes(res.codes)
    frames_s = time.perf_counter() - t1
    return Generation(utterance.frames(), utterance.reached_eos, p_len, max_frames, t1 - t0, frames_s, results)


def check_prompt(cfg: ModelConfig, prompt: object) -> int:
    """The length of ``prompt`` (columns) when it is what the loop prefills: an integer array [1+C, P], P >= 1, its
    first row vocabulary ids and the others codes of the checkpoint's codebooks (a :class:`.text.PromptBuilder`'s);
    else EngineError saying what it is. For the tools that hand the loop a prompt of their own."""
    rows = cfg.num_codebooks + 1
    what = f"a prompt is an integer array [{rows}, columns] (text.PromptBuilder makes one)"
    if not isinstance(prompt, np.ndarray) or prompt.dtype.kind not in "iu":
        raise EngineError(f"{what}, got {type(prompt).__name__} {getattr(prompt, 'dtype', '')}".rstrip())
    if prompt.ndim != 2 or prompt.shape[0] != rows or prompt.shape[1] < 1:
        raise EngineError(f"{what}, got shape {list(prompt.shape)}")
    ids, codes = prompt[0], prompt[1:]
    if ids.min() < 0 or ids.max() >= cfg.vocab_size or codes.min() < 0 or codes.max() >= cfg.codebook_size:
        raise EngineError(f"{what}: its ids are below {cfg.vocab_size}, its codes below {cfg.codebook_size}")
    return int(prompt.shape[1])


def frame_budget(
    cfg: ModelConfig, prompt_length: int, max_frames: int | None, default_frames: int, text_tokens: int | None = None
) -> int:
    """How many frames may follow a prompt of ``prompt_length`` columns.

    The publisher requires prompt length < max_seq_len and clips max_new_tokens to what is left. An
    explicit ``max_frames`` that does not fit is an error rather than a silent clip; the default
    (``default_frames``, at most :func:`text_frame_cap` of the ``text_tokens`` spoken when given) is clipped
    like the publisher's (the engine then reports a stop at the cap).
    Raises EngineError with the numbers, ConfigError for a ``max_frames`` that is no whole number >= 1.
    """
    room = cfg.max_seq_len - prompt_length
    if room < 1:
        raise EngineError(
            f"the prompt is {prompt_length} tokens but the model's context is {cfg.max_seq_len} "
            "(prompt + frames); shorten the text (or the voice's reference clip)"
        )
    if max_frames is None:
        if text_tokens is not None:
            default_frames = min(default_frames, text_frame_cap(text_tokens))
        return min(default_frames, room)
    max_frames = check_int(max_frames, "max_frames")
    if max_frames > room:
        raise EngineError(
            f"the prompt is {prompt_length} tokens, so at most {room} frames fit the model's context of "
            f"{cfg.max_seq_len}; asked for {max_frames}: lower the frame cap (max_frames, --max-frames) or shorten the "
            "text",
            "max_frames",
        )
    return max_frames


def text_frame_cap(text_tokens: int) -> int:
    """The most frames the speech of ``text_tokens`` text tokens may take: ``DEFAULTS.speech.cap_base_frames`` plus
    ``DEFAULTS.speech.cap_frames_per_token`` per token (settings.py says why)."""
    return DEFAULTS.speech.cap_base_frames + DEFAULTS.speech.cap_frames_per_token * text_tokens
