"""Several utterances in one frame call: the slow AR and fast AR read their weights once per frame for all.

A :class:`BatchEngine` holds up to ``max_batch`` utterances, each in one row of its own KV state
[n_layer, max_batch, n_kv, max_seq_len, head_dim]. An utterance joins with :meth:`BatchEngine.admit` (its
prefill and frame 0 run alone, through the backend's batch-1 calls, and its KV rows are copied in), then every
:meth:`BatchEngine.step` runs one frame for all active utterances at once, each at its own position
(:meth:`.fastframe.FastFrame.frame_rows`). An utterance leaves at eos or at its frame cap, and the last row moves
into its place, so the active rows are always ``0 .. n-1`` and a frame costs what ``n`` rows cost. Rows come and
go between steps (continuous batching: a server admits requests while others are mid-utterance).

Each utterance keeps its own noise stream and RAS window, so its draws are those of :func:`.engine.generate`
with the same seed: equal codes, up to float rounding of the batched matmuls (row b of an [n, k] GEMM may round
differently from a [1, k] GEMV; tests/test_batching.py holds free runs equal on the tiny checkpoint).
All utterances of one engine share one :class:`.graphs.SamplingParams` (it is baked into the sampler's shapes:
top-k is a tensor shape); a server groups requests by their settings.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .backends.torch import FrameResult, TorchBackend
from .engine import EngineError, Generation, NoiseLike, check_context, noise_source
from .fastframe import FastFrame
from .graphs import SamplingParams
from .sampling import RasWindow


@dataclass
class BatchItem:
    """One utterance in a :class:`BatchEngine`: its ``prompt_length`` (columns), frame cap ``max_frames``, the
    frames made so far (``codes``: int64 [C] each) and, once it has left, ``reached_eos`` (False: the cap)."""

    prompt_length: int
    max_frames: int
    noise: NoiseLike
    window: RasWindow
    codes: list[np.ndarray] = field(default_factory=list)
    column: np.ndarray | None = None
    done: bool = False
    reached_eos: bool = False

    @property
    def steps(self) -> int:
        """Frame-loop steps taken (frames made, plus the eos step once it came)."""
        return len(self.codes) + int(self.reached_eos)

    @property
    def pos(self) -> int:
        """The slot (and RoPE position) the next slow step writes: the previous frame's column."""
        return self.prompt_length + self.steps - 1


class BatchEngine:
    """Continuous batching over a :class:`.backends.torch.TorchBackend`'s model (same weights, same precision).

    ``params``: the sampling settings of every utterance; ``max_batch``: rows of the KV state (each row holds
    ``max_seq_len`` slots: about 100 MB at fp32 for the 0.6b model). Not thread-safe: one caller drives
    :meth:`admit` and :meth:`step`. Uses the backend's batch-1 KV state for prefills, so the backend must not
    run an utterance of its own meanwhile.
    """

    def __init__(self, backend: TorchBackend, params: SamplingParams, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend, self.params, self.max_batch = backend, params, max_batch
        self.cfg = backend.cfg
        self.k_cache, self.v_cache = backend.model.new_kv_cache(batch=max_batch)
        self._runners: dict[int, FastFrame] = {}  # per active count: the fast AR's per-frame buffers are [n, ...]
        self.items: list[BatchItem] = []  # row i of the KV state holds items[i]

    @property
    def free(self) -> int:
        """Rows free for :meth:`admit`."""
        return self.max_batch - len(self.items)

    def admit(self, prompt: np.ndarray, max_frames: int, seed: int | None = None,
              noise: NoiseLike | None = None) -> tuple[BatchItem, FrameResult]:
        """Start an utterance: prefill ``prompt`` int [1+C, P] and draw frame 0 (alone, batch 1), then take a row.

        Noise from ``NoiseSource(seed)`` unless ``noise`` is given (as :func:`.engine.generate`). Returns the
        item and frame 0's result; an eos at frame 0 (or ``max_frames`` 1) leaves the item done without a row.
        Raises EngineError when no row is free or the prompt and ``max_frames`` do not fit the context.
        """
        if not self.free:
            raise EngineError(f"all {self.max_batch} rows of the batch are busy; step until one frees")
        check_context(self.cfg, prompt.shape[1], max_frames)
        if noise is None:
            if seed is None:
                raise ValueError("admit needs a seed or a noise source")
            noise = noise_source(self.cfg, seed)
        item = BatchItem(prompt.shape[1], max_frames, noise, RasWindow(self.cfg.ras_window_size))
        b = self.backend
        b.prefill(prompt)
        noise_slow, noise_fast = noise.next_frame()
        res = b.first_frame(self.params, noise_slow, item.window.current()[0], noise_fast)
        self._record(item, res)
        if not item.done:
            row = len(self.items)
            n = item.prompt_length
            self.k_cache[:, row, :, :n] = b.k_cache[:, 0, :, :n]
            self.v_cache[:, row, :, :n] = b.v_cache[:, 0, :, :n]
            self.items.append(item)
        return item, res

    @torch.inference_mode()
    def step(self) -> list[tuple[BatchItem, FrameResult]]:
        """One frame for every active utterance in one call; returns each item with its frame's result (its
        semantic id is eos when the utterance ended there). Items that end leave their rows."""
        items = self.items
        n = len(items)
        if n == 0:
            return []
        dev = self.backend.device
        c = self.cfg.num_codebooks
        column = torch.as_tensor(np.stack([it.column for it in items]), device=dev).view(n, 1 + c, 1)
        positions = [it.pos for it in items]
        noises = [it.noise.next_frame() for it in items]
        tail = (torch.as_tensor(np.stack([s for s, _ in noises]), device=dev),
                torch.as_tensor(np.concatenate([it.window.current() for it in items]), device=dev),
                torch.as_tensor(np.stack([f for _, f in noises]), device=dev),
                torch.zeros(n, 1 + c, dtype=torch.long, device=dev),
                torch.zeros(n, device=dev))
        runner = self._runners.get(n)
        if runner is None:
            runner = self._runners[n] = FastFrame(self.backend.model, batch=n)
        out = runner.frame_rows(self.params, column, torch.tensor(positions, device=dev), max(positions) + 1,
                                self.k_cache[:, :n], self.v_cache[:, :n], *tail)
        out = [t.cpu() for t in out]
        results = []
        for i, item in enumerate(items):
            semantic, codes, fast_logits, sampled_sem, sampled_codes, logits, hidden = (t[i] for t in out)
            res = FrameResult(int(semantic), codes.numpy(), logits.float().numpy(), hidden.float().numpy(),
                              fast_logits.float().numpy(), int(sampled_sem), sampled_codes.numpy())
            self._record(item, res)
            results.append((item, res))
        for row in reversed(range(n)):
            if items[row].done:
                self._release(row)
        return results

    def _record(self, item: BatchItem, res: FrameResult) -> None:
        """Apply one step's result to ``item``: the publisher's stop rule and RAS window (engine.frame_steps)."""
        if res.semantic == self.cfg.eos_token_id:
            item.reached_eos = item.done = True
            return
        item.codes.append(res.codes)
        item.window.push(res.semantic)
        item.column = np.concatenate([[res.semantic], res.codes])
        item.done = item.steps >= item.max_frames

    def _release(self, row: int) -> None:
        """Free ``row``: the last active row moves into it (its filled KV slots are copied) so rows stay dense."""
        last = len(self.items) - 1
        if row != last:
            moved = self.items[last]
            n = moved.pos  # slots 0 .. pos-1 are filled; pos is written by the next step
            self.k_cache[:, row, :, :n] = self.k_cache[:, last, :, :n]
            self.v_cache[:, row, :, :n] = self.v_cache[:, last, :, :n]
            self.items[row] = moved
        self.items.pop()


def generate_batch(backend: TorchBackend, prompts: Sequence[np.ndarray], params: SamplingParams,
                   seeds: Sequence[int], max_frames: Sequence[int], max_batch: int) -> list[Generation]:
    """:func:`.engine.generate` for many prompts, ``max_batch`` at a time through one :class:`BatchEngine`.

    Utterance i (prompt int [1+C, P_i], ``seeds[i]``, cap ``max_frames[i]``) gives the codes ``generate`` gives
    it alone (to float rounding, see the module docstring); a new prompt takes a row as soon as one frees.
    Returns one :class:`.engine.Generation` per prompt, in order (``prefill_s`` is its own prefill, ``frames_s``
    the wall time from its admission to its end). Raises EngineError as ``generate``.
    """
    if not len(prompts) == len(seeds) == len(max_frames):
        raise ValueError(f"{len(prompts)} prompts, {len(seeds)} seeds and {len(max_frames)} frame caps: give one each")
    for prompt, cap in zip(prompts, max_frames):
        check_context(backend.cfg, prompt.shape[1], cap)
    engine = BatchEngine(backend, params, max_batch)
    items: list[BatchItem | None] = [None] * len(prompts)
    times: list[list[float]] = [[0.0, 0.0, 0.0] for _ in prompts]  # admitted, prefill done, ended
    index: dict[int, int] = {}
    waiting = list(range(len(prompts)))
    while waiting or engine.items:
        while waiting and engine.free:
            i = waiting.pop(0)
            times[i][0] = time.perf_counter()
            items[i], _ = engine.admit(prompts[i], max_frames[i], seeds[i])
            times[i][1] = times[i][2] = time.perf_counter()
            index[id(items[i])] = i
        for item, _ in engine.step():
            if item.done:
                times[index[id(item)]][2] = time.perf_counter()
    out = []
    for item, (t0, t1, t2) in zip(items, times):
        codes = (np.stack(item.codes, axis=1) if item.codes
                 else np.zeros((backend.cfg.num_codebooks, 0), dtype=np.int64))
        out.append(Generation(codes, item.reached_eos, item.prompt_length, item.max_frames, t1 - t0, t2 - t1))
    return out
