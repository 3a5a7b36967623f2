"""The benchmark scripts refuse what would make them measure the wrong thing, before measuring anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True, timeout=120
    )


def test_before_after_refuses_a_tree_without_the_package(tmp_path):
    """A --before that is no src/ folder made the child import the installed package: "before" timed the new code."""
    done = _run("before_after.py", "--before", str(tmp_path), "--model", str(tmp_path))
    assert done.returncode == 2 and f"{tmp_path} holds no audio8_coreai package" in done.stderr


def test_agreement_takes_one_to_four_prompts():
    done = _run("agreement.py", "--prompts", "0")
    assert done.returncode == 2 and "invalid choice: 0 (choose from 1, 2, 3, 4)" in done.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--precision", "bogus"], "error: unknown precision 'bogus': use one of"),
        (["--json", "/nowhere/a.json"], "argument --json: /nowhere is no folder: give a file in an existing folder"),
        (["--model", "/nowhere/ck", "--precision", "int16"], "error: "),
    ],
)
def test_agreement_says_a_mistake_in_one_line_before_it_records(args, said):
    """A precision it does not know, an output it cannot write, a checkpoint it cannot find: one line, no
    traceback, before the minutes of the fp32 recording (the precision's error came after them)."""
    done = _run("agreement.py", *args)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
@pytest.mark.parametrize(
    "script, part",
    [("bench_gpu.py", "single"), ("probe_attention.py", None), ("speak_gpu.py", None), ("bench_codec_gpu.py", None)],
)
def test_gpu_scripts_say_there_is_no_cuda_device(script, part):
    done = _run(script, *([part] if part else []))
    assert done.returncode == 2 and "--device cuda: this machine has no CUDA device" in done.stderr


@pytest.mark.parametrize(
    ("script", "option", "value", "said"),
    [
        ("bench_streaming.py", "--runs", "0", "0 is under 1: give a whole number of at least 1"),
        ("bench_streaming.py", "--chunk-frames", "0", "0 is under 1"),
        ("bench_overlap.py", "--frames", "-3", "-3 is under 1"),
        ("load_test.py", "--clients", "two", "'two' is not a whole number"),
        ("load_test.py", "--duration", "-1", "-1 is no duration: give a number of seconds above 0"),
        ("bench_coreai.py", "--codec-frames", "-1", "-1 is under 0: give a whole number of at least 0"),
        ("bench_read_rates.py", "--layers", "0", "0 is under 1"),
    ],
)
def test_counts_under_their_least_are_refused_by_argparse_in_one_line(script, option, value, said):
    """A count of 0 (or a word) failed as a Python error (a division by zero, an empty median) after loading."""
    done = _run(script, option, value)
    assert done.returncode == 2 and f"argument {option}: {said}" in done.stderr and "Traceback" not in done.stderr
