"""The torch frame's host edge in eager mode: host steps in (:func:`frame_inputs`), host results out
(:func:`frame_results`), for batch 1 and the batched rows alike."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ...checkpoint import damaged
from ...model.frame import FrameInputs, FrameOutputs, unpacked
from ..base import FrameResult, StepInputs
from .codec_streams import MODEL_FILE


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


def frame_inputs(steps: Sequence[StepInputs], device: torch.device) -> FrameInputs:
    """The eager frame's inputs for ``steps`` (one utterance each, in order) on ``device``: noise, RAS windows and
    forcing stacked batch-first (:class:`...model.frame.FrameInputs`); the previous columns and slots are the
    caller's (batch 1 steps at one slot, batched rows each at its own). The one way host steps become a frame's
    tensors in eager mode; the static graphs copy into fixed buffers instead (:mod:`.staging`, :mod:`.cudagraphs`)."""
    c = len(steps[0].noise_fast) + 1
    forced = np.zeros((len(steps), 1 + c), dtype=np.int64)
    use_forced = np.zeros(len(steps), dtype=np.float32)
    for i, x in enumerate(steps):
        if x.forced is not None:
            forced[i], use_forced[i] = x.forced, 1.0
    return FrameInputs(
        noise_slow=torch.as_tensor(np.stack([x.noise_slow for x in steps]), dtype=torch.float32, device=device),
        window=torch.as_tensor(np.stack([np.asarray(x.window, dtype=np.int64) for x in steps]), device=device),
        noise_fast=torch.as_tensor(np.stack([x.noise_fast for x in steps]), dtype=torch.float32, device=device),
        forced=torch.as_tensor(forced, device=device),
        use_forced=torch.as_tensor(use_forced, device=device),
    )
