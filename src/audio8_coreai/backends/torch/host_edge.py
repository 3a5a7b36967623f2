"""The torch frame's host edge: host steps in (:func:`pack`, :func:`frame_inputs`, :func:`prefilled`), host results out
(:func:`frame_results`), the next noise started (:func:`draw_ahead`), for batch 1, the batched rows and the graphs'
fixed buffers alike."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ...checkpoint import MODEL_FILE, damaged
from ...config import ModelConfig
from ...model.frame import FrameInputs, FrameOutputs, Prefilled, unpacked
from ..base import FrameResult, StepInputs


def frame_results(
    out: FrameOutputs, ids: torch.Tensor, rows: Sequence[int], logits: Sequence[bool]
) -> list[FrameResult]:
    """Entries ``rows`` of a frame's outputs as :class:`FrameResult` s (NumPy on the host): their ids from
    ``ids`` (:func:`...model.frame.packed` of ``out``, one copy), and the logits and hidden (one copy each, whatever
    the batch) for the entries whose ``logits`` is True.

    Raises CheckpointError naming the model file when an entry's logits are not finite (damaged weights).
    """
    host = ids.cpu().numpy()
    full = None
    if any(logits):
        full = [t.float().cpu().numpy() for t in (out.logits, out.hidden, out.fast_logits)]
    results = []
    for row, want in zip(rows, logits):
        semantic, codes, sampled_semantic, sampled_codes, finite = unpacked(host[row])
        if not finite:
            raise damaged("model", MODEL_FILE)
        extra = {}
        if want and full is not None:
            extra = {"logits": full[0][row], "hidden": full[1][row], "fast_logits": full[2][row]}
        results.append(FrameResult(semantic, codes, sampled_semantic, sampled_codes, **extra))
    return results


def draw_ahead(steps: Sequence[StepInputs]) -> None:
    """Each step's :attr:`..base.StepInputs.draw_ahead`, where it has one: called once its frame is launched."""
    for x in steps:
        if x.draw_ahead is not None:
            x.draw_ahead()


def input_shapes(cfg: ModelConfig, size: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The shape and dtype of each of a frame's host inputs for ``size`` entries, by name: the fields of
    :class:`...model.frame.FrameInputs` (``pos`` int64 [size]) and ``first`` (bool [size], a frame 0)."""
    c = cfg.num_codebooks
    return {
        "noise_slow": ((size, 2, cfg.num_semantic + 1), torch.float32),
        "window": ((size, cfg.ras_window_size), torch.int64),
        "noise_fast": ((size, c - 1, cfg.codebook_size), torch.float32),
        "forced": ((size, 1 + c), torch.int64),
        "use_forced": ((size,), torch.float32),
        "column": ((size, 1 + c, 1), torch.int64),
        "pos": ((size,), torch.int64),
        "first": ((size,), torch.bool),
    }


def pack(steps: Sequence[StepInputs], entries: Sequence[int], host: Mapping[str, np.ndarray], last_slot: int) -> None:
    """Write ``steps`` into entries ``entries`` of the host arrays ``host`` (shaped as :func:`input_shapes`): THE
    packer of host steps into a frame's inputs, for batch 1, the eager rows and the graphs' fixed buffers
    (:mod:`.staging`). A frame 0 (no column) is ``first``, with a zero column at ``last_slot``: a slot no entry
    attends before writing it itself, so the step it drops is harmless (:meth:`...model.frame.Frame.rows`)."""
    for e, x in zip(entries, steps):
        host["noise_slow"][e] = x.noise_slow
        host["noise_fast"][e] = x.noise_fast
        host["window"][e] = x.window
        host["use_forced"][e] = x.forced is not None
        if x.forced is not None:
            host["forced"][e] = x.forced
        host["first"][e] = x.column is None
        host["column"][e, :, 0] = 0 if x.column is None else x.column
        host["pos"][e] = last_slot if x.column is None else x.pos


def frame_inputs(
    cfg: ModelConfig, steps: Sequence[StepInputs], device: torch.device, rows: Sequence[int] | None = None
) -> FrameInputs:
    """The eager frame's inputs for ``steps`` (one utterance each, in order) on ``device`` (:func:`pack`): batch 1
    at an int slot, or the batched rows ``rows`` (the KV row of each step) at a list of slots; no column when every
    step is a frame 0. The graphs' buffers are packed in place instead (:mod:`.staging`)."""
    buffers = {k: torch.zeros(shape, dtype=dt) for k, (shape, dt) in input_shapes(cfg, len(steps)).items()}
    host = {k: t.numpy() for k, t in buffers.items()}
    pack(steps, range(len(steps)), host, cfg.max_seq_len - 1)
    d = {k: t.to(device) for k, t in buffers.items()}
    inputs = FrameInputs(d["noise_slow"], d["window"], d["noise_fast"], d["forced"], d["use_forced"], d["column"])
    if host["first"].all():
        inputs.column = None
    elif rows is None:
        inputs.pos = int(host["pos"][0])
    else:
        inputs.pos, inputs.rows = host["pos"].tolist(), list(rows)
    return inputs


def prefilled(kept: Sequence[tuple[torch.Tensor, torch.Tensor] | None]) -> Prefilled | None:
    """Frame 0's inputs (:class:`...model.frame.Prefilled`) for entries whose step is a frame 0 (``kept``: its
    prefill's last logits [V+1] and hidden [dim] on the device) or not (None); None when no entry is a frame 0."""
    some = next((k for k in kept if k is not None), None)
    if some is None:
        return None
    logits = [torch.zeros_like(some[0]) if k is None else k[0] for k in kept]
    hidden = [torch.zeros_like(some[1]) if k is None else k[1] for k in kept]
    first = torch.tensor([k is not None for k in kept], device=some[0].device)
    return Prefilled(first, torch.stack(logits), torch.stack(hidden))
