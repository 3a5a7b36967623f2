"""Shared test fixtures. The oracle recordings (tests/oracle, recorded from the publisher's code; see its README.md)
are read from temporary copies in the publisher's layout, so no test writes into the repository's copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.oracle_files import ORACLE, write_codec_pth


@pytest.fixture(scope="session")
def oracle_dir(tmp_path_factory) -> Path:
    """The fp32 tiny oracle checkpoint folder (publisher layout, random weights): a copy of oracle/tiny with its
    ``codec.pth`` written from ``codec.safetensors`` (the repository leaves that duplicate out)."""
    path = tmp_path_factory.mktemp("oracle") / "tiny"
    shutil.copytree(ORACLE / "tiny", path)
    write_codec_pth(path)
    return path


@pytest.fixture(scope="session")
def oracle_bf16_dir(oracle_dir, tmp_path_factory) -> Path:
    """The same tiny weights with the recording made running them in bfloat16: oracle_dir's checkpoint files and
    oracle/tiny_bf16's ``fixture.npz`` and ``meta.json`` (all the repository keeps of it)."""
    path = tmp_path_factory.mktemp("oracle") / "tiny_bf16"
    shutil.copytree(oracle_dir, path, ignore=shutil.ignore_patterns("fixture.npz", "meta.json"))
    for name in ("fixture.npz", "meta.json"):
        shutil.copyfile(ORACLE / "tiny_bf16" / name, path / name)
    return path


@pytest.fixture(scope="session")
def fixture(oracle_dir: Path) -> dict[str, np.ndarray]:
    """The tiny fp32 recording (``fixture.npz``) as a dict of arrays, keys ``SCENARIO__NAME``."""
    with np.load(oracle_dir / "fixture.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="session", autouse=True)
def private_user_data(tmp_path_factory):
    """Point the per-user data folder (the default voice store, via platformdirs) at a temporary one, so no
    test reads or writes the real user's voices."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("user_data")))
        yield


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A project-made tiny checkpoint (random weights, publisher layout, byte-level tokenizer)."""
    from audio8_coreai.checkpoint import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def bf16_tiny_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint with model.safetensors stored in bf16, as the release stores its weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path_factory.mktemp("ckpt") / "tiny_bf16"
    shutil.copytree(tiny_checkpoint, folder)
    state = load_file(tiny_checkpoint / "model.safetensors")
    save_file({k: v.bfloat16() for k, v in state.items()}, folder / "model.safetensors")
    return folder


@pytest.fixture
def torch_threads():
    """A setter of torch's thread count on this thread (``torch_threads(n)``), the count restored after the test."""
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tts(tiny_checkpoint):
    """The tiny checkpoint loaded on the CPU at the default precision (int16 on the CPU)."""
    from audio8_coreai import TTS

    return TTS.load(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="session")
def eos_first_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint with every compact logit 0: with top-k 1 every utterance ends on its first frame
    (steered.py)."""
    from tests.steered import steer_eos

    return steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "eos_first", "first")


@pytest.fixture(scope="session")
def never_eos_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint that never draws eos, with a context of 128 positions (prompt + frames), so an
    utterance always runs to its frame cap (steered.py)."""
    from tests.steered import steer_eos

    return steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "never_eos", "never", max_seq_len=128)


@pytest.fixture(scope="session")
def never_eos_long_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint that never draws eos, with its own context of 512 positions: room for the servers' test
    text (a prompt of 114 positions) and hundreds of frames, each request running to its frame cap (steered.py)."""
    from tests.steered import steer_eos

    return steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "never_eos_long", "never")


@pytest.fixture(scope="session")
def oracle(oracle_dir):
    """The tiny oracle checkpoint loaded (Core AI tests)."""
    from audio8_coreai.checkpoint import load_checkpoint

    return load_checkpoint(oracle_dir)


@pytest.fixture(scope="session")
def child_conversions(oracle_dir, tmp_path_factory):
    """fp16, int8-fp16 and greedy Core AI assets converted by a child process (coreai_support.py)."""
    from tests.backends.coreai.coreai_support import _ChildConversions

    conversions = _ChildConversions(oracle_dir, tmp_path_factory.mktemp("coreai_child"))
    yield conversions
    conversions.stop()


@pytest.fixture(scope="session")
def fp32_assets(oracle, tmp_path_factory, child_conversions):
    """fp32 Core AI assets of every part (context 128, decoder pushes of 16 and 1, encoder 16 frames)."""
    from audio8_coreai.backends.coreai import convert

    return convert(
        oracle,
        tmp_path_factory.mktemp("coreai") / "fp32",
        "fp32",
        context=128,
        decoder_frames=16,
        decoder_first_frames=1,
        encoder_frames=16,
        progress=False,
    )


@pytest.fixture(scope="session")
def fp32_backend(oracle, fp32_assets):
    """The Core AI backend on the fp32 assets."""
    from audio8_coreai.backends.coreai import CoreAIBackend

    return CoreAIBackend(oracle, fp32_assets)


@pytest.fixture(scope="session")
def torch_backend(oracle):
    """The torch backend on the oracle checkpoint in fp32 on the CPU."""
    from audio8_coreai.backends.torch import TorchBackend

    return TorchBackend(oracle, "cpu", "fp32")


@pytest.fixture(scope="session")
def speakable(oracle_dir, tiny_checkpoint, tmp_path_factory):
    """The oracle's weights with the tiny tokenizer beside them (the tokenizer is not part of the fingerprint,
    so the oracle's assets belong to this folder too): a checkpoint the TTS API and the CLI can speak with."""
    import shutil

    path = tmp_path_factory.mktemp("speakable") / "tiny"
    path.mkdir()
    for f in oracle_dir.iterdir():
        if f.name not in ("fixture.npz", "meta.json"):
            shutil.copy(f, path / f.name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoint / name, path / name)
    return path
