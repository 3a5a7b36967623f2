"""The frame as one CUDA graph: :class:`.model.frame.Frame` in ``graph`` mode, captured and replayed.

An eager frame on a GPU is launch-bound: the slow step, nine fast-AR passes and ten draws issue a few thousand
small kernels, each paying the host's launch cost. The frame's ``graph`` mode has static shapes, the slot an
input tensor and no host read, so it can be captured once per set of sampling settings (they are Python
constants in the graph) and replayed with one launch per frame:

* the inputs are copied into fixed buffers, the graph replays, and its outputs (fixed tensors, overwritten by
  the next replay) are returned for the caller to copy to the host;
* the KV state is the caller's pair of tensors, written in place at the slot in ``pos``: they must stay the same
  tensors for the runner's life (zeroing them in place between utterances is fine);
* attention reads all ``L`` slots under a mask (no ``[:pos]`` slice, whose shape would change every frame).

With ``capture`` False (the CPU, the tests) the same buffers feed the module eagerly: same maths, no graph.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

import torch
from torch import Tensor

from ...config import SamplingParams
from ...model.dualar import DualAR
from ...model.frame import Frame, FrameInputs, FrameOutputs
from ...settings import DEFAULTS

GRAPHS_KEPT = DEFAULTS.cuda_graphs_kept
"""Captured graphs kept, one per set of sampling settings, least recently used dropped first."""

_CAPTURE = threading.Lock()  # one capture at a time in this process (several model instances serve in threads)


class GraphedFrame:
    """:class:`.model.frame.Frame` (``graph`` mode) on ``model`` over the KV state ``k_cache``/``v_cache``
    [n_layer, 1, n_kv, L, D], batch 1, replayed as a CUDA graph when ``capture`` (needs a CUDA device).

    Call with the sampling settings and a batch-1 :class:`.model.frame.FrameInputs` (``pos`` an int64 tensor
    [1]); returns the frame's :class:`.model.frame.FrameOutputs`, which the next call overwrites, whatever its
    settings (the graphs share one memory pool): read them first.
    Raises ValueError for ``capture`` off a CUDA device.
    """

    def __init__(self, model: DualAR, k_cache: Tensor, v_cache: Tensor, capture: bool):
        dev = k_cache.device
        if capture and dev.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the KV state is on {dev}")
        cfg = model.cfg
        self.frame = Frame(model, mode="graph")
        self.k_cache, self.v_cache, self.capture = k_cache, v_cache, capture
        c = cfg.num_codebooks
        self.inputs = FrameInputs(
            noise_slow=torch.zeros(1, 2, cfg.num_semantic + 1, device=dev),
            window=torch.zeros(1, cfg.ras_window_size, dtype=torch.long, device=dev),
            noise_fast=torch.zeros(1, c - 1, cfg.codebook_size, device=dev),
            forced=torch.zeros(1, 1 + c, dtype=torch.long, device=dev),
            use_forced=torch.zeros(1, device=dev),
            column=torch.zeros(1, 1 + c, 1, dtype=torch.long, device=dev),
            pos=torch.zeros(1, dtype=torch.long, device=dev),
        )
        self._graphs: OrderedDict[SamplingParams, tuple[torch.cuda.CUDAGraph, FrameOutputs]] = OrderedDict()
        self._pool = None  # one memory pool shared by every captured graph

    @torch.inference_mode()
    def __call__(self, params: SamplingParams, inputs: FrameInputs) -> FrameOutputs:
        for field in dataclasses.fields(FrameInputs):
            getattr(self.inputs, field.name).copy_(getattr(inputs, field.name))
        if not self.capture:
            return self.frame(params, self.inputs, self.k_cache, self.v_cache)
        entry = self._graphs.get(params)
        if entry is None:
            entry = self._graphs[params] = self._capture(params)
            while len(self._graphs) > GRAPHS_KEPT:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(params)
        graph, outputs = entry
        graph.replay()
        return outputs

    def _capture(self, params: SamplingParams) -> tuple[torch.cuda.CUDAGraph, FrameOutputs]:
        """The frame for ``params`` captured as a CUDA graph. The warm-up runs on the inputs already in the buffers
        (this frame's own), so the KV slot it writes holds the values the replay writes again."""
        side = torch.cuda.Stream(self.k_cache.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (library handles, workspaces) as PyTorch advises
            for _ in range(2):
                self.frame(params, self.inputs, self.k_cache, self.v_cache)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (another request's codec, say) do not void this capture
        with _CAPTURE, torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = self.frame(params, self.inputs, self.k_cache, self.v_cache)
        self._pool = graph.pool()
        return graph, outputs
