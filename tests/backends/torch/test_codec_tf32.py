"""The tf32 codec (``codec_dtype="tf32"``, CUDA): the decoder's convolutions run under cuDNN's TF32 switch, set per
call under one lock, the encoder's always with it off; refused off CUDA. The switch changes nothing on a CPU, so the
CPU proves which calls run with it on (a dispatch mode reads it at every convolution); what TF32 does to the samples
is measured on a GPU (benchmarks/bench_codec_gpu.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from audio8_coreai import TTS
from audio8_coreai.backends.torch import TorchBackend, TorchCodecStream
from audio8_coreai.backends.torch.codec_rows import CodecRows, Push
from audio8_coreai.backends.torch.codec_worker import build_decoder
from audio8_coreai.backends.torch.cudnn import convolutions
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.errors import BackendError, ConfigError


class Switches(TorchDispatchMode):
    """cuDNN's TF32 switch as each convolution is dispatched."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in ("conv1d", "conv_transpose1d", "convolution"):
            self.seen.append(torch.backends.cudnn.allow_tf32)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def switch_off():
    """The switch off for the test (the fp32 backend's setting on CUDA), put back after."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


@pytest.fixture(scope="module")
def decoder(oracle_dir):
    return build_decoder(load_checkpoint(oracle_dir), 256, torch.float32)


def codes(frames: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 16, (1, 10, frames))


@pytest.mark.parametrize("tf32", [False, True])
def test_a_codec_stream_decodes_under_its_own_form_whatever_the_switch(decoder, switch_off, tf32):
    """The switch set the other way before (by PyTorch's default, or another backend's codec): each call's is its
    own form's."""
    stream = TorchCodecStream(decoder, 1, tf32)
    torch.backends.cudnn.allow_tf32 = not tf32
    with Switches() as mode:
        audio = stream.push_rows(codes(4))
    assert audio.shape == (1, 4 * 2048) and np.isfinite(audio).all()
    assert len(mode.seen) > 10 and set(mode.seen) == {tf32}
    assert torch.backends.cudnn.allow_tf32 is (not tf32)  # put back
    np.testing.assert_array_equal(audio, TorchCodecStream(decoder, 1).push_rows(codes(4)))  # a CPU: same samples


@pytest.mark.parametrize("tf32", [False, True])
def test_the_batched_codec_decodes_under_its_own_form(decoder, switch_off, tf32):
    rows = CodecRows(decoder, tf32=tf32)
    torch.backends.cudnn.allow_tf32 = not tf32
    try:
        streams = [rows.stream() for _ in range(2)]
        with Switches() as mode:
            out = rows.run([Push(s, codes(16, seed=i)) for i, s in enumerate(streams)])
    finally:
        rows.close()
    assert [o.shape for o in out] == [(1, 16 * 2048)] * 2
    assert len(mode.seen) > 10 and set(mode.seen) == {tf32}
    assert torch.backends.cudnn.allow_tf32 is (not tf32)


def test_the_encoder_runs_with_the_switch_off_whatever_it_was(oracle_dir):
    """A voice's codes are the fp32 encoder's, also while another call has the switch on (PyTorch's default)."""
    backend = TorchBackend(load_checkpoint(oracle_dir), "cpu", "fp32", codec_process=False)
    audio = np.random.default_rng(1).uniform(-0.5, 0.5, 3 * 2048).astype(np.float32)
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        with Switches() as mode:
            got = backend.encode(audio)
        assert torch.backends.cudnn.allow_tf32 is True  # put back
    finally:
        torch.backends.cudnn.allow_tf32 = before
    assert got.shape == (10, 3) and len(mode.seen) > 10 and set(mode.seen) == {False}


def test_one_call_at_a_time_sets_the_switch(switch_off):
    """A call that wants the switch another way waits for the one holding it: a TF32 decode and an fp32 encode
    never overlap."""
    holding, release, entered, seen = threading.Event(), threading.Event(), threading.Event(), []

    def decode() -> None:
        with convolutions(True):
            holding.set()
            release.wait(5)

    def encode() -> None:
        with convolutions(False):
            entered.set()
            seen.append(torch.backends.cudnn.allow_tf32)

    a = threading.Thread(target=decode)
    a.start()
    assert holding.wait(5)
    b = threading.Thread(target=encode)
    b.start()
    assert not entered.wait(0.2)  # waiting for the decode
    assert torch.backends.cudnn.allow_tf32 is True
    release.set()
    a.join(5)
    b.join(5)
    assert seen == [False] and torch.backends.cudnn.allow_tf32 is False


def test_tf32_is_a_cuda_codec(oracle_dir, tiny_checkpoint):
    ckpt = load_checkpoint(oracle_dir)
    with pytest.raises(BackendError, match="the tf32 codec is cuDNN's TF32 convolutions, a CUDA form, not for cpu"):
        TorchBackend(ckpt, "cpu", "fp32", codec_dtype="tf32", codec_process=False)
    for name in ("fp16", 5):  # a wrong value, as every other keyword's
        with pytest.raises(ConfigError, match=f"unknown codec dtype {name!r}: use fp32, bf16 or tf32"):
            TTS.load(tiny_checkpoint, device="cpu", codec_dtype=name, codec_process=False)
    backend = TorchBackend(ckpt, "cpu", "fp32", codec_dtype="bf16", codec_process=False)
    assert backend.codec_dtype == torch.bfloat16 and not backend.codec_tf32
    assert "codec-tf32" not in backend.description
