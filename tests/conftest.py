"""Shared test fixtures: where the oracle recordings live (../shared/oracle beside the project, or the folder
AUDIO8_ORACLE names: the device check carries a copy)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
ORACLE = Path(os.environ.get("AUDIO8_ORACLE") or SHARED / "oracle")


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    """The fp32 tiny oracle checkpoint folder (publisher layout, random weights)."""
    path = ORACLE / "tiny"
    if not path.is_dir():
        pytest.fail(f"oracle fixtures not found at {path}: the project expects ../shared/oracle beside it")
    return path


@pytest.fixture(scope="session")
def oracle_bf16_dir() -> Path:
    """The same tiny weights, recorded running in bfloat16."""
    return ORACLE / "tiny_bf16"


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


@pytest.fixture(scope="session")
def tiny_tts(tiny_checkpoint):
    """The tiny checkpoint loaded on the CPU at the default precision (int16 on the CPU)."""
    from audio8_coreai import TTS

    return TTS.load(tiny_checkpoint, device="cpu")


@pytest.fixture(scope="session")
def eos_first_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint with every compact logit 0: with top-k 1 every utterance ends on its first frame
    (steered.py)."""
    from steered import steer_eos

    return steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "eos_first", "first")


@pytest.fixture(scope="session")
def never_eos_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """The tiny checkpoint that never draws eos, with a context of 128 positions (prompt + frames), so an
    utterance always runs to its frame cap (steered.py)."""
    from steered import steer_eos

    return steer_eos(tiny_checkpoint, tmp_path_factory.mktemp("steered") / "never_eos", "never", max_seq_len=128)
