"""Batched frames as CUDA graphs (backends/torch/cudagraphs.py GraphedRows): the static batched frame, rows
padded up to a bucket, gives the eager batched rows' codes on the CPU; captured, on CUDA. CUDA graphs are the
default on CUDA only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from audio8_coreai import TTS
from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.cudagraphs import bucket_sizes
from audio8_coreai.backends.torch.rows import TorchBatchFrames
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.config import SamplingParams
from audio8_coreai.engine.batch import generate_batch
from audio8_coreai.engine.loop import generate

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the device check runs it)")

TEXTS = ("Hello there.", "A longer sentence, for a longer prompt.", "Short", "The fourth one.", "Five.", "Six")


def _backends(checkpoint, device: str = "cpu") -> tuple[TorchBackend, TorchBackend]:
    """(eager, graph-mode) fp32 backends on one checkpoint (graph mode captured on CUDA, eager on the CPU)."""
    ckpt = load_checkpoint(checkpoint)
    return (
        TorchBackend(ckpt, device, "fp32", codec_process=False),
        TorchBackend(ckpt, device, "fp32", frame_mode="graph", codec_process=False),
    )


@pytest.fixture(scope="module")
def never_eos(never_eos_checkpoint):
    """(eager, graphed, its TTS) on the checkpoint that never draws eos: utterances end at their caps."""
    tts = TTS.load(never_eos_checkpoint, device="cpu", precision="fp32", codec_process=False)
    return (*_backends(never_eos_checkpoint), tts)


def test_bucket_sizes():
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(3) == (1, 2, 3)
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(200) == (1, 2, 4, 8, 16, 32, 64, 128, 200)
    assert bucket_sizes(5, (4, 1, 16)) == (1, 4, 5)


def test_graphs_are_the_default_on_cuda_only(tiny_checkpoint):
    tts = TTS.load(tiny_checkpoint, device="cpu", precision="fp32", codec_process=False)
    assert tts.backend.frame_mode == "eager" and TorchBatchFrames(tts.backend, 2).graphed is None


def _step(cfg, rng, column, pos, draw_ahead=None) -> StepInputs:
    noise_slow = rng.random((2, cfg.num_semantic + 1), dtype=np.float32).clip(1e-6)
    noise_fast = rng.random((cfg.num_codebooks - 1, cfg.codebook_size), dtype=np.float32).clip(1e-6)
    window = np.full(cfg.ras_window_size, -1, dtype=np.int64)
    return StepInputs(column, pos, noise_slow, window, noise_fast, logits=True, draw_ahead=draw_ahead)


def _check_rows(never_eos, device: str = "cpu") -> TorchBatchFrames:
    """Rows joining, leaving and missing a frame, calls padded up to their bucket: the graph-mode batch model gives
    the eager one's codes and KV state, and writes no slot of a row outside the call but the last (which no row
    attends before writing it); each starts every call's next noise once. Returns the graph-mode model."""
    eager_b, graphed_b, tts = never_eos
    cfg = eager_b.cfg
    eager, graphed = TorchBatchFrames(eager_b, 4), TorchBatchFrames(graphed_b, 4)
    assert graphed.graphed.buckets == (1, 2, 4) and graphed.k_cache.shape == eager.k_cache.shape  # no spare row
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
    rng = np.random.default_rng(5)
    prompt = [tts.prompts.plain(t) for t in TEXTS[:4]]
    pos: dict[int, int] = {}
    last: dict[int, np.ndarray] = {}

    def admit(row: int, i: int) -> None:
        for m in (eager, graphed):
            assert m.acquire() == row
            m.prefill(row, prompt[i])
        pos[row] = prompt[i].shape[1]

    def frame(rows: list[int]) -> None:
        started: list[int] = []
        calls = [(r, _step(cfg, rng, last.get(r), pos[r], lambda r=r: started.append(r))) for r in rows]
        want = eager.frames(params, calls)
        assert sorted(started) == sorted(rows)
        started.clear()
        got = graphed.frames(params, calls)
        assert sorted(started) == sorted(rows)
        for (r, step), a, b in zip(calls, want, got):
            assert a.semantic == b.semantic and np.array_equal(a.codes, b.codes), r
            np.testing.assert_allclose(b.logits, a.logits, rtol=0, atol=1e-5)
            np.testing.assert_allclose(b.fast_logits, a.fast_logits, rtol=0, atol=1e-5)
            if step.column is not None:
                pos[r] += 1
            last[r] = np.concatenate([[a.semantic], a.codes])

    for row in range(3):
        admit(row, row)
    frame([0, 1, 2])  # three frame-0 rows in the 4 bucket
    frame([0, 2, 1])
    admit(3, 3)
    frame([0, 3, 2])  # row 1 busy elsewhere; row 3 joins (its frame 0 beside two steps): padded to 4
    end = cfg.max_seq_len - 1  # the slot dropped steps write
    assert torch.equal(graphed.k_cache[..., :end, :] != 0, eager.k_cache[..., :end, :] != 0)
    assert bool((graphed.k_cache[:, 1, :, end] != 0).all())  # row 1's dropped step wrote its last slot only
    for m in (eager, graphed):
        m.release(0)  # row 0 leaves
    frame([1, 2, 3])
    frame([3])
    frame([2, 1])
    frame([1, 2, 3])
    frame([2])  # bucket 4 for row 2 alone: rows 0, 1 and 3 padding
    torch.testing.assert_close(graphed.k_cache[..., :end, :], eager.k_cache[..., :end, :], rtol=0, atol=1e-5)
    return graphed


def test_graphed_rows_equal_the_eager_rows(never_eos):
    _check_rows(never_eos)


def test_generate_batch_through_graphed_rows(never_eos):
    """Six prompts, four rows, caps that free rows at different steps: through the graph-mode rows every
    utterance's codes equal the eager rows' and its batch-1 run's."""
    eager_b, graphed_b, tts = never_eos
    prompt = [tts.prompts.plain(t) for t in TEXTS]
    params = tts.sampling()
    seeds, caps = [3, 5, 7, 11, 13, 17], [6, 14, 3, 9, 7, 4]
    got = generate_batch(graphed_b, prompt, params, seeds, caps, max_batch=4)
    want = generate_batch(eager_b, prompt, params, seeds, caps, max_batch=4)
    for p, seed, cap, g, w in zip(prompt, seeds, caps, got, want):
        assert g.codes.shape == (tts.config.num_codebooks, cap) and not g.reached_eos
        np.testing.assert_array_equal(g.codes, w.codes)
        np.testing.assert_array_equal(g.codes, generate(graphed_b, p, params, seed, cap).codes)
    graphed_b.noise_ahead = True  # as on a GPU: each next noise drawn on the noise threads once a call is launched
    try:
        ahead = generate_batch(graphed_b, prompt, params, seeds, caps, max_batch=4)
    finally:
        graphed_b.noise_ahead = False
    for g, a in zip(got, ahead):
        np.testing.assert_array_equal(a.codes, g.codes)


@cuda
def test_captured_rows_equal_the_eager_cuda_rows(never_eos_checkpoint):
    """The same checks with the graph-mode rows captured and replayed as CUDA graphs (one per bucket used)."""
    tts = TTS.load(never_eos_checkpoint, device="cpu", precision="fp32", codec_process=False)
    graphed = _check_rows((*_backends(never_eos_checkpoint, "cuda"), tts))
    assert graphed.graphed.capture and len(graphed.graphed.graphs) == 1  # every call's highest row is 2 or 3: bucket 4


@cuda
def test_graphs_are_the_default_on_cuda(tiny_checkpoint):
    assert "cuda-graphs" in TTS.load(tiny_checkpoint, device="cuda").backend.description.split()
    assert TTS.load(tiny_checkpoint, device="cuda", cuda_graphs=False).backend.frame_mode == "eager"
    tts = TTS.load(tiny_checkpoint, device="cuda")
    server, _ = tts.batched(3)
    assert server.batch.graphed.capture and server.batch.graphed.buckets == (1, 2, 3)
    assert len(server.batch.graphed.graphs) == 3  # every bucket captured at start-up for the default settings
    server.close()
