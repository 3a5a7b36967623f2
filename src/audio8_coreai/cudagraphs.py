"""The frame as one CUDA graph: :class:`.graphs.Frame` (static shapes, sampler inside) captured and replayed.

An eager frame on a GPU is launch-bound: the slow step, nine fast-AR passes and ten draws issue a few thousand
small kernels, each paying the host's launch cost. :class:`.graphs.Frame` is the form already built for Core AI
(static shapes, the slot an input tensor, no host read), so it can be captured once per set of sampling
settings (they are Python constants in the graph) and replayed with one launch per frame:

* the inputs are copied into fixed buffers, the graph replays, and its outputs (fixed tensors, overwritten by
  the next replay) are returned for the caller to copy to the host;
* the KV state is the caller's pair of tensors, written in place at the slot in ``pos``: they must stay the same
  tensors for the runner's life (zeroing them in place between utterances is fine);
* attention reads all ``L`` slots under a mask (no ``[:pos]`` slice, whose shape would change every frame).

With ``capture`` False (the CPU, the tests) the same buffers feed the module eagerly: same maths, no graph.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch
from torch import Tensor

from .graphs import Frame, SamplingParams
from .model.dualar import DualAR
from .settings import DEFAULTS

GRAPHS_KEPT = DEFAULTS.cuda_graphs_kept
"""Captured graphs kept, one per set of sampling settings, least recently used dropped first."""

_CAPTURE = threading.Lock()  # one capture at a time in this process (several model instances serve in threads)


class GraphedFrame:
    """:class:`.graphs.Frame` on ``model`` over the KV state ``k_cache``/``v_cache`` [n_layer, 1, n_kv, L, D],
    batch 1, replayed as a CUDA graph when ``capture`` (needs a CUDA device).

    Call with Frame's inputs (column int64 [1, 1+C, 1], pos int64 [1], noise_slow float32 [1, 2, V+1], window
    int64 [1, W], noise_fast float32 [1, C-1, codebook_size], forced int64 [1, 1+C], use_forced float32 [1]);
    returns Frame's outputs (semantic, codes, fast_logits, sampled_semantic, sampled_codes, logits, hidden),
    which the next call overwrites, whatever its settings (the graphs share one memory pool): read them first.
    Raises ValueError for ``capture`` off a CUDA device.
    """

    def __init__(self, model: DualAR, k_cache: Tensor, v_cache: Tensor, capture: bool):
        dev = k_cache.device
        if capture and dev.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; the KV state is on {dev}")
        cfg = model.cfg
        self.model, self.k_cache, self.v_cache, self.capture = model, k_cache, v_cache, capture
        c = cfg.num_codebooks
        self.inputs = (torch.zeros(1, 1 + c, 1, dtype=torch.long, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev),
                       torch.zeros(1, 2, cfg.num_semantic + 1, device=dev),
                       torch.zeros(1, cfg.ras_window_size, dtype=torch.long, device=dev),
                       torch.zeros(1, c - 1, cfg.codebook_size, device=dev),
                       torch.zeros(1, 1 + c, dtype=torch.long, device=dev),
                       torch.zeros(1, device=dev))
        self._frames: OrderedDict[SamplingParams, tuple[Frame, torch.cuda.CUDAGraph | None, tuple]] = OrderedDict()
        self._pool = None  # one memory pool shared by every captured graph

    @torch.inference_mode()
    def __call__(self, params: SamplingParams, column: Tensor, pos: Tensor, noise_slow: Tensor, window: Tensor,
                 noise_fast: Tensor, forced: Tensor, use_forced: Tensor) -> tuple[Tensor, ...]:
        for buf, x in zip(self.inputs, (column, pos, noise_slow, window, noise_fast, forced, use_forced)):
            buf.copy_(x)
        entry = self._frames.get(params)
        if entry is None:
            entry = self._frames[params] = self._build(params)
            while len(self._frames) > GRAPHS_KEPT:
                self._frames.popitem(last=False)
        else:
            self._frames.move_to_end(params)
        frame, graph, outputs = entry
        if graph is None:
            return frame(*self._args())
        graph.replay()
        return outputs

    def _args(self) -> tuple:
        column, pos, *tail = self.inputs
        return (column, pos, self.k_cache, self.v_cache, *tail)

    def _build(self, params: SamplingParams) -> tuple[Frame, torch.cuda.CUDAGraph | None, tuple]:
        """Frame for ``params``; captured when ``capture``. The warm-up runs on the inputs already in the buffers
        (this frame's own), so the KV slot it writes holds the values the replay writes again."""
        frame = Frame(self.model, params, index_write=True)
        if not self.capture:
            return frame, None, ()
        side = torch.cuda.Stream(self.k_cache.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (library handles, workspaces) as PyTorch advises
            for _ in range(2):
                frame(*self._args())
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls of other threads (another request's codec, say) do not void this capture
        with _CAPTURE, torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            outputs = frame(*self._args())
        self._pool = graph.pool()
        return frame, graph, outputs
