"""The codec batched across streams: the pushes of many streams stacked into one codec call, on a CUDA stream of
its own.

Each stream of a batched server (:mod:`.rows`) decodes its utterance's chunks as they are made. Alone, every push is
a codec call of its own: a few hundred small kernels for a few frames. :class:`CodecRows` runs one thread that takes
the pushes waiting (waiting up to ``gather_s`` for the streams heard from in the last ``recent_s``), stacks those of
equal length into one call of the exact incremental decoder's static form
(:meth:`...model.codec.StreamingDecoder.push_static`, every row at its own utterance's frame), and hands each stream
its samples and its new state. On CUDA the calls run on a ``torch.cuda.Stream`` of their own, so they overlap the
frame graphs the frame thread replays on the default stream; on the CPU the same code runs without one.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ...checkpoint import require_finite
from ...model.codec import CodecDecoder, StreamingDecoder
from ...settings import DEFAULTS
from .codec_streams import CODEC_FILE
from .cudnn import convolutions


@dataclass
class Push:
    """One stream's push for :meth:`CodecRows.run` (or waiting for the codec thread): codes int64 [rows, C, n];
    the thread puts the samples in ``result`` (or the error in ``error``)."""

    stream: CodecRowsStream
    codes: np.ndarray
    done: threading.Event = field(default_factory=threading.Event)
    result: np.ndarray | None = None
    error: BaseException | None = None


class CodecRows:
    """The codec thread over ``decoder`` (its device's; fp32 or the model dtype): :meth:`stream` gives one
    utterance's stream, whose pushes the thread stacks with other streams' into one codec call (:meth:`run`).

    Thread-safe: streams push from any thread (each stream from one at a time). ``calls`` and ``pushes`` count the
    codec calls run and the pushes they held. :meth:`close` stops the thread (pushes then raise RuntimeError). Its
    convolutions run in TF32 with ``tf32`` (the ``tf32`` codec on CUDA), else in fp32 (:func:`.cudnn.convolutions`).
    Raises ValueError for a decoder shorter than its transformer's window and one push
    (``DEFAULTS.torch.decode_chunk_frames`` frames).
    """

    def __init__(
        self,
        decoder: CodecDecoder,
        gather_s: float = DEFAULTS.server.gather_s,
        recent_s: float = DEFAULTS.server.recent_s,
        tf32: bool = False,
    ):
        self.decoder, self.gather_s, self.recent_s, self.tf32 = decoder, gather_s, recent_s, tf32
        self.maths = StreamingDecoder(decoder)  # the static form's maths; the state is each stream's
        post = decoder.quantizer.post_module
        self.max_frames = post.rope.shape[0]
        least = post.window - 1 + DEFAULTS.torch.decode_chunk_frames
        if self.max_frames < least:  # the static form's mask band is a slice of the window mask
            raise ValueError(
                f"the batched codec needs a decoder of at least {least} frames, not {self.max_frames}: decode per "
                "stream (batch_codec off)"
            )
        self.device = next(decoder.parameters()).device
        self.side = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.calls = self.pushes = 0
        self._cond = threading.Condition()
        self._waiting: list[Push] = []
        self._seen: dict[int, float] = {}  # id(stream) -> when it last pushed
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="audio8-codec-rows", daemon=True)
        self._thread.start()

    def stream(self) -> CodecRowsStream:
        """A fresh stream for one utterance (or ``rows`` utterances decoded in lock-step, see its push_rows)."""
        return CodecRowsStream(self)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def submit(self, push: Push) -> np.ndarray:
        """Queue ``push`` for the codec thread and wait for its samples (its error is raised here)."""
        with self._cond:
            if self._closed:
                raise RuntimeError("the codec thread is closed")
            self._waiting.append(push)
            self._seen[id(push.stream)] = time.monotonic()
            self._cond.notify_all()
        push.done.wait()
        if push.error is not None:
            raise push.error
        return push.result

    @torch.inference_mode()
    def run(self, pushes: list[Push]) -> list[np.ndarray]:
        """One codec call for ``pushes`` of equal length n (codes [rows_i, C, n] each): their codes and states
        stacked, every row at its own stream's frame. Returns each push's samples float32 [rows_i, n * 2048] and
        advances its stream. Raises ValueError for a push past the decoder's ``max_frames``, CheckpointError for
        samples that are not finite."""
        n = pushes[0].codes.shape[-1]
        for p in pushes:
            if p.codes.shape[-1] != n:
                raise ValueError(f"one codec call stacks pushes of one length: {p.codes.shape[-1]} != {n}")
            if p.stream.frames + n > self.max_frames:
                raise ValueError(
                    f"codec transformer: position {p.stream.frames + n} exceeds max_positions {self.max_frames} "
                    "(build the codec with a larger max_frames)"
                )
        with torch.cuda.stream(self.side) if self.side is not None else contextlib.nullcontext():
            codes = torch.as_tensor(np.concatenate([p.codes for p in pushes]), device=self.device)
            start = torch.tensor([p.stream.frames for p in pushes for _ in range(len(p.codes))], device=self.device)
            states = [p.stream.state(self.maths, len(p.codes), self.device) for p in pushes]
            state = {name: torch.cat([s[name] for s in states]) for name in states[0]}
            count = torch.tensor([n], device=self.device)
            with convolutions(self.tf32):
                wav = self.maths.push_static(codes, start, count, state).cpu().numpy()
            wav = require_finite(wav, "codec", CODEC_FILE)
        out, first = [], 0
        for p in pushes:
            rows = len(p.codes)
            p.stream.keep({name: t[first : first + rows] for name, t in state.items()}, n)
            out.append(wav[first : first + rows])
            first += rows
        self.calls += 1
        self.pushes += len(pushes)
        return out

    def _take(self) -> list[Push] | None:
        """The next pushes to run: the longest-waiting one's length, once the recent streams have pushed or
        ``gather_s`` has passed."""
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            now = time.monotonic()
            deadline = now + self.gather_s
            self._seen = {k: seen for k, seen in self._seen.items() if now - seen < self.recent_s}  # bounded
            expected = len(self._seen)
            while len(self._waiting) < expected and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            n = self._waiting[0].codes.shape[-1]
            taken = [p for p in self._waiting if p.codes.shape[-1] == n]
            self._waiting = [p for p in self._waiting if p.codes.shape[-1] != n]
            return taken

    def _loop(self) -> None:
        while (pushes := self._take()) is not None:
            try:
                for p, wav in zip(pushes, self.run(pushes)):
                    p.result = wav
            except BaseException as e:  # the pushing threads raise it
                for p in pushes:
                    p.error = e
            for p in pushes:
                p.done.set()
        with self._cond:  # closed: fail whatever still waits
            for p in self._waiting:
                p.error = RuntimeError("the codec thread is closed")
                p.done.set()


class CodecRowsStream:
    """One utterance's codec on a :class:`CodecRows` (the torch backend's codec stream, batched): ``push(codes int
    [C, n])`` -> float32 audio [n * 2048], ``push_rows(codes [B, C, n])`` -> [B, n * 2048] for B utterances in
    lock-step; the samples the backend's own stream gives (to float rounding). Raises ValueError past the
    decoder's ``max_frames``."""

    def __init__(self, rows: CodecRows):
        self.rows, self.frames = rows, 0
        self._state: dict[str, Tensor] | None = None  # made by the codec thread (on its CUDA stream)

    def push(self, codes: np.ndarray) -> np.ndarray:
        return self.push_rows(np.asarray(codes)[None])[0]

    def push_rows(self, codes: np.ndarray) -> np.ndarray:
        # pieces of DEFAULTS.torch.decode_chunk_frames frames: pushes of one length stack, and the static form's mask
        # band stays in the table
        codes = np.asarray(codes, dtype=np.int64)
        pieces = [
            codes[..., s : s + DEFAULTS.torch.decode_chunk_frames]
            for s in range(0, codes.shape[-1], DEFAULTS.torch.decode_chunk_frames)
        ]
        return np.concatenate([self.rows.submit(Push(self, piece)) for piece in pieces], -1)

    def state(self, maths: StreamingDecoder, rows: int, device: torch.device) -> dict[str, Tensor]:
        """This stream's decoder state (:meth:`...model.codec.StreamingDecoder.state_layout`), zeros at first."""
        if self._state is None:
            dtype = next(maths.decoder.parameters()).dtype
            layout = maths.state_layout(rows)
            self._state = {name: torch.zeros(shape, dtype=dtype, device=device) for name, shape in layout.items()}
        return self._state

    def keep(self, state: dict[str, Tensor], frames: int) -> None:
        """The state after a push of ``frames`` frames (called by the codec thread)."""
        self._state, self.frames = state, self.frames + frames
