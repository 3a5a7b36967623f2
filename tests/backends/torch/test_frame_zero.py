"""The frame's host edge (backends/torch/host_edge.py) and its one frame-0 rule (model/frame.py Frame.sample's
``prefilled``): one packer for batch 1, the eager rows and the graphs' buffers; a frame 0 beside later frames steps a
column it drops, a call of frame 0s alone steps nothing; every form draws frame 0 alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.host_edge import frame_inputs, input_shapes, pack, prefilled
from audio8_coreai.backends.torch.rows import TorchBatchFrames
from audio8_coreai.backends.torch.staging import Staging
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.config import SamplingParams

PARAMS = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)


@pytest.fixture(scope="module")
def backends(oracle_dir) -> dict[str, TorchBackend]:
    ckpt = load_checkpoint(oracle_dir)
    return {
        mode: TorchBackend(ckpt, "cpu", "fp32", frame_mode=mode, codec_process=False) for mode in ("eager", "graph")
    }


def _step(cfg, rng, column=None, pos=0, forced=None) -> StepInputs:
    noise_slow = rng.random((2, cfg.num_semantic + 1), dtype=np.float32).clip(1e-6)
    noise_fast = rng.random((cfg.num_codebooks - 1, cfg.codebook_size), dtype=np.float32).clip(1e-6)
    window = np.arange(cfg.ras_window_size, dtype=np.int64)
    return StepInputs(column, pos, noise_slow, window, noise_fast, forced, logits=True)


def _prompt(cfg, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    prompt = np.zeros((cfg.num_codebooks + 1, n), dtype=np.int64)
    prompt[0] = rng.integers(cfg.semantic_begin_id, cfg.semantic_end_id, n)
    prompt[1:] = rng.integers(0, cfg.codebook_size, (cfg.num_codebooks, n))
    return prompt


def test_pack_writes_a_frame_0_as_a_zero_column_at_the_last_slot(backends):
    cfg = backends["eager"].cfg
    rng = np.random.default_rng(0)
    column = np.arange(1, cfg.num_codebooks + 2)
    forced = np.full(cfg.num_codebooks + 1, 3)
    steps = [_step(cfg, rng), _step(cfg, rng, column, 9, forced)]
    host = {k: torch.zeros(shape, dtype=dt).numpy() for k, (shape, dt) in input_shapes(cfg, 3).items()}
    pack(steps, [2, 0], host, 127)
    assert host["first"].tolist() == [False, False, True]
    assert host["pos"].tolist() == [9, 0, 127]
    assert host["column"][0, :, 0].tolist() == column.tolist() and not host["column"][2].any()
    assert host["use_forced"].tolist() == [1.0, 0.0, 0.0] and host["forced"][0].tolist() == forced.tolist()
    np.testing.assert_array_equal(host["noise_slow"][2], steps[0].noise_slow)
    np.testing.assert_array_equal(host["window"][0], steps[1].window)


def test_frame_inputs_in_each_form(backends):
    cfg = backends["eager"].cfg
    rng = np.random.default_rng(1)
    dev, last = torch.device("cpu"), cfg.max_seq_len - 1
    column = np.arange(cfg.num_codebooks + 1)
    first, later = _step(cfg, rng), _step(cfg, rng, column, 11)
    assert frame_inputs(cfg, [first, first], dev).column is None  # frame 0s alone: nothing to step
    one = frame_inputs(cfg, [later], dev)
    assert one.pos == 11 and one.rows is None and one.column[0, :, 0].tolist() == column.tolist()
    rows = frame_inputs(cfg, [later, first], dev, rows=[3, 1])
    assert rows.pos == [11, last] and rows.rows == [3, 1] and rows.column.shape == (2, cfg.num_codebooks + 1, 1)
    staged = Staging(cfg, 1, dev, torch.float32)  # batch 1 in graph mode (GraphedFrame.step)
    logits, hidden = torch.full((cfg.num_semantic + 1,), 2.0), torch.full((cfg.dim,), -1.0)
    staged.load([(0, later)], {})
    assert staged.inputs.pos.tolist() == [11] and staged.inputs.column[0, :, 0].tolist() == column.tolist()
    assert staged.prefilled.first.tolist() == [False]
    staged.load([(0, first)], {0: (logits, hidden)})
    assert staged.inputs.pos.tolist() == [last] and not staged.inputs.column.any()  # a graph always steps
    assert staged.prefilled.first.tolist() == [True] and staged.prefilled.logits[0].tolist() == logits.tolist()


def test_prefilled_marks_the_frame_0_entries():
    logits, hidden = torch.full((5,), 2.0), torch.full((3,), -1.0)
    assert prefilled([None, None]) is None
    got = prefilled([None, (logits, hidden)])
    assert got.first.tolist() == [False, True]
    assert got.logits.tolist() == [[0.0] * 5, [2.0] * 5] and got.hidden.tolist() == [[0.0] * 3, [-1.0] * 3]


@torch.inference_mode()
def test_frame_0_is_drawn_alike_in_every_form(backends):
    """Batch 1 eager (no slow step), batch 1 in graph mode (a zero column stepped at the last slot, dropped by the
    blend) and a frame 0 in the eager rows beside a later frame: one draw, the prefill's logits exactly."""
    eager, graph = backends["eager"], backends["graph"]
    cfg = eager.cfg
    prompt = _prompt(cfg, 7, 2)
    step = _step(cfg, np.random.default_rng(3))
    results = []
    for b in (eager, graph):
        logits, _ = b.prefill(prompt)
        results.append(b.frame(PARAMS, step))
    np.testing.assert_array_equal(results[0].logits, logits)
    last = cfg.max_seq_len - 1
    assert not eager.k_cache[:, :, :, 7:].any()  # the eager frame 0 stepped nothing
    assert graph.k_cache[:, :, :, last].any() and not graph.k_cache[:, :, :, 7:last].any()  # only the last slot
    torch.testing.assert_close(graph.k_cache[:, :, :, :7], eager.k_cache[:, :, :, :7], rtol=0, atol=0)

    batch = TorchBatchFrames(eager, 2)
    other = _prompt(cfg, 5, 4)
    for row, p in enumerate((other, prompt)):
        assert batch.acquire() == row
        batch.prefill(row, p)
    later = _step(cfg, np.random.default_rng(5), other[:, -1], 5)
    mixed = batch.frames(PARAMS, [(0, later), (1, step)])
    for got in (*results[1:], mixed[1]):
        assert got.semantic == results[0].semantic and np.array_equal(got.codes, results[0].codes)
        np.testing.assert_array_equal(got.logits, results[0].logits)
        np.testing.assert_allclose(got.fast_logits, results[0].fast_logits, rtol=0, atol=1e-5)
    eager.prefill(other)  # the later frame beside it: its own batch-1 frame
    want = eager.frame(PARAMS, later)
    assert mixed[0].semantic == want.semantic and np.array_equal(mixed[0].codes, want.codes)
    np.testing.assert_allclose(mixed[0].logits, want.logits, rtol=0, atol=1e-5)
