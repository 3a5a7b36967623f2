"""Frames as CUDA graphs: :class:`.model.frame.Frame` in ``graph`` mode, captured and replayed.

An eager frame on a GPU is launch-bound: the slow step, nine fast-AR passes and ten draws issue a few thousand
small kernels, each paying the host's launch cost. The frame's ``graph`` mode has static shapes, the slot an
input tensor and no host read, so it can be captured once per set of sampling settings (they are Python
constants in the graph) and replayed with one launch per frame:

* the inputs are copied into fixed buffers, the graph replays, and its outputs (fixed tensors, overwritten by
  the next replay) are returned for the caller to copy to the host;
* the KV state is the caller's pair of tensors, written in place at the slot in ``pos``: they must stay the same
  tensors for the runner's life (zeroing them in place between utterances is fine);
* attention reads all ``L`` slots under a mask (no ``[:pos]`` slice, whose shape would change every frame).

:class:`GraphedFrame` is one utterance's frame (batch 1); :class:`GraphedRows` the batched frame of continuous
batching (:meth:`.model.frame.Frame.rows`), one graph per bucketed batch size over a view of the KV state's rows.
With ``capture`` False (the CPU, the tests) the same buffers feed the module eagerly: same maths, no graph.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...config import SamplingParams
from ...model.dualar import DualAR
from ...model.frame import Frame, FrameInputs, FrameOutputs, Prefilled, packed
from ...settings import DEFAULTS
from ..base import StepInputs
from .staging import Staging

Outputs = tuple[FrameOutputs, Tensor]
"""What a graphed frame returns: its outputs and :func:`.model.frame.packed` of them."""

_CAPTURE = threading.Lock()  # one capture at a time in this process (several model instances serve in threads)


class Graphs:
    """CUDA graphs of calls that read and write only fixed tensors, one per ``key`` (a set of sampling settings,
    with the batch size for rows), the least recently used dropped beyond ``kept``. All share one memory pool, so
    a replay's outputs (fixed tensors) are overwritten by the next replay of any of them: read them first."""

    def __init__(self, kept: int, device: torch.device):
        self.kept, self.device = kept, device
        self._graphs: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, Outputs]] = OrderedDict()
        self._pool = None  # one memory pool shared by every captured graph

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, fn: Callable[[], Outputs]) -> Outputs:
        """Replay the graph of ``key``, captured from ``fn`` on first use; returns its outputs."""
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(fn)
            while len(self._graphs) > self.kept:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        graph, outputs = entry
        graph.replay()
        return outputs

    def _capture(self, fn: Callable[[], Outputs]) -> tuple[torch.cuda.CUDAGraph, Outputs]:
        """``fn`` captured as a CUDA graph. The warm-up runs on the inputs already in the buffers (this call's own),
        so the KV slots it writes hold the values the replay writes again."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (library handles, workspaces) as PyTorch advises
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (another request's codec, say) do not void this capture
        with _CAPTURE, torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = fn()
        self._pool = graph.pool()
        return graph, outputs


def _check_capture(capture: bool, dev: torch.device) -> None:
    if capture and dev.type != "cuda":
        raise ValueError(f"CUDA graphs need a CUDA device; the KV state is on {dev}")


def _copy_into(static: object, given: object, n: int) -> None:
    """Copy every tensor field of the dataclass ``given`` (n utterances) into the first n of ``static``'s buffers."""
    for field in dataclasses.fields(given):
        value = getattr(given, field.name)
        if isinstance(value, Tensor):
            getattr(static, field.name)[:n].copy_(value)


class GraphedFrame:
    """:class:`.model.frame.Frame` (``graph`` mode) on ``model`` over the KV state ``k_cache``/``v_cache``
    [n_layer, 1, n_kv, L, D], batch 1, replayed as a CUDA graph when ``capture`` (needs a CUDA device).

    :meth:`step` stages a frame's host inputs (:class:`..base.StepInputs`) through the page-locked buffers of a
    one-entry :class:`.staging.Staging`, one asynchronous copy each, as the batched rows do; calling it with the
    sampling settings, a batch-1 :class:`.model.frame.FrameInputs` (``pos`` an int64 tensor [1]) and, for frame 0,
    its :class:`.model.frame.Prefilled` copies those device tensors in instead. Either runs the frame (a frame 0 is a
    replay like any other) and returns its :class:`.model.frame.FrameOutputs` and :func:`.model.frame.packed` of
    them, which the next call overwrites, whatever its settings (see :class:`Graphs`): read them first.
    Raises ValueError for ``capture`` off a CUDA device.
    """

    def __init__(self, model: DualAR, k_cache: Tensor, v_cache: Tensor, capture: bool):
        _check_capture(capture, k_cache.device)
        self.frame = Frame(model, mode="graph")
        self.k_cache, self.v_cache, self.capture = k_cache, v_cache, capture
        self.staging = Staging(model.cfg, 1, k_cache.device, k_cache.dtype)
        self.inputs, self.prefilled = self.staging.inputs, self.staging.prefilled
        self.graphs = Graphs(DEFAULTS.torch.cuda_graphs_kept, k_cache.device) if capture else None

    @torch.inference_mode()
    def step(self, params: SamplingParams, step: StepInputs, kept: tuple[Tensor, Tensor] | None) -> Outputs:
        """The frame of ``step``, a frame 0 (``step.column`` None) drawn from ``kept`` (its prefill's last logits
        [V+1] and hidden [dim], on the device)."""
        self.staging.load([(0, step)], {} if kept is None else {0: kept})
        return self._run(params)

    @torch.inference_mode()
    def __call__(self, params: SamplingParams, inputs: FrameInputs, prefilled: Prefilled | None = None) -> Outputs:
        _copy_into(self.inputs, inputs, 1)
        if prefilled is None:
            self.prefilled.first.fill_(False)
        else:
            _copy_into(self.prefilled, prefilled, 1)
        return self._run(params)

    def _run(self, params: SamplingParams) -> Outputs:
        """The captured region on the fixed inputs: a replay (captured on first use), or the frame eagerly."""

        def run() -> Outputs:
            out = self.frame(params, self.inputs, self.k_cache, self.v_cache, self.prefilled)
            return out, packed(out)

        return run() if self.graphs is None else self.graphs.run(params, run)


def bucket_sizes(max_batch: int, buckets: Sequence[int] = DEFAULTS.torch.batch_buckets) -> tuple[int, ...]:
    """The batch sizes batched graphs are made at for ``max_batch`` rows: the ``buckets`` below it, and ``max_batch``
    itself (a bucket is a view of the KV state's first rows, so none is larger)."""
    return (*sorted(b for b in set(buckets) if b < max_batch), max_batch)


@dataclass
class StepTimes:
    """Seconds of the batched graphs' steps, summed over ``steps``: ``host_s`` staging the inputs (host buffers,
    the copies issued), ``replay_s`` the graph's replay until the device is done, ``results_s`` the ids' copy to the
    host and the results made of them."""

    steps: int = 0
    host_s: float = 0.0
    replay_s: float = 0.0
    results_s: float = 0.0

    def add(self, host_s: float, replay_s: float, results_s: float) -> None:
        self.steps += 1
        self.host_s += host_s
        self.replay_s += replay_s
        self.results_s += results_s

    def ms(self) -> dict[str, float]:
        """Each part in ms per step (0 before any step)."""
        n = max(self.steps, 1)
        return {k: 1e3 * getattr(self, f"{k}_s") / n for k in ("host", "replay", "results")}


class GraphedRows:
    """The batched frame (:meth:`.model.frame.Frame.rows`, ``graph`` mode) on ``model`` over the KV state
    ``k_cache``/``v_cache`` [n_layer, R, n_kv, L, D], replayed as CUDA graphs when ``capture`` (needs a CUDA device).

    A call runs at the smallest of ``buckets`` (ascending batch sizes, the largest R) above its highest row, over the
    view of the KV state's first rows: entry r is row r, so attention reads the state in place (no row gathered or
    copied; keep the rows in use low, as :meth:`.rows.TorchBatchFrames.acquire` does). Its inputs go through the
    bucket's :class:`.staging.Staging`; rows not in the call are padding (see :meth:`.model.frame.Frame.rows`). One
    graph per (bucket, sampling settings) is captured on first use or by :meth:`capture_all`, kept as :class:`Graphs`
    says (``DEFAULTS.torch.cuda_graphs_kept`` per bucket). Raises ValueError for ``capture`` off a CUDA device, or
    buckets past R.
    """

    def __init__(self, model: DualAR, k_cache: Tensor, v_cache: Tensor, buckets: Sequence[int], capture: bool):
        _check_capture(capture, k_cache.device)
        self.model, self.frame = model, Frame(model, mode="graph")
        self.k_cache, self.v_cache, self.capture = k_cache, v_cache, capture
        self.buckets = tuple(sorted(set(buckets)))
        if self.buckets[-1] > k_cache.shape[1]:
            raise ValueError(f"bucket {self.buckets[-1]} is larger than the KV state's {k_cache.shape[1]} rows")
        self._staging: dict[int, Staging] = {}
        self.graphs = Graphs(DEFAULTS.torch.cuda_graphs_kept * len(self.buckets), k_cache.device) if capture else None

    def bucket(self, rows: int) -> int:
        """The batch size a call over rows ``[0, rows)`` runs at; ValueError past the largest bucket."""
        for b in self.buckets:
            if b >= rows:
                return b
        raise ValueError(f"row {rows - 1} in a batched frame: the largest bucket is {self.buckets[-1]}")

    def staging(self, size: int) -> Staging:
        """The fixed inputs of bucket ``size``, made on first use (every entry padding)."""
        if size not in self._staging:
            self._staging[size] = Staging(self.model.cfg, size, self.k_cache.device, self.k_cache.dtype)
        return self._staging[size]

    def stage(self, calls: Sequence[tuple[int, StepInputs]], prefilled: Mapping[int, tuple[Tensor, Tensor]]) -> int:
        """Stage ``calls`` (KV row, step inputs; rows distinct) for :meth:`replay`, frame-0 calls drawn from
        ``prefilled[row]`` (logits [V+1], hidden [dim] on the device); returns the bucket they run at."""
        size = self.bucket(max(row for row, _ in calls) + 1)
        self.staging(size).load(calls, prefilled)
        return size

    @torch.inference_mode()
    def replay(self, params: SamplingParams, size: int) -> Outputs:
        """The captured region: bucket ``size``'s frame on its staged inputs (:meth:`stage`), as a graph when
        capturing (captured on first use), eagerly otherwise. Returns the outputs and :func:`.model.frame.packed` of
        every entry, entry r for row r (fixed tensors: read them before the next call)."""
        staging = self.staging(size)
        k, v = self.k_cache[:, :size], self.v_cache[:, :size]

        def run() -> Outputs:
            out = self.frame.rows(params, staging.inputs, staging.prefilled, k, v)
            return out, packed(out)

        return run() if self.graphs is None else self.graphs.run((size, params), run)

    def capture_all(self, params: SamplingParams) -> None:
        """Capture every bucket's graph for ``params`` now (at start-up: a capture mid-serving stalls every stream),
        on all-padding inputs, which write only the last slot of each row. Nothing to do without capture."""
        if self.graphs is not None:
            for size in self.buckets:
                self.staging(size).load([], {})  # all padding
                self.replay(params, size)
            torch.cuda.synchronize(self.k_cache.device)  # its copies done before another stream stages a call
