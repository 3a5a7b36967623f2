"""The codec decoder in a process of its own, so that it runs on another core beside the frame loop.

On a CPU the frame loop (one thread of many small eager ops, holding the GIL) and the codec do not overlap as
two threads of one process; as two processes they do (docs/speed.md). :class:`CodecWorker` runs the exact fp32
incremental decoder (:class:`...model.codec.StreamingDecoder` over :class:`...model.codec.CodecDecoder`, built
from the checkpoint's codec file, mapped) in a child process on its share of the CPUs, serving several utterance
streams by id. Codes go in pickled (a few hundred bytes); audio comes back as raw float32 bytes
(``Connection.send_bytes``: a 16-frame chunk is 128 KiB, well under a millisecond through the pipe against the
~0.7 s of its decode, so shared memory would save nothing worth its cleanup).

Children are forked by a **fork server** of this module's own: one plain ``python -c`` process per parent, started
at the first worker, that imports torch once and then forks a child per worker (tens of ms). multiprocessing's
``forkserver`` and ``spawn`` contexts are not used because their children import the parent's main script: a
script that loads a model at its top level (``TTS.load(...)`` with no ``if __name__ == "__main__":`` guard) would
load it again in every child and fail there. The fork server and the children ignore SIGINT (Ctrl-C stops the
parent, whose exit closes their pipes); a child ends when the parent's end of its pipe closes
(:meth:`CodecWorker.close`, the worker's finalizer, or the parent's death), the fork server when its socket does;
the fork server reaps the children, so none is left behind.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections import deque
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import torch

from ...checkpoint import Checkpoint
from ...errors import BackendError
from ...model.codec import CodecDecoder, StreamingDecoder
from .memory import release_mapped_pages

READY, AUDIO, ERROR = b"RDY\0", b"AUD\0", b"ERR\0"  # the tag that opens each message from a child
STOP_S = 5.0  # how long close() waits for a child to end before killing it


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the platform tells it, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no affinity call
        return os.cpu_count() or 1


def default_codec_process(device: torch.device) -> bool:
    """Whether the codec decoder runs in a process of its own by default (``DEFAULTS.torch.codec_process`` None): on a
    CPU device when this process may use 2+ CPUs and may start children (a daemonic multiprocessing worker may not)."""
    return device.type == "cpu" and usable_cpus() >= 2 and not multiprocessing.current_process().daemon


def build_decoder(checkpoint: Checkpoint, max_frames: int, dtype: torch.dtype) -> CodecDecoder:
    """The codec decoder of ``checkpoint`` on CPU in ``dtype``, sized for ``max_frames`` frames per utterance, built
    from the mapped codec file (only the tensors it uses are read; the pages of those it folded into new weights,
    weight norm's ``g`` and ``v``, are handed back). Raises CheckpointError for an unreadable file."""
    state = checkpoint.codec_state_dict(mapped=True)
    decoder = CodecDecoder.from_state_dict(checkpoint.codec_config, state, max_frames=max_frames)
    decoder = decoder.to(dtype=dtype).eval().requires_grad_(False)
    kept = {t.untyped_storage().data_ptr() for t in (*decoder.parameters(), *decoder.buffers())}
    release_mapped_pages(t for t in state.values() if t.untyped_storage().data_ptr() not in kept)
    return decoder


def _serve(conn: Connection) -> None:
    """A child: take (checkpoint, max_frames, dtype, threads), build the decoder on ``threads`` torch threads, say
    READY and its pid, then answer
    ``("push", id, codes int [B, C, n])`` with the float32 audio [B, n * frame_length] of that stream's next frames
    and forget a stream on ``("end", id, None)``; return when the parent's end of the pipe closes."""
    try:
        checkpoint, max_frames, dtype, threads = conn.recv()
        torch.set_num_threads(threads)
        decoder = build_decoder(checkpoint, max_frames, dtype)
        conn.send_bytes(READY + str(os.getpid()).encode())
        streams: dict[int, StreamingDecoder] = {}
        while True:
            op, stream, codes = conn.recv()
            if op == "end":
                streams.pop(stream, None)
                continue
            try:
                with torch.inference_mode():
                    audio = streams.setdefault(stream, StreamingDecoder(decoder)).push(torch.from_numpy(codes))
                conn.send_bytes(AUDIO + audio.numpy().tobytes())
            except Exception as e:  # noqa: BLE001 - any failure of a push goes back to the caller as its error
                conn.send_bytes(ERROR + f"{type(e).__name__}: {e}".encode())
    except (EOFError, BrokenPipeError, ConnectionResetError):
        return  # the parent closed its end (or died)
    except Exception as e:  # noqa: BLE001 - a failed start is told to the parent, which raises BackendError
        conn.send_bytes(ERROR + f"{type(e).__name__}: {e}".encode())


def fork_server(fd: int) -> None:
    """The fork server (a ``python -c`` process calling this): fork a child running :func:`_serve` on each pipe end
    received on the socket ``fd``; end the process at once when the parent closes or shuts down the socket (the
    interpreter's teardown, torch's, would hold the parent's exit about 0.4 s). Children are reaped by the kernel
    (SIGCHLD ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    with socket.socket(fileno=fd) as sock:
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(sock, 16, 1)
            except OSError:
                break
            if not msg:
                break
            if os.fork() == 0:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                code = 0
                try:
                    _serve(Connection(fds[0]))
                except BaseException:  # noqa: BLE001 - printed, then the child ends
                    traceback.print_exc()
                    code = 1
                os._exit(code)
            for end in fds:
                os.close(end)
    os._exit(0)


class _ForkServer:
    """The parent's side of the fork server: started at the first :meth:`fork`, again if it has died."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    def fork(self, end: Connection) -> None:
        """Have a child forked to serve ``end`` (this process's copy is then closed)."""
        with self._lock:
            try:
                for attempt in range(2):
                    if self._process is None or self._process.poll() is not None:
                        self._start()
                    try:
                        socket.send_fds(self._sock, [b"F"], [end.fileno()])
                        return
                    except OSError:
                        if attempt:
                            raise
                        self._process = None  # it died since: start another
            finally:
                end.close()

    def stop(self) -> None:
        """Shut the socket down and wait up to STOP_S seconds for the server to end (it ends at once at the socket's
        end), then kill it: at this process's exit, so nothing is left running or open (``-X dev`` warned of both).
        A shutdown, not only a close: a process forked from this one (a multiprocessing pool) holds a copy of the
        socket, which a close leaves open. The codec processes it forked end with their own pipes."""
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
                self._sock.close()
                self._sock = None
            if self._process is not None:
                try:
                    self._process.wait(STOP_S)
                except subprocess.TimeoutExpired:
                    self._process.kill()
                    self._process.wait()
                self._process = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        package_root = str(Path(__file__).resolve().parents[3])  # the folder holding audio8_coreai, as imported here
        paths = [package_root, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        self._process = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER_CODE.format(module=__name__, fd=theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # stdout may carry the parent's audio; errors go to stderr
            env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        )
        theirs.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = ours


# Ctrl-C reaches the whole foreground process group: SIGINT is ignored before the import, which takes seconds
# (a traceback of a KeyboardInterrupt inside torch's import was printed beside the command's "interrupted").
_FORK_SERVER_CODE = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); from {module} import fork_server; fork_server({fd})"
)
_FORK_SERVER = _ForkServer()
atexit.register(_FORK_SERVER.stop)


def _stop(conn: Connection, pid: list[int | None], wait_s: float) -> None:
    """Close the parent's end (the child then returns); wait up to ``wait_s`` seconds for it to end, then kill it."""
    conn.close()
    if pid[0] is None or wait_s <= 0:
        return
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            os.kill(pid[0], 0)
            time.sleep(0.01)
        os.kill(pid[0], signal.SIGKILL)
    except ProcessLookupError:
        pass  # it has ended (and been reaped)


class CodecWorker:
    """The parent's handle on one codec child process (see the module): ``stream()`` -> a :class:`WorkerStream`.

    ``checkpoint``'s codec is decoded in ``dtype`` (fp32: exact) on ``threads`` torch threads, each stream at most
    ``max_frames`` frames long.
    The child starts here and builds its decoder while the caller goes on (the first worker of a process also
    starts the fork server: about the time torch takes to import); :meth:`wait_ready` waits for it. Calls from
    several threads are serialized (one request in flight). A child that dies fails the call waiting on it or
    sending to it with BackendError; the next :meth:`stream` starts a new child (also where it died between
    utterances, killed while idle: its end of the pipe is seen). :meth:`close` ends the child (so does the worker's
    finalizer, without waiting); a closed worker raises BackendError.
    """

    def __init__(self, checkpoint: Checkpoint, max_frames: int, dtype: torch.dtype = torch.float32, threads: int = 1):
        self._args = (checkpoint, max_frames, dtype, threads)
        self.frame_length = checkpoint.codec_config.frame_length
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._ended: deque[tuple[int, int]] = deque()  # (child, stream) of streams dropped, told to the child later
        self._closed = False
        self._child = 0  # which child this is (streams of an earlier one are refused)
        self._start()

    def _start(self) -> None:
        self._child += 1
        self._conn, theirs = Pipe()
        self._pid: list[int | None] = [None]  # filled in when the child says READY
        self._ready = False
        self._finalizer = weakref.finalize(self, _stop, self._conn, self._pid, 0.0)
        _FORK_SERVER.fork(theirs)
        self._conn.send(self._args)

    @property
    def pid(self) -> int:
        """The child's process id (waits until it is ready)."""
        self.wait_ready()
        return self._pid[0]

    def wait_ready(self) -> None:
        """Wait until the child has built its decoder. Raises BackendError when it could not."""
        with self._lock:
            self._check_ready()

    def _check_ready(self) -> None:
        if self._closed:
            raise BackendError("this model's codec process was closed: load the model again")
        if self._ready:
            return
        reply = self._reply("starting")
        if not reply.startswith(READY):
            raise BackendError(f"the codec process could not load the codec: {reply[len(ERROR) :].decode()}")
        self._pid[0] = int(reply[len(READY) :])
        self._ready = True

    def stream(self) -> WorkerStream:
        """A new utterance stream on the child (a new child first, when the last one died)."""
        with self._lock:
            if self._ready and not self._conn.closed and self._conn.poll():
                self._finalizer()  # it speaks only when asked: an idle child's end readable is its end (killed)
            if not self._closed and self._conn.closed:  # _reply closes it when the child has died
                self._start()
            self._check_ready()
            return WorkerStream(self, self._child, next(self._ids))

    def push(self, child: int, stream: int, codes: np.ndarray) -> np.ndarray:
        """The float32 audio [B, n * frame_length] of ``stream``'s next frames, codes int [B, C, n]. Raises
        BackendError when the stream's child died (or was replaced) or the decode failed there."""
        codes = np.ascontiguousarray(codes, dtype=np.int64)
        with self._lock:
            if child != self._child or self._conn.closed and not self._closed:
                raise BackendError("the codec process this stream ran on has ended; start the utterance again")
            self._check_ready()
            try:
                while self._ended:
                    gone, ended = self._ended.popleft()
                    if gone == self._child:
                        self._send(("end", ended, None))
                self._send(("push", stream, codes))
                reply = self._reply("decoding")
            except BaseException:  # interrupted between request and reply (Ctrl-C): its reply would answer the next
                self._finalizer()  # so this child is ended; the next stream() starts another
                raise
        if reply.startswith(ERROR):
            raise BackendError(f"the codec process failed to decode: {reply[len(ERROR) :].decode()}")
        audio = np.frombuffer(reply, dtype=np.float32, offset=len(AUDIO)).copy()
        return audio.reshape(codes.shape[0], codes.shape[2] * self.frame_length)

    def end(self, child: int, stream: int) -> None:
        """Let the child forget ``stream`` (told with the next request; safe from any thread, finalizers too)."""
        self._ended.append((child, stream))

    def _send(self, message: tuple) -> None:
        """``message`` to the child, or BackendError when it has died (its end closed: a broken pipe)."""
        try:
            self._conn.send(message)
        except OSError:
            self._finalizer()  # closes our end: the next stream() starts a new child
            raise self._ended_while("decoding") from None

    def _reply(self, doing: str) -> bytes:
        """The child's next message, or BackendError when it died instead (its end closed: never a hang)."""
        try:
            return self._conn.recv_bytes()
        except (EOFError, OSError):
            self._finalizer()  # closes our end: the next stream() starts a new child
        raise self._ended_while(doing)

    def _ended_while(self, doing: str) -> BackendError:
        """The error of a call whose child ended while ``doing`` (starting, decoding)."""
        hint = (
            "; its error, if it said one, is above" if doing == "starting" else "; the next utterance starts a new one"
        )
        who = "" if self._pid[0] is None else f" (pid {self._pid[0]})"
        return BackendError(f"the codec process{who} ended while {doing}{hint}")

    def close(self) -> None:
        """End the child: close its pipe, wait up to STOP_S seconds for it to end, then kill it. Idempotent."""
        with self._lock:
            self._closed = True
            self._finalizer.detach()
            _stop(self._conn, self._pid, STOP_S)


class WorkerStream:
    """One utterance's stream on a :class:`CodecWorker`: ``push(codes int [C, n])`` -> float32 audio
    [n * frame_length], the samples of the in-process :class:`...model.codec.StreamingDecoder`; :meth:`push_rows`
    for a batch [B, C, n] -> [B, n * frame_length]. The child forgets it when it is garbage collected."""

    def __init__(self, worker: CodecWorker, child: int, stream: int):
        self._worker, self._child, self._id = worker, child, stream
        weakref.finalize(self, worker.end, child, stream)

    def push(self, codes: np.ndarray) -> np.ndarray:
        return self.push_rows(np.asarray(codes)[None])[0]

    def push_rows(self, codes: np.ndarray) -> np.ndarray:
        return self._worker.push(self._child, self._id, codes)
