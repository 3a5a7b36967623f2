"""Several utterances in one frame call: the slow AR and fast AR read their weights once per frame for all.

:class:`BatchModel` holds ``max_batch`` rows of KV state [n_layer, max_batch, n_kv, max_seq_len, head_dim], one
utterance per row. A row is filled by a prefill (run alone); then :meth:`BatchModel.frames` runs one frame for
any set of rows in one call: the linears of the slow AR, the fast AR and the heads on all of them at once,
attention per row at its own position (:meth:`.fastframe.FastFrame.slow_step_rows`), frame-0 rows (drawn from their
prefill) in the same sampler pass. Rows come and go between frames (continuous batching): :class:`BatchEngine`
drives it for a caller that owns the loop (:func:`generate_batch`), and the server drives it from many request
threads (:mod:`.serving`).

Each utterance keeps its own noise stream and RAS window, so its draws are those of :func:`.engine.generate`
with the same seed: equal codes, up to the float rounding of the batched matmuls (row j of an [n, k] product
may round differently from a [1, k] one: none at fp32 on the tiny checkpoint in tests/test_batching.py; at
int16 ONNX Runtime's kernel does, about 6e-4 on the logits, and a draw can flip). One call takes one
:class:`.graphs.SamplingParams` (top-k is a shape in the sampler); callers group utterances by their settings.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .backends.torch import MODEL_FILE, FrameResult, TorchBackend
from .checkpoint import require_finite
from .engine import EngineError, Generation, NoiseLike, check_context, noise_source
from .fastframe import FastFrame
from .graphs import SamplingParams
from .sampling import RasWindow


@dataclass
class FrameCall:
    """One utterance's inputs to a batched frame (:meth:`BatchModel.frames`), as the engine's ``frame`` takes
    them: its KV ``row``, the previous ``column`` int [1+C] at slot ``pos`` (None: frame 0, drawn from the
    row's prefill), ``noise_slow`` [2, V+1], RAS ``window`` [W], ``noise_fast`` [C-1, codebook_size], and
    ``forced`` [1+C] (teacher forcing) or None."""

    row: int
    column: np.ndarray | None
    pos: int
    noise_slow: np.ndarray
    window: np.ndarray
    noise_fast: np.ndarray
    forced: np.ndarray | None = None


class BatchModel:
    """The rows of a batch over a :class:`.backends.torch.TorchBackend`'s model (same weights, same precision).

    Holds the KV state [n_layer, max_batch, n_kv, max_seq_len, head_dim] (each row about 100 MB at fp32 for the
    0.6b model) and which rows are taken. :meth:`prefill` fills one row (the backend's prefill, written into
    that row); :meth:`frames` runs one frame for any set of rows in one call. Not thread-safe: one thread
    drives it.
    """

    def __init__(self, backend: TorchBackend, max_batch: int):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.backend, self.max_batch, self.cfg = backend, max_batch, backend.cfg
        self.k_cache, self.v_cache = backend.model.new_kv_cache(batch=max_batch)
        self._free = list(range(max_batch))
        self._prefilled: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # row -> its prefill's logits, hidden
        self._runners: dict[int, FastFrame] = {}  # per call size n: the fast AR's per-frame buffers are [n, ...]

    @property
    def free(self) -> int:
        """Rows not taken."""
        return len(self._free)

    def acquire(self) -> int:
        """Take a free row (the lowest); raises EngineError when every row is taken."""
        if not self._free:
            raise EngineError(f"all {self.max_batch} rows of the batch are busy; wait until one frees")
        self._free.sort()
        return self._free.pop(0)

    def release(self, row: int) -> None:
        """Give ``row`` back (its KV slots are overwritten by the next prefill)."""
        self._prefilled.pop(row, None)
        if row not in self._free:
            self._free.append(row)

    def prefill(self, row: int, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prefill ``prompt`` int [1+C, P] into ``row``; returns its last logits [V+1] and hidden [dim]
        (float32, as the backend's prefill) and keeps them for the row's frame 0."""
        b = self.backend
        logits, hidden = b.prefill(prompt, self.k_cache[:, row:row + 1], self.v_cache[:, row:row + 1])
        dtype = b.model.slow.norm.weight.dtype
        self._prefilled[row] = (torch.as_tensor(logits, device=b.device).to(dtype),
                                torch.as_tensor(hidden, device=b.device).to(dtype))
        return logits, hidden

    @torch.inference_mode()
    def frames(self, params: SamplingParams, calls: Sequence[FrameCall]) -> list[FrameResult]:
        """One frame for each call, in one batched call: the slow step of the calls with a column, then one
        sampler pass (semantic draws, the fast AR's rows, codebook draws) for all. Returns their results in order;
        each equals the backend's ``first_frame``/``frame`` on the same inputs up to float rounding."""
        n = len(calls)
        if n == 0:
            return []
        b, c = self.backend, self.cfg.num_codebooks
        dev = b.device
        runner = self._runners.get(n)
        if runner is None:
            runner = self._runners[n] = FastFrame(b.model, batch=n)
        stepped = [i for i, call in enumerate(calls) if call.column is not None]
        logits: list[torch.Tensor | None] = [None] * n
        hidden: list[torch.Tensor | None] = [None] * n
        if stepped:
            column = torch.as_tensor(np.stack([calls[i].column for i in stepped]), device=dev).view(-1, 1 + c, 1)
            lg, hd = runner.slow_step_rows(column, [calls[i].row for i in stepped], [calls[i].pos for i in stepped],
                                           self.k_cache, self.v_cache)
            for j, i in enumerate(stepped):
                logits[i], hidden[i] = lg[j], hd[j]
        for i, call in enumerate(calls):
            if call.column is None:
                logits[i], hidden[i] = self._prefilled[call.row]
        forced = np.zeros((n, 1 + c), dtype=np.int64)
        use_forced = torch.zeros(n, device=dev)
        for i, call in enumerate(calls):
            if call.forced is not None:
                forced[i], use_forced[i] = call.forced, 1.0
        lg, hd = torch.stack(logits), torch.stack(hidden)
        out = runner.sample(params, lg, hd, torch.as_tensor(np.stack([x.noise_slow for x in calls]), device=dev),
                            torch.as_tensor(np.stack([x.window for x in calls]), device=dev),
                            torch.as_tensor(np.stack([x.noise_fast for x in calls]), device=dev),
                            torch.as_tensor(forced, device=dev), use_forced)
        semantic, codes, fast_logits, sampled_sem, sampled_codes = (t.cpu() for t in out)
        lg, hd = require_finite(lg.float().cpu().numpy(), "model", MODEL_FILE), hd.float().cpu().numpy()
        return [FrameResult(int(semantic[i]), codes[i].numpy(), lg[i], hd[i], fast_logits[i].float().numpy(),
                            int(sampled_sem[i]), sampled_codes[i].numpy()) for i in range(n)]


@dataclass
class BatchItem:
    """One utterance in a :class:`BatchEngine`: its KV ``row``, ``prompt_length`` (columns), frame cap
    ``max_frames``, own noise stream and RAS window, the frames made so far (``codes``: int64 [C] each) and,
    once ``done``, ``reached_eos`` (False: the cap)."""

    row: int
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

    def call(self) -> FrameCall:
        """The inputs of this utterance's next step (draws its noise)."""
        noise_slow, noise_fast = self.noise.next_frame()
        return FrameCall(self.row, self.column, self.prompt_length + self.steps - 1, noise_slow,
                         self.window.current()[0], noise_fast)

    def record(self, res: FrameResult, eos_id: int) -> None:
        """Apply one step's result: the publisher's stop rule and RAS window (as :func:`.engine.frame_steps`)."""
        if res.semantic == eos_id:
            self.reached_eos = self.done = True
            return
        self.codes.append(res.codes)
        self.window.push(res.semantic)
        self.column = np.concatenate([[res.semantic], res.codes])
        self.done = self.steps >= self.max_frames


class BatchEngine:
    """Continuous batching for a caller that owns the loop (:func:`generate_batch`, benchmarks): utterances join
    with :meth:`admit` (prefill into a free row) and every :meth:`step` runs one frame for all of them at once,
    each with its own noise stream and RAS window; one leaves (its row freed) at eos or its cap.

    ``params``: the sampling settings of every utterance; ``max_batch``: rows (see :class:`BatchModel`).
    """

    def __init__(self, backend: TorchBackend, params: SamplingParams, max_batch: int):
        self.model = BatchModel(backend, max_batch)
        self.params, self.cfg = params, backend.cfg
        self.items: list[BatchItem] = []

    @property
    def free(self) -> int:
        """Rows free for :meth:`admit`."""
        return self.model.free

    def admit(self, prompt: np.ndarray, max_frames: int, seed: int | None = None,
              noise: NoiseLike | None = None) -> BatchItem:
        """Start an utterance: prefill ``prompt`` int [1+C, P] into a free row; its frame 0 comes with the next
        :meth:`step`. Noise from ``NoiseSource(seed)`` unless ``noise`` is given (as :func:`.engine.generate`).
        Raises EngineError when no row is free or the prompt and ``max_frames`` do not fit the context."""
        check_context(self.cfg, prompt.shape[1], max_frames)
        if noise is None:
            if seed is None:
                raise ValueError("admit needs a seed or a noise source")
            noise = noise_source(self.cfg, seed)
        row = self.model.acquire()
        self.model.prefill(row, prompt)
        item = BatchItem(row, prompt.shape[1], max_frames, noise, RasWindow(self.cfg.ras_window_size))
        self.items.append(item)
        return item

    def step(self) -> list[tuple[BatchItem, FrameResult]]:
        """One frame for every active utterance in one call; returns each item with its result (semantic eos
        when the utterance ended there). Items that end leave, freeing their rows."""
        results = self.model.frames(self.params, [item.call() for item in self.items])
        for item, res in zip(self.items, results):
            item.record(res, self.cfg.eos_token_id)
            if item.done:
                self.model.release(item.row)
        out = list(zip(self.items, results))
        self.items = [item for item in self.items if not item.done]
        return out


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
            items[i] = engine.admit(prompts[i], max_frames[i], seeds[i])
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
