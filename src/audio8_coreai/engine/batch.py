"""Continuous batching for a caller that owns the loop: utterances share one frame call, each its own loop state.

A backend that batches (``Backend.batch_frames``: the torch backend's :class:`..backends.torch.rows.TorchBatchFrames`)
runs one frame for any set of KV rows in one call
(the weights read once for all). :class:`BatchEngine` admits utterances into free rows and steps them together;
each keeps its own :class:`.loop.Utterance` (noise stream, RAS window, stop rule), so its draws are those of
:func:`.loop.generate` with the same seed: equal codes, up to the float rounding of the batched matmuls (row j of
an [n, k] product may round differently from a [1, k] one; at int16 ONNX Runtime's kernel does, and a draw can
flip). One call takes one :class:`..config.SamplingParams` (top-k is a shape in the sampler).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend, FrameResult
from ..config import SamplingParams
from .loop import Generation, Utterance, check_prompt
from .noise import NoiseLike, seeded_noise


@dataclass
class BatchItem:
    """One utterance in a :class:`BatchEngine`: its KV ``row`` and its loop state ``utterance``."""

    row: int
    utterance: Utterance

    @property
    def done(self) -> bool:
        return self.utterance.done


class BatchEngine:
    """Continuous batching for a caller that owns the loop (:func:`generate_batch`, benchmarks): utterances join
    with :meth:`admit` (prefill into a free row) and every :meth:`step` runs one frame for all of them at once,
    each with its own noise stream and RAS window; one leaves (its row freed) at eos or its cap.

    ``params``: the sampling settings of every utterance; ``max_batch``: rows (``Backend.batch_frames``; raises
    BackendError on a backend that does not batch).
    """

    def __init__(self, backend: Backend, params: SamplingParams, max_batch: int):
        self.batch = backend.batch_frames(max_batch)
        self.params, self.cfg = params, backend.cfg
        self.items: list[BatchItem] = []

    @property
    def free(self) -> int:
        """Rows free for :meth:`admit`."""
        return self.batch.free

    def admit(
        self,
        prompt: np.ndarray,
        max_frames: int,
        seed: int | None = None,
        noise: NoiseLike | None = None,
        logits: bool = False,
    ) -> BatchItem:
        """Start an utterance: prefill ``prompt`` int [1+C, P] into a free row; its frame 0 comes with the next
        :meth:`step`. Noise from ``NoiseSource(seed)`` unless ``noise`` is given (as :func:`.loop.generate`);
        ``logits``: its results carry the logits and hidden (tools).
        Raises EngineError when no row is free or the prompt and ``max_frames`` do not fit the context."""
        if noise is None:
            if seed is None:
                raise ValueError("admit needs a seed or a noise source")
            noise = seeded_noise(self.batch.backend, seed)
        utterance = Utterance(self.cfg, check_prompt(self.cfg, prompt), max_frames, noise, logits=logits)
        row = self.batch.acquire()
        self.batch.prefill(row, prompt)
        item = BatchItem(row, utterance)
        self.items.append(item)
        return item

    def step(self) -> list[tuple[BatchItem, FrameResult]]:
        """One frame for every active utterance in one call; returns each item with its result (semantic eos
        when the utterance ended there). Items that end leave, freeing their rows."""
        results = self.batch.frames(self.params, [(item.row, item.utterance.next_inputs()) for item in self.items])
        for item, res in zip(self.items, results):
            item.utterance.record(res)
            if item.done:
                self.batch.release(item.row)
        out = list(zip(self.items, results))
        self.items = [item for item in self.items if not item.done]
        return out


def generate_batch(
    backend: Backend,
    prompts: Sequence[np.ndarray],
    params: SamplingParams,
    seeds: Sequence[int],
    max_frames: Sequence[int],
    max_batch: int,
) -> list[Generation]:
    """:func:`.loop.generate` for many prompts, ``max_batch`` at a time through one :class:`BatchEngine` (of at most
    one row per prompt).

    Utterance i (prompt int [1+C, P_i], ``seeds[i]``, cap ``max_frames[i]``) gives the codes ``generate`` gives
    it alone (to float rounding, see the module docstring); a new prompt takes a row as soon as one frees.
    Returns one :class:`.loop.Generation` per prompt, in order (``prefill_s`` is its own prefill, ``frames_s``
    the wall time from its admission to its end). Raises EngineError as ``generate``.
    """
    if not len(prompts) == len(seeds) == len(max_frames):
        raise ValueError(f"{len(prompts)} prompts, {len(seeds)} seeds and {len(max_frames)} frame caps: give one each")
    engine = BatchEngine(backend, params, min(max_batch, max(len(prompts), 1)))  # no rows beyond the prompts
    items: list[BatchItem | None] = [None] * len(prompts)
    times: list[list[float]] = [[0.0, 0.0, 0.0] for _ in prompts]  # admitted, prefill done, ended
    index: dict[int, int] = {}
    waiting = list(range(len(prompts)))
    while waiting or engine.items:
        while waiting and engine.free:
            i = waiting.pop(0)
            times[i][0] = time.perf_counter()
            items[i] = engine.admit(prompts[i], max_frames[i], seeds[i])
            times[i][1] = times[i][2] = time.perf_counter()
            index[id(items[i])] = i
        for item, _ in engine.step():
            if item.done:
                times[index[id(item)]][2] = time.perf_counter()
    out = []
    for item, (t0, t1, t2) in zip(items, times):
        u = item.utterance
        out.append(Generation(u.frames(), u.reached_eos, u.prompt_length, u.max_frames, t1 - t0, t2 - t1))
    return out
