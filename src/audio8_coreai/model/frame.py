"""THE frame of the DualAR: prefill windows, the slow step, the semantic draw with RAS, the fast AR's rows.

Written once (DESIGN.md "Speed is a mode, never a copy"); how the work is issued is a mode of the one
:class:`Frame`, never a copy of its maths:

* ``eager`` (PyTorch on CPU or CUDA): the slot is a host int, written as a slice; queries attend only the filled
  slots, with no mask for the one query of a slow step; the sampler finds its candidates with a host check;
* ``export`` (Core AI assets): static shapes, the slot a traced input written as one slice, attention over all L
  slots under a mask, the in-graph sampler (:mod:`..backends.coreai`);
* ``graph`` (CUDA graphs): as ``export`` but the slot is written by index and the sampler's candidates come from
  a stable sort, so a captured graph reads nothing on the host (:mod:`..backends.torch.cudagraphs`);
* batched rows (continuous batching): :meth:`Frame.slow_rows` steps several utterances, each at its own slot, and
  :meth:`Frame.sample` draws for all of them at once; in ``graph`` mode :meth:`Frame.rows` is the whole batched
  frame in static shapes (the batch's rows of the KV state in place, slots as a tensor), as CUDA graphs capture it.

Frame 0 is drawn from the prefill's last logits and hidden, in every form by one rule (:meth:`Frame.sample`'s
``prefilled``): a frame 0 beside later frames steps a column it drops and takes its prefill's instead (one
``torch.where``); a call of frame 0s alone (no column) steps nothing.

The fast AR has one form in every mode: rows 0 (the slow hidden) and 1 (the semantic code's embedding) in one
pass, then rows 2..C-1, over a per-frame KV buffer. Randomness is an input (uniform noise), the RAS window is
an input owned by the host, and teacher forcing (``forced``/``use_forced``) lets one pass measure both the logits
and the sampler against a recording.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from ..config import SamplingParams
from ..sampling import greedy, greedy_semantic, sample_semantic, sample_top_k_top_p
from .dualar import DualAR
from .layers import IndexKV, KVStep, RowsKV, RowSlotsKV, SpanKV, causal_cache_mask

PREFILL_WIDTH = 32
"""Columns per prefill window (the Core AI prefill asset's static width; eager runs a shorter last window)."""

FrameMode = Literal["eager", "export", "graph"]


@dataclass
class FrameInputs:
    """One frame's inputs for B utterances (batch-first tensors on the model's device).

    ``noise_slow`` float32 [B, 2, V+1] (the semantic draw and the RAS redraw), ``window`` int64 [B, W] RAS window
    of vocabulary ids (-1 = empty), ``noise_fast`` float32 [B, C-1, codebook_size], ``forced`` int64 [B, 1+C] a
    column (semantic id, c_0..c_{C-1}) taken instead of the draws where ``use_forced`` float32 [B] is 1.
    ``column`` int64 [B, 1+C, 1] is the previous frame's column and ``pos`` its slot and RoPE position: an int in
    ``eager`` mode (a list of ints for batched rows, with ``rows`` the KV row of each entry), an int64 tensor [1]
    otherwise, [B] for :meth:`Frame.rows`. ``column`` None: every entry is a frame 0 (see :meth:`Frame.forward`).
    """

    noise_slow: Tensor
    window: Tensor
    noise_fast: Tensor
    forced: Tensor
    use_forced: Tensor
    column: Tensor | None = None
    pos: Tensor | int | list[int] = 0
    rows: list[int] | None = None


@dataclass
class Prefilled:
    """Frame 0's inputs for B utterances: ``first`` bool [B] True for an entry whose frame is its frame 0, drawn from
    its prefill's last ``logits`` [B, V+1] and ``hidden`` [B, dim] (model dtype) instead of a slow step (the
    entries not first hold anything finite there). See :meth:`Frame.forward`."""

    first: Tensor
    logits: Tensor
    hidden: Tensor


class FrameOutputs(NamedTuple):
    """A frame for B utterances: ``semantic`` int64 [B] id, ``codes`` int64 [B, C] (codes[:, 0] is the semantic
    code, eos -> 0, as the publisher's generate), ``fast_logits`` [B, C-1, codebook_size], the sampler's own
    draws ``sampled_semantic`` [B] and ``sampled_codes`` [B, C] (differ from the kept ones only under teacher
    forcing), and the slow ``logits`` [B, V+1] and ``hidden`` [B, dim] the frame was drawn from."""

    semantic: Tensor
    codes: Tensor
    fast_logits: Tensor
    sampled_semantic: Tensor
    sampled_codes: Tensor
    logits: Tensor
    hidden: Tensor


def packed(out: FrameOutputs) -> Tensor:
    """What the frame loop reads of a frame, int64 [B, 3 + 2C]: the semantic id, the C codes kept, the sampler's
    own semantic id and C codes, then 1 where the row's slow and fast logits are all finite, else 0 (NaN or inf
    mean damaged weights). One small copy to the host a frame, where the outputs are megabytes
    (:func:`unpacked` reads it)."""
    finite = torch.isfinite(out.logits).all(-1) & torch.isfinite(out.fast_logits).flatten(1).all(-1)
    ids = (out.semantic[:, None], out.codes, out.sampled_semantic[:, None], out.sampled_codes, finite[:, None])
    return torch.cat([t.to(torch.int64) for t in ids], dim=1)


def unpacked(row: np.ndarray) -> tuple[int, np.ndarray, int, np.ndarray, bool]:
    """One row of :func:`packed` (int64 [3 + 2C], on the host) as (semantic id, codes [C], sampled semantic id,
    sampled codes [C], finite)."""
    c = (row.shape[0] - 3) // 2
    return int(row[0]), row[1 : 1 + c], int(row[1 + c]), row[2 + c : 2 + 2 * c], bool(row[-1])


class Frame(nn.Module):
    """The frame maths over ``model`` in ``mode`` (see the module docstring); the KV state is the caller's.

    In ``eager`` and ``graph`` modes the fast AR's per-frame KV buffer is allocated once per batch size and
    reused; in ``export`` mode it is made inside the graph (no state besides the slow AR's KV cache).
    """

    def __init__(self, model: DualAR, mode: FrameMode = "eager"):
        super().__init__()
        if mode not in ("eager", "export", "graph"):
            raise ValueError(f"unknown frame mode {mode!r}: eager, export or graph")
        self.model, self.mode = model, mode
        self._fast_kv: dict[int, tuple[Tensor, Tensor]] = {}

    # --- the slow AR -------------------------------------------------------------------------------------

    def _slow_kv(self, pos: Tensor | int, width: int, cache_len: int, device: torch.device) -> KVStep:
        """Where ``width`` columns from slot ``pos`` go, and what they attend, in this mode."""
        if self.mode == "eager":
            start = int(pos)
            if width == 1:  # one query at the newest slot: every filled slot is visible, no mask
                return SpanKV(start, start + 1)
            first = torch.tensor([start], device=device)
            return SpanKV(start, start + width, causal_cache_mask(first, width, cache_len))
        mask = causal_cache_mask(pos, width, cache_len)
        if self.mode == "graph":
            return IndexKV(pos.long() + torch.arange(width, device=device), mask)
        start = pos[0].item()  # export: one slice from the traced slot; the checks let torch.export bound it
        torch._check(start >= 0)
        torch._check(start + width <= cache_len)
        return SpanKV(start, None, mask)

    def prefill(self, codes: Tensor, pos: Tensor | int, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """One prefill window: codes int64 [B, 1+C, W] at slots (and RoPE positions) ``pos .. pos+W-1`` of
        ``k_cache``/``v_cache`` [n_layer, B, n_kv, L, D] (written in place). Returns compact logits [B, W, V+1]
        and post-norm hidden [B, W, dim].

        Padding columns past a prompt's end (the static window) are harmless: later frames overwrite their
        slots before any query at or above them attends there.
        """
        width = codes.shape[-1]
        kv = self._slow_kv(pos, width, k_cache.shape[3], codes.device)
        if isinstance(pos, Tensor):
            rope_pos = (pos.long() + torch.arange(width, device=codes.device)).expand(codes.shape[0], width)
        else:
            rope_pos = pos
        return self.model.slow(codes, rope_pos, k_cache, v_cache, kv)

    def slow_step(self, column: Tensor, pos: Tensor | int, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """The slow AR on the previous column int64 [B, 1+C, 1] at slot ``pos`` (batch-uniform): compact logits
        [B, V+1] and post-norm hidden [B, dim]."""
        logits, hidden = self.prefill(column, pos, k_cache, v_cache)
        return logits[:, -1], hidden[:, -1]

    def slow_rows(
        self,
        column: Tensor,
        rows: list[int],
        positions: list[int],
        k_cache: Tensor,
        v_cache: Tensor,
        gather: bool | None = None,
    ) -> tuple[Tensor, Tensor]:
        """:meth:`slow_step` for n utterances at their own points (batched rows, ``eager`` mode): column int64
        [n, 1+C, 1], utterance j in batch row ``rows[j]`` of ``k_cache``/``v_cache`` [n_layer, max_batch, n_kv,
        L, D] at slot and RoPE position ``positions[j]``. Returns logits [n, V+1] and hidden [n, dim], each row
        equal to its batch-1 step's up to the rounding of the batched matmuls. ``gather``: attention in one
        call over the gathered rows (see :class:`.layers.RowsKV`); None gathers on CUDA, where each call is a
        launch. The static form is :meth:`rows`."""
        dev = column.device
        gathered = None
        if dev.type == "cuda" if gather is None else gather:
            pos_t = torch.tensor(positions, device=dev)
            mask = (torch.arange(max(positions) + 1, device=dev)[None, :] <= pos_t[:, None])[:, None, None]
            gathered = (torch.tensor(rows, device=dev), pos_t, mask)
        rope_pos = torch.tensor(positions, device=dev)[:, None]
        logits, hidden = self.model.slow(column, rope_pos, k_cache, v_cache, RowsKV(rows, positions, gathered))
        return logits[:, 0], hidden[:, 0]

    # --- the draws and the fast AR ----------------------------------------------------------------------

    def fast_kv(self, batch: int) -> tuple[Tensor, Tensor]:
        """The fast AR's per-frame KV buffer for ``batch`` rows (see :meth:`.dualar.FastAR.new_kv_buffer`)."""
        if self.mode == "export":
            return self.model.fast.new_kv_buffer(batch)
        if batch not in self._fast_kv:
            self._fast_kv[batch] = self.model.fast.new_kv_buffer(batch)
        return self._fast_kv[batch]

    def sample(
        self,
        params: SamplingParams,
        logits: Tensor,
        hidden: Tensor,
        inputs: FrameInputs,
        prefilled: Prefilled | None = None,
    ) -> FrameOutputs:
        """Draw a frame from slow ``logits`` [B, V+1] and ``hidden`` [B, dim]: the semantic id (with RAS), then
        the fast AR's rows, each fed the code kept for the row before. The entries ``prefilled.first`` take their
        prefill's logits and hidden instead (frame 0: the one place it is decided)."""
        if prefilled is not None:
            first = prefilled.first[:, None]
            logits = torch.where(first, prefilled.logits, logits)
            hidden = torch.where(first, prefilled.hidden, hidden)
        cfg, p, draws = self.model.cfg, params, self.model.draws
        how = {"eager": "eager", "graph": "sorted", "export": "static"}[self.mode]  # the candidates (sampling.py)
        if p.do_sample:
            sampled_sem, _, _ = sample_semantic(
                logits,
                inputs.noise_slow,
                inputs.window,
                p,
                cfg.semantic_begin_id,
                cfg.eos_token_id,
                candidates=how,
                draw=draws,
            )
        else:
            sampled_sem = greedy_semantic(logits, semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id)
        mix = inputs.use_forced.to(torch.long)
        semantic = sampled_sem + mix * (inputs.forced[:, 0] - sampled_sem)
        code = (semantic - cfg.semantic_begin_id).clamp(0, cfg.codebook_size - 1)
        sampled, kept = [code], [code]

        def draw(row: int, lg: Tensor) -> Tensor:
            if p.do_sample:
                drawn = sample_top_k_top_p(
                    lg, inputs.noise_fast[:, row - 1], p.top_k, p.top_p, p.temperature, candidates=how, draw=draws
                )
            else:
                drawn = greedy(lg)
            sampled.append(drawn)
            kept.append(drawn + mix * (inputs.forced[:, 1 + row] - drawn))
            return kept[-1]

        fast_logits = self.fast_rows(hidden, code, draw)
        return FrameOutputs(
            semantic,
            torch.stack(kept, 1),
            torch.stack(fast_logits, 1),
            sampled_sem,
            torch.stack(sampled, 1),
            logits,
            hidden,
        )

    def fast_rows(self, hidden: Tensor, code: Tensor, draw: Callable[[int, Tensor], Tensor]) -> list[Tensor]:
        """The fast AR's rows of one frame: rows 0 (``hidden`` [B, dim]) and 1 (the semantic code int64 [B]) in one
        pass, then rows 2..C-1, each fed the code ``draw(row - 1, logits)`` returns for the row before (``draw``
        is also called for the last row). Returns the logits of rows 1..C-1, each [B, codebook_size]."""
        fast, c = self.model.fast, self.model.cfg.num_codebooks
        k_buf, v_buf = self.fast_kv(hidden.shape[0])
        act = fast.fast_norm.weight.dtype  # the activations' dtype (embeddings may be stored lower)
        x = torch.stack([hidden.to(act), fast.fast_embeddings(code).to(act)], dim=1)  # rows 0 and 1 [B, 2, dim]
        logits = [fast(x, 0, k_buf, v_buf)]
        for row in range(2, c):
            code = draw(row - 1, logits[-1])
            logits.append(fast(fast.fast_embeddings(code).to(act).unsqueeze(1), row, k_buf, v_buf))
        draw(c - 1, logits[-1])
        return logits

    def rows(
        self, params: SamplingParams, inputs: FrameInputs, prefilled: Prefilled, k_cache: Tensor, v_cache: Tensor
    ) -> FrameOutputs:
        """One frame for B utterances at their own slots in static shapes (``graph`` mode, batched CUDA graphs):
        utterance j is batch row j of ``k_cache``/``v_cache`` [n_layer, B, n_kv, L, D] (the caller passes a view of
        its rows, so attention reads the state in place), its slow step on ``inputs.column`` at slot and RoPE
        position ``inputs.pos[j]`` (int64 [B]); then :meth:`sample` for all, frame-0 rows (``prefilled``) drawn from
        their prefill.

        A row whose step is dropped (a frame 0, a row not in the call) steps at the last slot L-1: harmless, as a
        row at slot p attends slots [0, p] only after writing slot p itself."""
        positions = inputs.pos
        visible = torch.arange(k_cache.shape[3], device=positions.device)[None, :] <= positions[:, None]  # [B, L]
        kv = RowSlotsKV(positions, visible[:, None, None])
        logits, hidden = self.model.slow(inputs.column, positions[:, None], k_cache, v_cache, kv)
        return self.sample(params, logits[:, 0], hidden[:, 0], inputs, prefilled)

    def forward(
        self,
        params: SamplingParams,
        inputs: FrameInputs,
        k_cache: Tensor | None,
        v_cache: Tensor | None,
        prefilled: Prefilled | None = None,
    ) -> FrameOutputs:
        """One frame for B utterances: the slow step on ``inputs.column`` at ``inputs.pos`` (batched rows at their
        own slots when ``inputs.rows`` is set, ``eager`` mode), then :meth:`sample`, the entries ``prefilled.first``
        drawn from their prefill (a frame 0 steps a column it drops). With no column every entry is a frame 0:
        drawn from ``prefilled`` alone, no slow step and no KV state (the eager first frame, Core AI's
        ``first_frame`` function)."""
        if inputs.column is None:
            return self.sample(params, prefilled.logits, prefilled.hidden, inputs)
        if inputs.rows is not None:
            logits, hidden = self.slow_rows(inputs.column, inputs.rows, inputs.pos, k_cache, v_cache)
        else:
            logits, hidden = self.slow_step(inputs.column, inputs.pos, k_cache, v_cache)
        return self.sample(params, logits, hidden, inputs, prefilled)
