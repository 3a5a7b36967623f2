"""The graph-mode frame holds nothing a CUDA graph capture refuses, proved on the CPU.

A capture records kernels; it refuses a host tensor made inside the captured region (``lift_fresh``: a
``torch.tensor(...)`` of Python values, copied to the device) and any op that reads a device value on the host
or whose output size depends on values (a sync: ``item``, ``nonzero``, boolean indexing...). The CPU tests run
the same graph-mode frame uncaptured, so they cannot see either: here it runs under a dispatch mode that fails on
every such op, batch 1 (:class:`GraphedFrame`) and batched rows (:class:`GraphedRows`), fp32 and bf16, sampled
and greedy, with and without teacher forcing.
"""

from __future__ import annotations

import pytest
import torch

from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.cudagraphs import GraphedFrame, GraphedRows
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.model.layers import rope_rotation
from tests.backends.torch.capture_support import SETTINGS, RefuseUncapturable, capture_inputs


def test_the_mode_refuses_what_a_capture_refuses():
    """The detector fails on the ops it exists for (a test that cannot fail is a defect): the old RoPE sign
    factor, a host read, boolean indexing, and passes the frame's own kinds of op."""
    x = torch.rand(2, 3)
    for bad in (
        lambda: x * torch.tensor([-1.0, 1.0, 1.0]),
        lambda: x.sum().item(),
        lambda: bool((x > 0).all()),
        lambda: x[x > 0.5],
        lambda: torch.nonzero(x),
    ):
        with pytest.raises(AssertionError, match="capture refuses|hidden nonzero"), RefuseUncapturable():
            bad()
    with RefuseUncapturable() as mode:
        cos, sin = rope_rotation(torch.rand(1, 3, 4, 2))
        torch.topk(x, 2).indices.gather(-1, torch.zeros(2, 1, dtype=torch.long))
    assert cos.shape == sin.shape == (1, 1, 3, 4, 2) and mode.ops > 3


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def backend(request, oracle_dir) -> TorchBackend:
    return TorchBackend(load_checkpoint(oracle_dir), "cpu", request.param, codec_process=False)


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("forced", [False, True])
def test_graph_frame_batch_1_is_capture_safe(backend, settings, forced):
    k, v = backend.model.new_kv_cache()
    graphed = GraphedFrame(backend.model, k, v, capture=False)
    inputs = capture_inputs(backend.cfg, 1, torch.tensor([5]), forced)
    with torch.inference_mode(), RefuseUncapturable() as mode:
        out, ids = graphed(SETTINGS[settings], inputs)
    assert out.codes.shape == (1, backend.cfg.num_codebooks) and mode.ops > 100
    assert ids[0, 1 : 1 + backend.cfg.num_codebooks].tolist() == out.codes[0].tolist() and bool(ids[0, -1])
    assert bool((k[:, :, :, 5] != 0).any())  # the frame ran: it wrote its slot


@pytest.mark.parametrize("settings", SETTINGS)
def test_graph_rows_are_capture_safe(backend, settings):
    """Rows 2 and 0 stepping and row 3 at its frame 0 in the 4 bucket (row 1 padding): what a graph captures (the
    replay of the staged bucket) under the mode."""
    cfg = backend.cfg
    k, v = backend.model.new_kv_cache(batch=4)
    graphed = GraphedRows(backend.model, k, v, (1, 2, 4), capture=False)
    inputs = capture_inputs(cfg, 3, torch.tensor([7, 9, 0]), forced=False)
    calls = [
        (
            row,
            StepInputs(
                None if first else inputs.column[i, :, 0].numpy(),
                int(inputs.pos[i]),
                inputs.noise_slow[i].numpy(),
                inputs.window[i].numpy(),
                inputs.noise_fast[i].numpy(),
            ),
        )
        for i, (row, first) in enumerate([(2, False), (0, False), (3, True)])
    ]
    prefilled = {3: (torch.rand(cfg.num_semantic + 1).to(k.dtype), torch.rand(cfg.dim).to(k.dtype))}
    assert graphed.stage(calls, prefilled) == 4
    with torch.inference_mode(), RefuseUncapturable() as mode:
        out, ids = graphed.replay(SETTINGS[settings], 4)
    assert out.codes.shape == (4, cfg.num_codebooks) and ids.shape == (4, 3 + 2 * cfg.num_codebooks)
    assert mode.ops > 100 and bool(ids[:, -1].all())  # every entry's logits finite
    assert bool((k[:, 2, :, 7] != 0).any()) and bool((k[:, 0, :, 9] != 0).any())
    assert not bool((k[:, 1, :, : cfg.max_seq_len - 1] != 0).any())  # padding wrote only the last slot
