"""The frame as a CUDA graph (backends/torch/cudagraphs.py): its static form replays the oracle on the CPU;
captured, on CUDA."""

import numpy as np
import pytest
import torch

from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.cudagraphs import GraphedFrame
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.config import SamplingParams
from audio8_coreai.errors import BackendError
from audio8_coreai.measure.parity import run_parity
from audio8_coreai.settings import DEFAULTS
from audio8_coreai.tts import TTS

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the device check runs it)")


def _static_backend(oracle_dir) -> TorchBackend:
    """An fp32 CPU backend whose frames run the frame's graph mode (no capture: the CPU has no graphs)."""
    return TorchBackend(load_checkpoint(oracle_dir), "cpu", "fp32", frame_mode="graph")


def test_static_frame_passes_the_oracle(oracle_dir):
    """Every frame through the graph's form (index-written slot, all L slots under a mask, export sampler):
    the publisher's draws and logits, as the eager frame."""
    report = run_parity(_static_backend(oracle_dir), oracle_dir / "fixture.npz")
    assert report.passed, report.totals()
    assert not report.skipped and report.totals()["semantic_draws"][1] > 0


@torch.inference_mode()
def test_static_frame_equals_the_eager_frame(oracle_dir):
    graphed, eager = _static_backend(oracle_dir), TorchBackend(load_checkpoint(oracle_dir), "cpu", "fp32")
    assert graphed.description == "torch cpu fp32 graph-frame" and eager.description == "torch cpu fp32"
    cfg = eager.cfg
    rng = np.random.default_rng(3)
    prompt = np.zeros((cfg.num_codebooks + 1, 7), dtype=np.int64)
    prompt[0] = rng.integers(cfg.semantic_begin_id, cfg.semantic_end_id, 7)
    prompt[1:] = rng.integers(0, cfg.codebook_size, (cfg.num_codebooks, 7))
    window = np.full(cfg.ras_window_size, -1, dtype=np.int64)
    for params in [
        SamplingParams(temperature=0.5 + 0.1 * i, top_k=10 + i) for i in range(DEFAULTS.torch.cuda_graphs_kept + 1)
    ]:
        noise_slow = rng.random((2, cfg.num_semantic + 1), dtype=np.float32).clip(1e-6)
        noise_fast = rng.random((cfg.num_codebooks - 1, cfg.codebook_size), dtype=np.float32).clip(1e-6)
        graphed.prefill(prompt)
        eager.prefill(prompt)
        step = StepInputs(prompt[:, -1], 7, noise_slow, window, noise_fast, logits=True)
        got, want = graphed.frame(params, step), eager.frame(params, step)
        assert got.semantic == want.semantic and np.array_equal(got.codes, want.codes)
        np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=1e-5)
        np.testing.assert_allclose(got.fast_logits, want.fast_logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(graphed.k_cache, eager.k_cache, rtol=0, atol=1e-5)  # slot 7 written alike


def test_cuda_graphs_need_a_cuda_device(oracle_dir, tiny_checkpoint):
    ckpt = load_checkpoint(oracle_dir)
    with pytest.raises(BackendError, match="CUDA graphs need a CUDA device, not cpu"):
        TTS.load(tiny_checkpoint, device="cpu", cuda_graphs=True)
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        GraphedFrame(
            TorchBackend(ckpt, "cpu", "fp32").model,
            *TorchBackend(ckpt, "cpu", "fp32").model.new_kv_cache(),
            capture=True,
        )
    with pytest.raises(BackendError, match="torch-backend option"):
        TTS.load(tiny_checkpoint, backend="coreai", assets=tiny_checkpoint, cuda_graphs=True)


@cuda
def test_captured_frame_passes_the_oracle_on_cuda(oracle_dir):
    backend = TorchBackend(load_checkpoint(oracle_dir), "cuda", "fp32", frame_mode="graph")
    report = run_parity(backend, oracle_dir / "fixture.npz")
    assert report.passed, report.totals()
    assert "cuda-graphs" in backend.description.split()


@cuda
def test_captured_frame_gives_the_eager_cuda_audio(tiny_checkpoint):
    """Same seed, same codes with and without graphs on CUDA (the graph replays across utterances: its KV state
    is zeroed in place)."""
    graphed = TTS.load(tiny_checkpoint, device="cuda", precision="fp32", cuda_graphs=True)
    eager = TTS.load(tiny_checkpoint, device="cuda", precision="fp32")
    for seed in (1, 2):
        a = graphed.generate("Hello there.", seed=seed, max_frames=24)
        b = eager.generate("Hello there.", seed=seed, max_frames=24)
        assert np.array_equal(a.codes, b.codes)
