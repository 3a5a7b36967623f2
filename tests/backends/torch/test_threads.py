"""CPU threads per kind of call (backends/torch/threads.py): prefills on all of torch's threads; with the codec in
a process of its own, half for it and the rest for frames; set on whichever OS thread runs the call and restored
after."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch

from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.backends.torch.codec_worker import CodecWorker
from audio8_coreai.backends.torch.threads import CallThreads, running_on
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.config import SamplingParams
from audio8_coreai.engine.batch import generate_batch
from audio8_coreai.engine.loop import generate
from audio8_coreai.errors import ConfigError


@pytest.mark.parametrize(
    "threads, codec_process, codec_threads, expected",
    [
        (1, True, None, (1, 1, 1)),
        (2, True, None, (2, 1, 1)),
        (3, True, None, (3, 2, 1)),
        (8, True, None, (8, 4, 4)),
        (8, True, 1, (8, 7, 1)),
        (2, True, 5, (2, 1, 5)),
        (2, False, None, (2, 2, 0)),
        (0, False, None, (1, 1, 0)),
    ],
)
def test_the_codec_process_takes_half_the_cpus_and_frames_the_rest(
    threads, codec_process, codec_threads, expected, monkeypatch
):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert CallThreads.for_backend(threads, codec_process, codec_threads) == CallThreads(*expected)


def test_codec_threads_past_the_machines_cpus_are_refused_before_a_process_starts(monkeypatch):
    """A count torch cannot run (100000 crashed the codec process; 2**63 overflowed in it): the setting named."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert CallThreads.for_backend(2, True, 2) == CallThreads(2, 1, 2)
    for wrong in (3, 100_000, 2**63):
        with pytest.raises(
            ConfigError,
            match=rf"codec_threads is {wrong}, more than this machine's 2 CPUs.*"
            r"AUDIO8_TORCH__CODEC_THREADS",
        ):
            CallThreads.for_backend(2, True, wrong)


def test_the_codec_process_runs_on_its_threads(tiny_checkpoint):
    """A child told 3 threads decodes on an OpenMP team of 3 (its OS threads: /proc/PID/task), one told 1 on one."""
    checkpoint = load_checkpoint(tiny_checkpoint)
    tasks = {}
    for n in (1, 3):
        worker = CodecWorker(checkpoint, 64, threads=n)
        try:
            worker.stream().push(np.random.default_rng(0).integers(0, 100, (10, 16)))
            tasks[n] = len(os.listdir(f"/proc/{worker.pid}/task"))
        finally:
            worker.close()
    assert tasks[3] >= 3 and tasks[1] < tasks[3], tasks


def test_running_on_sets_and_restores_this_threads_count():
    before = torch.get_num_threads()
    with running_on(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("codec_process, frame_threads", [(True, 2), (False, 3)])
def test_a_worker_thread_runs_prefill_and_frames_at_the_backends_counts(
    tiny_checkpoint, torch_threads, codec_process, frame_threads
):
    """Loaded at 3 torch threads; generate on a fresh OS thread (as a server worker) that asked for 1 itself:
    every prefill window runs on 3, every frame (frame 0's draw and the slow steps) on ``frame_threads``, and the
    worker's own count is 1 again after."""
    torch_threads(3)
    backend = TorchBackend(load_checkpoint(tiny_checkpoint), "cpu", precision="fp32", codec_process=codec_process)
    try:
        assert backend.threads == CallThreads(3, frame_threads, 1 if codec_process else 0)
        seen: dict[str, list[int]] = {"prefill": [], "sample": [], "forward": []}
        maths = backend.frame_maths
        for name in seen:
            real = getattr(maths, name)

            def spy(*args, real=real, name=name, **kwargs):
                seen[name].append(torch.get_num_threads())
                return real(*args, **kwargs)

            setattr(maths, name, spy)  # instance attributes over the methods
        prompt = np.zeros((1 + backend.cfg.num_codebooks, 40), dtype=np.int64)
        prompt[0] = np.arange(40) + 3
        after: list[int] = []

        def worker():
            torch.set_num_threads(1)
            gen = generate(backend, prompt, SamplingParams(), seed=2, max_frames=5)
            after.append(torch.get_num_threads())
            after.append(gen.codes.shape[1])

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        frames = after[1]
        # 40 columns: windows of 32 and 8; then each slow step runs the frame's prefill on one column
        assert seen["prefill"][:2] == [3, 3] and set(seen["prefill"][2:]) == {frame_threads}
        assert seen["sample"][:1] == [frame_threads]  # frame 0: drawn from the prefill
        assert len(seen["forward"]) >= min(frames, 4) and set(seen["forward"]) == {frame_threads}
        assert after[0] == 1
    finally:
        backend.close()


def test_batched_frames_run_at_the_frame_count(tiny_checkpoint, torch_threads):
    torch_threads(3)
    backend = TorchBackend(load_checkpoint(tiny_checkpoint), "cpu", precision="fp32", codec_process=True)
    try:
        seen: list[int] = []
        real = backend.frame_maths.slow_rows

        def spy(*args, **kwargs):
            seen.append(torch.get_num_threads())
            return real(*args, **kwargs)

        backend.frame_maths.slow_rows = spy
        prompt = np.zeros((1 + backend.cfg.num_codebooks, 20), dtype=np.int64)
        generate_batch(backend, [prompt, prompt], SamplingParams(), [1, 2], [3, 3], max_batch=2)
        assert seen and set(seen) == {2}
    finally:
        backend.close()


def test_the_codec_in_this_process_runs_at_the_backends_count(tiny_checkpoint, torch_threads):
    """Without the codec process a stream's codec pushes run on the caller's OS thread: at the backend's 3
    threads whatever the caller set (1 or 3), its own count back after, and the same samples either way."""
    torch_threads(3)
    backend = TorchBackend(load_checkpoint(tiny_checkpoint), "cpu", precision="fp32", codec_process=False)
    seen: list[int] = []
    for module in backend.decoder.modules():  # the layers the streaming decoder calls
        module.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    codes = np.random.default_rng(0).integers(0, 1024, size=(backend.cfg.num_codebooks, 24))
    codes[0] %= 4096
    got: dict[int, tuple[np.ndarray, int]] = {}

    def worker(n: int):
        torch.set_num_threads(n)
        stream = backend.codec_stream()
        audio = np.concatenate([stream.push(codes[:, i : i + 8]) for i in range(0, 24, 8)])
        got[n] = (audio, torch.get_num_threads())

    try:
        for n in (1, 3):
            t = threading.Thread(target=worker, args=(n,))
            t.start()
            t.join()
        assert got[1][1] == 1 and got[3][1] == 3
        assert got[1][0].shape == (24 * 2048,) and np.array_equal(got[1][0], got[3][0])
        assert seen and set(seen) == {3}
    finally:
        backend.close()
