"""The codec in a process of its own (backends/torch/codec_worker.py): exact to the in-process decoder, overlapped
with the frames in generate and streaming, and never left behind or hanging: closed, dropped, killed, or its parent
gone."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from audio8_coreai.backends.torch import TorchBackend, TorchCodecStream
from audio8_coreai.backends.torch.codec_worker import default_codec_process
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.engine.overlap import CodecQueue
from audio8_coreai.errors import BackendError

EXACT = 1e-5  # fp32, one thread on both sides
SPLIT = [1, 2, 4, 9, 16, 16, 3]  # ragged pushes, 51 frames


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process ``pid`` has ended (and been reaped) within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint):
    return load_checkpoint(tiny_checkpoint)


@pytest.fixture(scope="module")
def backend(checkpoint):
    b = TorchBackend(checkpoint, "cpu", precision="fp32", codec_process=True)
    yield b
    b.close()


def codes(frames: int, seed: int = 0, rows: int | None = None) -> np.ndarray:
    shape = (10, frames) if rows is None else (rows, 10, frames)
    return np.random.default_rng(seed).integers(0, 1024, shape)


def test_default_follows_usable_cpus_and_device():
    assert default_codec_process(torch.device("cpu")) == (len(os.sched_getaffinity(0)) >= 2)
    assert not default_codec_process(torch.device("cuda"))


def test_stream_and_batch_equal_the_in_process_decoder(backend):
    """A worker stream gives the in-process StreamingDecoder's samples for ragged pushes; decode_batch too. The
    in-process streams run on the codec process's thread count: the same float sums on both sides."""
    assert backend.codec_process and backend.codec_worker is not None
    frames = codes(sum(SPLIT))
    worker, local = backend.codec_stream(), TorchCodecStream(backend.decoder, backend.threads.codec)
    start = 0
    for n in SPLIT:
        a, b = worker.push(frames[:, start : start + n]), local.push(frames[:, start : start + n])
        assert a.shape == b.shape == (n * 2048,) and a.dtype == np.float32
        assert float(np.abs(a - b).max()) <= EXACT
        start += n
    batch = [codes(40, 1), codes(7, 2), codes(0, 3)]
    ours = backend.decode_batch(batch)
    n = backend.threads.codec
    theirs = [TorchCodecStream(backend.decoder, n).push(c) if c.shape[1] else np.zeros(0, np.float32) for c in batch]
    assert [len(a) for a in ours] == [40 * 2048, 7 * 2048, 0]
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours[:2], theirs[:2])) <= EXACT


def test_streams_from_several_threads(backend):
    """Pushes of interleaved streams from four threads are serialized: each stream gets its own samples."""
    want = backend.decode_window(codes(24, 7))  # pushes of 16 + 8 frames: the same samples to float rounding
    results: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        stream = backend.codec_stream()
        results[i] = np.concatenate([stream.push(codes(24, 7)[:, s : s + 3]) for s in range(0, 24, 3)])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2, 3]
    assert all(np.array_equal(r, results[0]) for r in results.values())
    assert float(np.abs(results[0] - want).max()) <= EXACT


def test_generate_overlaps_and_equals_decode_window(never_eos_checkpoint):
    """generate pushes every 16 frames to the codec process as they come: exactly decode_window's samples."""
    from audio8_coreai import TTS

    with TTS.load(never_eos_checkpoint, device="cpu", precision="fp32", codec_process=True) as tts:
        out = tts.generate("Hello there.", seed=5, max_frames=37)  # 16 + 16 + 5 frames
        assert out.frames == 37 and not out.reached_eos
        assert np.array_equal(out.audio, tts.backend.decode_window(out.codes))
        assert tts.stream("Hello there.").overlap_codec  # streams overlap by default too (test_streaming: samples)


def test_codec_queue_keeps_order_and_bounds_what_is_in_flight():
    """With 2 chunks in flight a third put waits (the frame loop pauses) until the oldest is decoded; audio comes
    back in order."""
    gate = threading.Event()

    def decode(chunk: np.ndarray) -> np.ndarray:
        gate.wait()
        return np.full(2, chunk[0, 0], dtype=np.float32)

    with CodecQueue(decode, overlap=True, limit=2) as queue:
        queue.put(np.full((10, 1), 0))
        queue.put(np.full((10, 1), 1))  # both returned at once: nothing decoded yet
        assert list(queue.ready()) == []
        third = threading.Thread(target=queue.put, args=(np.full((10, 1), 2),))
        third.start()
        third.join(0.3)
        assert third.is_alive()  # waits for chunk 0
        gate.set()
        third.join()
        assert [int(a[0]) for a in queue.drain()] == [0, 1, 2]


def test_a_failed_decode_is_a_backend_error(backend):
    with pytest.raises(BackendError, match="the codec process failed to decode: .*Error"):
        backend.codec_stream().push(np.zeros((3, 2), dtype=np.int64))  # 3 codebooks, not 10
    assert backend.codec_stream().push(codes(2)).shape == (4096,)  # the process serves on


def test_a_killed_child_raises_and_the_next_stream_restarts(checkpoint):
    b = TorchBackend(checkpoint, "cpu", precision="fp32", codec_process=True)
    try:
        stream = b.codec_stream()
        first = stream.push(codes(4))
        pid = b.codec_worker.pid
        os.kill(pid, signal.SIGKILL)
        assert gone(pid)  # dead before the push: its send meets a broken pipe
        with pytest.raises(BackendError, match=f"the codec process \\(pid {pid}\\) ended while decoding"):
            stream.push(codes(4, 1))
        with pytest.raises(BackendError, match="has ended; start the utterance again"):
            stream.push(codes(4, 1))
        again = b.codec_stream()
        assert b.codec_worker.pid != pid and gone(pid)
        assert np.array_equal(again.push(codes(4)), first)
    finally:
        b.close()


def test_a_child_killed_between_utterances_is_replaced_by_the_next_stream(checkpoint):
    """Killed while idle (the OOM killer between two requests): the next stream runs on a new child, no error."""
    b = TorchBackend(checkpoint, "cpu", precision="fp32", codec_process=True)
    try:
        first = b.codec_stream().push(codes(4))
        pid = b.codec_worker.pid
        os.kill(pid, signal.SIGKILL)
        assert gone(pid)
        assert np.array_equal(b.codec_stream().push(codes(4)), first)
        assert b.codec_worker.pid != pid
    finally:
        b.close()


def test_closed_or_dropped_backends_leave_no_process(checkpoint):
    """Ten backends: five closed, five dropped (the finalizer closes the pipe); every child ends."""
    pids = []
    for i in range(10):
        b = TorchBackend(checkpoint, "cpu", precision="fp32", codec_process=True)
        pids.append(b.codec_worker.pid)
        if i % 2:
            b.close()
            assert gone(pids[-1])
            with pytest.raises(BackendError, match="was closed"):
                b.codec_stream()
        del b
    gc.collect()
    assert len(set(pids)) == 10 and all(gone(p) for p in pids)


def test_child_ends_with_its_parent(tiny_checkpoint):
    """A parent that dies without closing anything (os._exit: no finalizers) leaves no codec process."""
    script = (
        "import os, sys\n"
        "from audio8_coreai.backends.torch import TorchBackend\n"
        "from audio8_coreai.checkpoint import load_checkpoint\n"
        f"b = TorchBackend(load_checkpoint({str(tiny_checkpoint)!r}), 'cpu', precision='fp32', codec_process=True)\n"
        "print(b.codec_worker.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert gone(int(run.stdout.split()[-1]))


def test_nothing_is_left_running_or_open_at_exit(tiny_checkpoint):
    """A closed model, then the interpreter's exit under -X dev: no ResourceWarning (the fork server was left
    running, its socket open, until the interpreter's end)."""
    script = (
        "from audio8_coreai import TTS\n"
        f"with TTS.load({str(tiny_checkpoint)!r}, device='cpu', codec_process=True) as tts:\n"
        "    tts.generate('Hi.', max_frames=2, seed=1)\n"
        "print('closed', flush=True)\n"
    )
    run = subprocess.run([sys.executable, "-X", "dev", "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.split() == ["closed"], run.stderr
    assert "ResourceWarning" not in run.stderr, run.stderr


def test_ctrl_c_while_the_fork_server_imports_is_the_parents_alone(tiny_checkpoint):
    """Ctrl-C reaches the terminal's whole process group: the fork server, still importing torch, ignores it (it
    printed a KeyboardInterrupt traceback beside the command's "interrupted", and served no child)."""
    script = (
        "import os, signal, time\n"
        "from audio8_coreai.backends.torch.codec_worker import _FORK_SERVER, CodecWorker\n"
        "from audio8_coreai.checkpoint import load_checkpoint\n"
        f"worker = CodecWorker(load_checkpoint({str(tiny_checkpoint)!r}), 8)\n"  # starts the server, waits not
        "time.sleep(0.3)\n"  # the server is importing torch now
        "os.kill(_FORK_SERVER._process.pid, signal.SIGINT)\n"
        "print(worker.pid > 0, flush=True)\n"  # the child it forked is ready
        "worker.close()\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.split() == ["True"], run.stderr
    assert "KeyboardInterrupt" not in run.stderr, run.stderr


def test_the_fork_server_ends_at_once_though_a_forked_process_holds_its_socket(tiny_checkpoint):
    """A process forked after the codec process started (a multiprocessing pool) holds a copy of the fork server's
    socket: stopping it shuts the socket down, so the server ends at once (a close alone left it running until
    STOP_S passed and it was killed, 5 s at every exit)."""
    script = (
        "import multiprocessing\n"
        "from audio8_coreai import TTS\n"
        "from audio8_coreai.backends.torch.codec_worker import _FORK_SERVER\n"
        f"with TTS.load({str(tiny_checkpoint)!r}, device='cpu', codec_process=True) as tts:\n"
        "    tts.generate('Hi.', max_frames=2, seed=1)\n"
        "pool = multiprocessing.get_context('fork').Pool(1)\n"
        "pool.apply(abs, (-1,))\n"
        "server = _FORK_SERVER._process\n"
        "_FORK_SERVER.stop()\n"
        "print(server.returncode, flush=True)\n"
        "pool.terminate()\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0"]  # it ended on its own (a kill is -9)


def test_say_with_and_without_the_codec_process(tiny_checkpoint, tmp_path):
    """`audio8 say --codec-process` and `--no-codec-process` write the same speech (the codec's float sums may
    round differently across thread counts: well under one 16-bit step)."""
    import soundfile as sf
    from typer.testing import CliRunner

    from audio8_coreai.cli import app

    written = []
    for flag in ("--codec-process", "--no-codec-process"):
        out = tmp_path / f"{flag}.wav"
        args = ["say", "Hello there.", "-o", out, "--model", tiny_checkpoint, "--seed", 1, "--max-frames", 20, flag]
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
        written.append(sf.read(out, dtype="float32")[0])
    assert written[0].shape == written[1].shape and len(written[0]) > 0
    assert float(np.abs(written[0] - written[1]).max()) <= 2 / 32768
