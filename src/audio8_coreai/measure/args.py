"""Argument types of the benchmark scripts (``benchmarks/``, argparse): a count of frames, runs or threads is a whole
number >= 1, a size that may be none a whole number >= 0 and a duration a finite number of seconds > 0, refused by
argparse in one line (usage, then ``error: argument --runs: ...``, exit status 2) before anything is loaded, not a
Python error after minutes."""

from __future__ import annotations

import argparse


def _whole(text: str, least: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"{n} is under {least}: give a whole number of at least {least}")
    return n


def count(text: str) -> int:
    """A whole number >= 1 (frames, runs, rounds, threads, chunk frames, batch rows); raises ArgumentTypeError."""
    return _whole(text, 1)


def count_or_zero(text: str) -> int:
    """A whole number >= 0 (0 where the option says what it means, e.g. no codec stream; a seed); raises
    ArgumentTypeError."""
    return _whole(text, 0)


def seconds(text: str) -> float:
    """A finite number of seconds > 0 (a duration, a timeout); raises ArgumentTypeError."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is no duration: give a number of seconds above 0")
    return value


def check_device(ap: argparse.ArgumentParser, device: str) -> None:
    """The GPU scripts' ``--device``: a CUDA one on a machine without CUDA is refused by ``ap`` in one line (exit
    status 2) before anything loads; ``--device cpu`` runs them as a check of the script."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {device}: this machine has no CUDA device; --device cpu checks the script")
