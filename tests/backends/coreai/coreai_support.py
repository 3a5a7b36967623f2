"""Helpers shared by the Core AI test files (test_coreai_*.py): why they skip without Core AI, the
child-process conversions behind the ``child_conversions`` fixture (conftest.py), the spoken text and the output
reader.

Core AI assets on Linux: converted from the tiny oracle checkpoint and run by the coreai.runtime CPU interpreter.
Conversions run once per session: fp32 with every part in this process; in a child process alongside, fp16
with the DualAR and the decoder, int8-fp16 with the DualAR and the encoder (its decoder recipe is fp16's), and a
greedy fp32 DualAR (``audio8 convert --greedy``). The buckets and contexts are small so the interpreter stays
quick: context 128 (fp32) / 96 (fp16, int8-fp16) / 64 (greedy), decoder pushes of 16 (and the opt-in 1-frame
``first``) / 8 frames, encoder 16 frames.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from audio8_coreai.config import SamplingParams

TEXT = "Hello there."  # 76 prompt columns with the tiny byte-level tokenizer: 52 frames fit a context of 128


def coreai_missing() -> str:
    """Why the Core AI tests skip when ``coreai.runtime`` does not import (``pytest.importorskip``'s reason):
    coreai-core publishes wheels for macOS and Linux x86_64, where .ci/run installs the coreai extra (so the tests
    run there)."""
    if sys.platform == "darwin" or (sys.platform == "linux" and platform.machine() == "x86_64"):
        return "the coreai extra is not installed (pip install -e '.[coreai]')"
    return "coreai-core has no wheel for this platform"


class _ChildConversions:
    """fp16, int8-fp16 and greedy assets converted by a child process, started before the fp32 conversion so the
    two run side by side (conversion is mostly single-threaded Python; on 2 cores this saves the longer one's
    time). ``folder(name)`` waits for the child and returns the asset folder."""

    SCRIPT = (
        "import sys; from audio8_coreai.backends.coreai import convert; from audio8_coreai.cli import app; "
        "ckpt, out = sys.argv[1:]; "
        "convert(ckpt, out + '/fp16', 'fp16', context=96, decoder_frames=8, "
        "parts=('dualar', 'codec_decoder'), progress=False); "
        "convert(ckpt, out + '/int8-fp16', 'int8-fp16', context=96, encoder_frames=16, "
        "parts=('dualar', 'codec_encoder'), progress=False); "
        "app(['convert', '--model', ckpt, '--out', out + '/greedy', '--greedy', '--context', '64', "
        "'--part', 'dualar'], standalone_mode=False)"
    )

    def __init__(self, checkpoint: Path, out: Path):
        self.out = out
        self.log = out / "convert.log"
        with self.log.open("w") as log:
            self.child = subprocess.Popen(
                [sys.executable, "-c", self.SCRIPT, str(checkpoint), str(out)], stdout=log, stderr=subprocess.STDOUT
            )

    def folder(self, name: str) -> Path:
        if self.child.wait(timeout=900) != 0:
            pytest.fail(f"converting the fp16/int8-fp16/greedy assets failed:\n{self.log.read_text()[-3000:]}")
        return self.out / name

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()


def _params(ckpt) -> SamplingParams:
    return SamplingParams.from_configs(ckpt.config, ckpt.generation)


def _said(result) -> str:
    """The command's output with its line wrapping undone (rich wraps at the terminal width, so where a
    message breaks depends on the length of the paths in it)."""
    return " ".join(result.output.split())
