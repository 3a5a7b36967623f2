"""The backend interface: every call the engine makes, its result types and who drives a backend's KV state.

A backend runs the model's graphs on one runtime (DESIGN.md principle 1): :class:`..backends.torch.TorchBackend`
(PyTorch, eager or CUDA graphs) and :class:`..backends.coreai.CoreAIBackend` (converted assets). Inputs and
outputs are NumPy arrays, so the engine is the same for every backend. The interface is declared whole here
(Kokoro-FastAPI's ``inference/base.py`` is the model): the engine, the API and the tools call these methods and
never probe for others.
"""

from __future__ import annotations

import contextlib
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..checkpoint import Checkpoint
from ..config import ModelConfig, SamplingParams
from ..errors import BackendError, EngineError


@dataclass
class FrameResult:
    """One frame as NumPy: ``semantic`` id, ``codes`` int64 [C], the sampler's own draws ``sampled_semantic`` and
    ``sampled_codes`` [C] (differ from the kept ones only under teacher forcing) and, when the step asked for them
    (:attr:`StepInputs.logits`; a backend may give them anyway), the slow ``logits`` [V+1] and ``hidden`` [dim] it
    was drawn from and ``fast_logits`` [C-1, codebook_size] (float32), else None."""

    semantic: int
    codes: np.ndarray
    sampled_semantic: int
    sampled_codes: np.ndarray
    logits: np.ndarray | None = None
    hidden: np.ndarray | None = None
    fast_logits: np.ndarray | None = None


@dataclass
class StepInputs:
    """One step's inputs to a backend: the previous ``column`` int64 [1+C] at slot ``pos`` (None: frame 0, drawn
    from the prefill), ``noise_slow`` [2, V+1], RAS ``window`` [W], ``noise_fast`` [C-1, codebook_size], ``forced``
    [1+C] (teacher forcing) or None, and ``logits``: whether the result carries the logits and hidden (tools:
    parity, agreement, the gate; the frame loop needs only the ids, a few bytes a row off the device).
    ``draw_ahead`` (None: nothing to do) starts drawing the utterance's next noise
    (:class:`..engine.noise.NoiseAhead`): a backend whose frames leave the host idle calls it once the frame is
    launched, before it waits for the results, so the draws run while the device does, not while the host stages."""

    column: np.ndarray | None
    pos: int
    noise_slow: np.ndarray
    window: np.ndarray
    noise_fast: np.ndarray
    forced: np.ndarray | None = None
    logits: bool = False
    draw_ahead: Callable[[], None] | None = None


class CodecStream(Protocol):
    """One utterance's incremental codec: ``push(codes int64 [C, n]) -> float32 audio [n * frame_length]``, the
    samples the whole-utterance decode gives for those frames."""

    def push(self, codes: np.ndarray) -> np.ndarray: ...


def machine_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (``sysconf``); None where it cannot be told (not POSIX)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - no sysconf names
        return None


class BatchFrames(Protocol):
    """Many utterances' frames in one call, each utterance in a KV row of its own (the torch backend's
    :class:`.torch.rows.TorchBatchFrames`): the calls :mod:`..engine.batch` makes. ``backend`` is the backend it
    runs on."""

    backend: Backend

    @property
    def free(self) -> int: ...

    def acquire(self) -> int: ...

    def release(self, row: int) -> None: ...

    def prefill(self, row: int, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def frames(self, params: SamplingParams, calls: Sequence[tuple[int, StepInputs]]) -> list[FrameResult]: ...


class FrameRows(Protocol):
    """A frame thread serving row backends, one per request thread, whose frames run as one batched call (the torch
    backend's :class:`.torch.rows.FrameServer`): what :meth:`..tts.TTS.batched` hands the server."""

    def rows(self) -> list[Backend]: ...

    def close(self) -> None: ...


class Lease:
    """Who drives a backend's KV state: one utterance at a time, from any thread.

    :meth:`hold` runs a block alone and starts a new utterance (its token); :meth:`resume` runs a later step of
    the utterance of ``token`` alone, and raises EngineError when another utterance has held the backend since
    (it overwrote the KV state this one would continue from: going on would give wrong audio, silently);
    :meth:`reserve` keeps the backend for one thread across several utterances (a long text's pieces), its own
    holds and resumes running within it while other threads wait. Each raises EngineError when the thread already
    holds the backend (a call on a TTS from its own ``on_frame`` callback), which would otherwise wait for itself
    for ever.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._holder: int | None = None  # the thread in a hold or resume block
        self._owner: int | None = None  # the thread whose reserve block has the lock

    def _check_free(self, me: int) -> None:
        if self._holder == me:
            raise EngineError(
                "a call on this TTS from inside its own utterance (an on_frame callback): it would wait for "
                "itself; make the next utterance after this call returns, or on another TTS"
            )

    @contextlib.contextmanager
    def _alone(self) -> Iterator[None]:
        me = threading.get_ident()
        self._check_free(me)
        with contextlib.nullcontext() if self._owner == me else self._lock:  # in its reserve: the lock is its own
            self._holder = me
            try:
                yield
            finally:
                self._holder = None

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        with self._alone():
            self._epoch += 1
            yield self._epoch

    @contextlib.contextmanager
    def resume(self, token: int) -> Iterator[None]:
        with self._alone():
            if self._epoch != token:
                raise EngineError(
                    "this stream was overtaken: another utterance ran on the same model since its "
                    "last frame (a TTS makes one utterance at a time); finish or close a stream "
                    "before the next call on that TTS, or give each thread its own TTS"
                )
            yield

    @contextlib.contextmanager
    def reserve(self) -> Iterator[None]:
        """Keep the backend for this thread's block (its utterances' holds and resumes run inside it, nested
        reserves too) while other threads wait; EngineError inside an utterance of its own (see the class)."""
        me = threading.get_ident()
        self._check_free(me)
        if self._owner == me:  # nested: the outer block keeps it
            yield
            return
        with self._lock:
            self._owner = me
            try:
                yield
            finally:
                self._owner = None


class Backend(ABC):
    """The calls the engine, the API and the tools make on a backend, batch 1 (one utterance at a time):
    :meth:`prefill`, :meth:`frame`, the codec (:meth:`decode_window`, :meth:`codec_stream`, :meth:`encode`),
    :meth:`reset`.

    Attributes every backend sets: ``name`` (``torch``, ``coreai``), ``cfg`` (the model's config; Core AI assets
    may hold a shorter context than the checkpoint's), ``checkpoint``, ``precision`` (its name, see
    :mod:`..precision`), ``lease`` (a :class:`Lease`: every caller driving an utterance takes it), ``sampling``
    (the sampling settings its frame graphs bake in; None: any).
    """

    name: str
    cfg: ModelConfig
    checkpoint: Checkpoint
    precision: str
    sampling: SamplingParams | None = None
    overlaps_codec: bool = False
    """Whether its codec can run on a thread of its own beside its frames (streaming's ``overlap_codec``)."""
    codec_process: bool = False
    """Whether its codec runs in a process of its own (on another core): streaming and whole-utterance decodes then
    overlap it with the frames by default."""
    noise_ahead: bool = False
    """Whether its frames leave the host idle (a GPU's), so the loop draws each step's noise during the step before
    (:mod:`..engine.noise`)."""
    batches: bool = False
    """Whether it runs many utterances' frames in one call (:meth:`batch_frames`, :meth:`frame_rows`)."""

    def __init__(self) -> None:
        self.lease = Lease()

    @property
    @abstractmethod
    def description(self) -> str:
        """One line for people: runtime, device, precision; no path (a server answers it in /health)."""

    @property
    def device_name(self) -> str:
        """Where the model runs, for people (``cpu``, ``cuda:0``; a runtime that picks its own compute units says
        its description)."""
        return self.description

    @property
    def codec_process_pid(self) -> int | None:
        """The pid of the process its codec runs in, when one of its own (``codec_process``); else None: what a
        tool adds to count this backend's memory whole."""
        return None

    def draws_like(self, params: SamplingParams) -> bool:
        """Whether this backend draws with ``params``: any settings, unless its graphs bake some in (then the same
        settings, or both greedy)."""
        return self.sampling is None or params == self.sampling or not (params.do_sample or self.sampling.do_sample)

    @abstractmethod
    def reset(self) -> None:
        """Zero the KV state (a new utterance)."""

    @abstractmethod
    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Run the prompt int64 [1+C, P] from slot 0; return the last column's compact logits [V+1] and post-norm
        hidden [dim] (float32), kept for frame 0."""

    @abstractmethod
    def frame(self, params: SamplingParams, step: StepInputs) -> FrameResult:
        """One frame: frame 0 drawn from the prefill's last logits and hidden (``step.column`` None), or the slow
        step on the previous column at slot ``step.pos`` then the draws (see :class:`StepInputs`)."""

    @abstractmethod
    def decode_window(self, codes: np.ndarray) -> np.ndarray:
        """Codec decode of codes int64 [C, T] -> float32 audio [T * frame_length] at the codec's rate."""

    @abstractmethod
    def codec_stream(self) -> CodecStream:
        """A fresh incremental codec for one utterance."""

    @abstractmethod
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Codec encode of mono float32 audio [N] at the codec's rate -> codes int64 [C, ceil(N / frame_length)]."""

    def decode_batch(self, codes: list[np.ndarray]) -> list[np.ndarray]:
        """:meth:`decode_window` of several utterances (codes int [C, T_i] each) -> float32 [T_i * frame_length]
        each (0 frames: 0 samples); a backend that batches its codec makes it one call."""
        return [self.decode_window(c) if c.shape[1] else np.zeros(0, dtype=np.float32) for c in codes]

    def batch_frames(self, max_batch: int) -> BatchFrames:
        """``max_batch`` KV rows whose frames run in one call (:mod:`..engine.batch`). Raises BackendError on a
        backend that does not batch (``batches`` False): :meth:`no_batching`."""
        raise self.no_batching()

    def frame_rows(self, max_batch: int, warm: Sequence[SamplingParams] = ()) -> FrameRows:
        """A frame thread and ``max_batch`` row backends whose frames run as one batched call, its graphs captured
        now for each of ``warm``'s sampling settings. Raises BackendError on a backend that does not batch."""
        raise self.no_batching()

    def no_batching(self) -> BackendError:
        """The error of a batch asked of this backend where it runs none (``batches`` False), saying what does."""
        return BackendError(
            f"batching runs on the torch backend, not {self.name}: load with backend='torch' (--backend torch), or "
            "drop the batch (--batch)"
        )

    def codec_stages(self, codes: np.ndarray) -> dict[str, np.ndarray] | None:
        """The codec decoder's stages for codes int [1, C, T], float32 by name (``post_in``, ``post_out``,
        ``upsample_out``, ``waveform`` [1, T * frame_length]: the oracle's recordings), for the parity tool; None
        where the runtime shows only the waveform (``decode_window``)."""
        return None

    def encoder_latent(self, audio: np.ndarray) -> np.ndarray | None:
        """The codec encoder's latent float32 of ``audio`` float32 [frames * frame_length] (whole frames), for the
        parity tool; None where the runtime shows only the codes (``encode``)."""
        return None

    def memory_bytes(self) -> int | None:
        """The memory of what its model runs on, in bytes (this machine's by default); None where it cannot be
        told. What ``audio8 serve --workers`` checks its instances against."""
        return machine_memory_bytes()

    def ready(self) -> None:  # noqa: B027 - not abstract: most backends load every part at once
        """Load and check now what speech needs besides the frame (the codec), raising what its first use would
        (:meth:`..tts.TTS.load` calls it: a speaker must not fail after its frames). Nothing by default."""

    def close(self) -> None:  # noqa: B027 - not abstract: most backends hold nothing outside the process
        """Release what the backend holds outside this process (the torch backend's codec process); idempotent.
        Nothing by default."""
