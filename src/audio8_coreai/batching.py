"""Many utterances from one model in the API: ``generate_batch`` (several texts sharing every frame call) and
``batched`` (the rows of one model, one per server worker)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .backends.base import Backend, FrameRows
from .checkpoint import Checkpoint
from .config import SamplingParams
from .engine.batch import generate_batch
from .errors import ConfigError, EngineError, PromptError
from .plan import Plan
from .request import check_batch, in_batch
from .synthesis import Synthesis
from .text import PromptBuilder
from .values import check_int
from .voices import Voice, VoiceStore

if TYPE_CHECKING:
    from .tts import TTS


class Batching:
    """The batching calls of :class:`.tts.TTS` (its ``checkpoint``, ``backend``, ``prompts``, ``voices``,
    ``sample_rate``, ``sampling`` and the keyword API's plan, ``_planned``)."""

    checkpoint: Checkpoint
    backend: Backend
    prompts: PromptBuilder
    voices: VoiceStore
    sample_rate: int
    sampling: Callable[..., SamplingParams]
    _open: Callable[[], None]
    _planned: Callable[..., Plan]

    def generate_batch(
        self,
        texts: Sequence[str] | Sequence[Plan],
        *,
        seeds: Sequence[int | None] | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        max_frames: int | None = None,
        voice: str | Voice | None = None,
        max_batch: int = 8,
    ) -> list[Synthesis]:
        """:meth:`generate` for several texts at once: up to ``max_batch`` utterances share every frame call
        (:mod:`.engine.batch`: the weights are read once per frame for all of them), then one batched codec call.

        ``texts``: plans of one piece each sharing their sampling settings (:meth:`plan`), or strings spoken with
        the other keywords (``voice`` read once for all of them) and ``seeds`` (one per text; None, or a None
        entry, draws a fresh one). Utterance i is what ``generate(texts[i], seed=seeds[i], ...)`` gives (same codes
        at fp32; at int16 the batched matmuls round differently and a draw may rarely differ). Each text must fit
        one utterance (no splitting). ``frames_s`` is an utterance's time from its admission to its last frame
        (shared frame calls included), ``codec_s`` the batched decode's time.
        Raises as :meth:`generate`, and BackendError on a backend other than torch, ConfigError when ``texts`` is
        no list (one string, a set, a generator) or mixes plans and strings, ``seeds`` does not match it, plans do
        not share their sampling settings or ``max_batch`` < 1.
        """
        if not self.backend.batches:
            raise self.backend.no_batching()
        seeds = check_batch(texts, seeds)
        planned = [isinstance(t, Plan) for t in texts]
        if any(planned) and not all(planned):  # a plan holds its settings, a string takes the keywords: not both
            i, j = planned.index(True), planned.index(False)
            raise ConfigError(f"texts[{i}] is a plan and texts[{j}] is not: give all plans or all strings", "texts")
        max_batch = check_int(max_batch, "max_batch")
        request = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "max_frames": max_frames}
        if isinstance(voice, str):  # read once for every text
            voice = self.voices.load(voice, self.checkpoint.fingerprint())
        plans = []
        for i, (text, seed) in enumerate(zip(texts, seeds)):  # a loop: a warning's stacklevel names the caller
            try:
                plans.append(self._planned(text, {**request, "voice": voice, "seed": seed}, split=False))
            except (PromptError, EngineError, ConfigError) as e:
                raise in_batch(e, i) from None
        if len({p.params for p in plans}) > 1:
            raise ConfigError("the plans of one batch share their sampling settings: batch them by their settings")
        if several := [i for i, p in enumerate(plans) if len(p.pieces) != 1]:
            n, i = len(plans[several[0]].pieces), several[0]
            raise EngineError(f"generate_batch speaks plans of one piece; texts[{i}]'s has {n}: plan with split=False")
        pieces = [p.pieces[0] for p in plans]
        with self.backend.lease.hold():  # its prefills pass through the backend (the last logits it keeps)
            gens = generate_batch(
                self.backend,
                [p.prompt for p in pieces],
                plans[0].params if plans else self.sampling(),
                [p.seed for p in plans],
                [p.max_frames for p in pieces],
                max_batch,
            )
        t0 = time.perf_counter()
        audio = self.backend.decode_batch([g.codes for g in gens])
        codec_s = time.perf_counter() - t0
        return [
            Synthesis(
                a,
                self.sample_rate,
                g.codes,
                g.reached_eos,
                p.seed,
                g.prompt_length,
                b.max_frames,
                g.prefill_s,
                g.frames_s,
                codec_s,
            )
            for a, g, p, b in zip(audio, gens, plans, pieces)
        ]

    def batched(self, max_batch: int) -> tuple[FrameRows, list[TTS]]:
        """``max_batch`` TTS instances sharing this one's model through one frame thread (``Backend.frame_rows``:
        the torch backend's :class:`.backends.torch.rows.FrameServer`): one per server worker, their frames run as
        one batched call, graphs captured now for the default sampling. Raises BackendError on a backend that does
        not batch, ConfigError for ``max_batch`` < 1."""
        self._open()
        server = self.backend.frame_rows(check_int(max_batch, "max_batch"), warm=[self.sampling()])
        return server, [type(self)(self.checkpoint, row, self.prompts, self.voices) for row in server.rows()]
