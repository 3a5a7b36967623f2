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
batching (:meth:`.model.frame.Frame.rows`), one graph per bucketed batch size, the rows padded up to it.
With ``capture`` False (the CPU, the tests) the same buffers feed the module eagerly: same maths, no graph.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence

import torch
from torch import Tensor

from ...config import SamplingParams
from ...model.dualar import DualAR
from ...model.frame import Frame, FrameInputs, FrameOutputs, RowsInputs
from ...settings import DEFAULTS

GRAPHS_KEPT = DEFAULTS.cuda_graphs_kept
"""Captured graphs kept per batch size, one per set of sampling settings, least recently used dropped first."""

_CAPTURE = threading.Lock()  # one capture at a time in this process (several model instances serve in threads)


class Graphs:
    """CUDA graphs of calls that read and write only fixed tensors, one per ``key`` (a set of sampling settings,
    with the batch size for rows), the least recently used dropped beyond ``kept``. All share one memory pool, so
    a replay's outputs (fixed tensors) are overwritten by the next replay of any of them: read them first."""

    def __init__(self, kept: int, device: torch.device):
        self.kept, self.device = kept, device
        self._graphs: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, FrameOutputs]] = OrderedDict()
        self._pool = None  # one memory pool shared by every captured graph

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, fn: Callable[[], FrameOutputs]) -> FrameOutputs:
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

    def _capture(self, fn: Callable[[], FrameOutputs]) -> tuple[torch.cuda.CUDAGraph, FrameOutputs]:
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


def _frame_inputs(model: DualAR, batch: int, dev: torch.device, pos: int) -> FrameInputs:
    """Fixed input buffers for ``batch`` utterances: uniform noise 0.5, empty RAS windows, no forcing, zero
    columns at slot ``pos``."""
    cfg, c = model.cfg, model.cfg.num_codebooks
    return FrameInputs(
        noise_slow=torch.full((batch, 2, cfg.num_semantic + 1), 0.5, device=dev),
        window=torch.full((batch, cfg.ras_window_size), -1, dtype=torch.long, device=dev),
        noise_fast=torch.full((batch, c - 1, cfg.codebook_size), 0.5, device=dev),
        forced=torch.zeros(batch, 1 + c, dtype=torch.long, device=dev),
        use_forced=torch.zeros(batch, device=dev),
        column=torch.zeros(batch, 1 + c, 1, dtype=torch.long, device=dev),
        pos=torch.full((batch,), pos, dtype=torch.long, device=dev),
    )


def _copy_into(static: object, given: object, n: int) -> None:
    """Copy every field of the dataclass ``given`` (n utterances) into the first n of ``static``'s buffers."""
    for field in dataclasses.fields(given):
        getattr(static, field.name)[:n].copy_(getattr(given, field.name))


class GraphedFrame:
    """:class:`.model.frame.Frame` (``graph`` mode) on ``model`` over the KV state ``k_cache``/``v_cache``
    [n_layer, 1, n_kv, L, D], batch 1, replayed as a CUDA graph when ``capture`` (needs a CUDA device).

    Call with the sampling settings and a batch-1 :class:`.model.frame.FrameInputs` (``pos`` an int64 tensor
    [1]); returns the frame's :class:`.model.frame.FrameOutputs`, which the next call overwrites, whatever its
    settings (see :class:`Graphs`): read them first.
    Raises ValueError for ``capture`` off a CUDA device.
    """

    def __init__(self, model: DualAR, k_cache: Tensor, v_cache: Tensor, capture: bool):
        _check_capture(capture, k_cache.device)
        self.frame = Frame(model, mode="graph")
        self.k_cache, self.v_cache, self.capture = k_cache, v_cache, capture
        self.inputs = _frame_inputs(model, 1, k_cache.device, 0)
        self.graphs = Graphs(GRAPHS_KEPT, k_cache.device) if capture else None

    @torch.inference_mode()
    def __call__(self, params: SamplingParams, inputs: FrameInputs) -> FrameOutputs:
        _copy_into(self.inputs, inputs, 1)

        def run() -> FrameOutputs:
            return self.frame(params, self.inputs, self.k_cache, self.v_cache)

        return run() if self.graphs is None else self.graphs.run(params, run)


def bucket_sizes(max_batch: int, buckets: Sequence[int] = DEFAULTS.batch_buckets) -> tuple[int, ...]:
    """The batch sizes batched graphs are made at for up to ``max_batch`` rows: the ``buckets`` below it and the
    first at or above it (``max_batch`` itself when it is past the largest)."""
    ordered = sorted(set(buckets))
    above = [b for b in ordered if b >= max_batch]
    return (*(b for b in ordered if b < max_batch), above[0] if above else max_batch)


class GraphedRows:
    """The batched frame (:meth:`.model.frame.Frame.rows`, ``graph`` mode) on ``model`` over the KV state
    ``k_cache``/``v_cache`` [n_layer, R + 1, n_kv, L, D], whose last row is scratch (never lent: the padding and
    frame-0 rows write there), replayed as CUDA graphs when ``capture`` (needs a CUDA device).

    A call with n utterances runs at the smallest of ``buckets`` (ascending batch sizes) holding n: its fixed
    buffers take the n utterances' inputs and padding after them (aimed at the scratch row, so no utterance's KV
    state is touched), and one graph per (bucket, sampling settings) is captured, kept as :class:`Graphs` says
    (``GRAPHS_KEPT`` per bucket). Returns the n utterances' :class:`.model.frame.FrameOutputs` (views of the fixed
    outputs: read them before the next call). Raises ValueError for n past the largest bucket, or ``capture``
    off a CUDA device.
    """

    def __init__(self, model: DualAR, k_cache: Tensor, v_cache: Tensor, buckets: Sequence[int], capture: bool):
        _check_capture(capture, k_cache.device)
        self.model, self.frame = model, Frame(model, mode="graph")
        self.k_cache, self.v_cache, self.capture = k_cache, v_cache, capture
        self.scratch, self.last_slot = k_cache.shape[1] - 1, k_cache.shape[3] - 1
        self.buckets = tuple(sorted(set(buckets)))
        self._buffers: dict[int, tuple[FrameInputs, RowsInputs]] = {}
        self.graphs = Graphs(GRAPHS_KEPT * len(self.buckets), k_cache.device) if capture else None

    def bucket(self, n: int) -> int:
        """The batch size a call with ``n`` utterances runs at; ValueError past the largest bucket."""
        for b in self.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} rows in one batched frame: the largest bucket is {self.buckets[-1]}")

    def _static(self, size: int) -> tuple[FrameInputs, RowsInputs]:
        """The fixed buffers of one bucket, made on first use: every entry padding (scratch row, last slot)."""
        if size not in self._buffers:
            cfg, dev, dtype = self.model.cfg, self.k_cache.device, self.k_cache.dtype
            rows = RowsInputs(
                rows=torch.full((size,), self.scratch, dtype=torch.long, device=dev),
                first=torch.zeros(size, dtype=torch.bool, device=dev),
                logits=torch.zeros(size, cfg.num_semantic + 1, dtype=dtype, device=dev),
                hidden=torch.zeros(size, cfg.dim, dtype=dtype, device=dev),
            )
            self._buffers[size] = (_frame_inputs(self.model, size, dev, self.last_slot), rows)
        return self._buffers[size]

    @torch.inference_mode()
    def __call__(self, params: SamplingParams, inputs: FrameInputs, rows: RowsInputs) -> FrameOutputs:
        n = rows.rows.shape[0]
        size = self.bucket(n)
        static, static_rows = self._static(size)
        _copy_into(static, inputs, n)
        _copy_into(static_rows, rows, n)
        if n < size:  # padding: the scratch row at the last slot, drawn from nothing kept
            static_rows.rows[n:].fill_(self.scratch)
            static_rows.first[n:].fill_(False)
            static.pos[n:].fill_(self.last_slot)
            static.use_forced[n:].fill_(0.0)

        def run() -> FrameOutputs:
            return self.frame.rows(params, static, static_rows, self.k_cache, self.v_cache)

        out = run() if self.graphs is None else self.graphs.run((size, params), run)
        return FrameOutputs(*(t[:n] for t in out))
