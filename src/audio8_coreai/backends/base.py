"""The backend interface: every call the engine makes, its result types and who drives a backend's KV state.

A backend runs the model's graphs on one runtime (DESIGN.md principle 1): :class:`..backends.torch.TorchBackend`
(PyTorch, eager or CUDA graphs) and :class:`..backends.coreai.CoreAIBackend` (converted assets). Inputs and
outputs are NumPy arrays, so the engine is the same for every backend. The interface is declared whole here
(Kokoro-FastAPI's ``inference/base.py`` is the model): the engine, the API and the tools call these methods and
never probe for others.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..checkpoint import Checkpoint
from ..config import ModelConfig, SamplingParams
from ..errors import BackendError, EngineError
from ..settings import DEFAULTS


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
    parity, agreement, the gate; the frame loop needs only the ids, a few bytes a row off the device)."""

    column: np.ndarray | None
    pos: int
    noise_slow: np.ndarray
    window: np.ndarray
    noise_fast: np.ndarray
    forced: np.ndarray | None = None
    logits: bool = False


class CodecStream(Protocol):
    """One utterance's incremental codec: ``push(codes int64 [C, n]) -> float32 audio [n * frame_length]``, the
    samples the whole-utterance decode gives for those frames."""

    def push(self, codes: np.ndarray) -> np.ndarray: ...


class Lease:
    """Who drives a backend's KV state: one utterance at a time, from any thread.

    :meth:`hold` runs a block alone and starts a new utterance (its token); :meth:`resume` runs a later step of
    the utterance of ``token`` alone, and raises EngineError when another utterance has held the backend since
    (it overwrote the KV state this one would continue from: going on would give wrong audio, silently).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[int]:
        with self._lock:
            self._epoch += 1
            yield self._epoch

    @contextlib.contextmanager
    def resume(self, token: int) -> Iterator[None]:
        with self._lock:
            if self._epoch != token:
                raise EngineError(
                    "this stream was overtaken: another utterance ran on the same model since its "
                    "last frame (a TTS makes one utterance at a time); finish or close a stream "
                    "before the next call on that TTS, or give each thread its own TTS"
                )
            yield


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

    def close(self) -> None:  # noqa: B027 - not abstract: most backends hold nothing outside the process
        """Release what the backend holds outside this process (the torch backend's codec process); idempotent.
        Nothing by default."""


BACKENDS = ("torch", "coreai")


def check_backend_choice(
    backend: str, device: str = "auto", assets: object = None, cuda_graphs: bool | None = DEFAULTS.cuda_graphs
) -> None:
    """Check a backend choice before anything loads: a known backend, assets exactly for coreai, CUDA graphs
    (``cuda_graphs`` True; None is the default, on where the device is CUDA) only for torch on a CUDA device.
    Raises BackendError saying what to change."""
    from .torch import resolve_device

    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    if backend == "coreai" and assets is None:
        raise BackendError(
            "the coreai backend runs converted assets: give assets=DIR (--assets), a folder written by audio8 convert"
        )
    if backend != "coreai" and assets is not None:
        raise BackendError(
            "assets (--assets) are run by the coreai backend: add backend='coreai' "
            "(--backend coreai), or drop the assets to use the torch backend"
        )
    if backend == "coreai" and cuda_graphs:
        raise BackendError("CUDA graphs (--cuda-graphs) are a torch-backend option: drop them for coreai")
    if cuda_graphs and resolve_device(device).type != "cuda":
        raise BackendError(
            f"CUDA graphs need a CUDA device, not {resolve_device(device)}: drop the option or use --device cuda"
        )


def open_backend(
    checkpoint: Checkpoint,
    backend: str = "torch",
    *,
    device: str = "auto",
    precision: str | None = None,
    codec_dtype: str | None = None,
    cuda_graphs: bool | None = DEFAULTS.cuda_graphs,
    assets: object = None,
    prefix_length: Callable[[np.ndarray], int] | None = None,
    codec_process: bool | None = DEFAULTS.codec_process,
) -> Backend:
    """THE backend picker (the API, the CLI and the gate call it): ``torch`` on ``device`` at ``precision`` (None:
    the device's default), its codec at ``codec_dtype``, frames as CUDA graphs with ``cuda_graphs`` (None: when the
    device is CUDA; single frames and batched rows alike, see :mod:`.torch.cudagraphs`), prompt heads
    kept per ``prefix_length``, its codec in a process of its own per ``codec_process`` (None: the default, see
    :class:`.torch.TorchBackend`); or ``coreai`` running the asset folder ``assets``.
    Raises BackendError (see :func:`check_backend_choice`; missing, stale or foreign assets), PrecisionError."""
    check_backend_choice(backend, device, assets, cuda_graphs)
    if backend == "coreai":
        from .coreai import CoreAIBackend

        return CoreAIBackend(checkpoint, assets)
    from .torch import TorchBackend, resolve_device

    if cuda_graphs is None:
        cuda_graphs = resolve_device(device).type == "cuda"
    return TorchBackend(
        checkpoint,
        device,
        precision=precision,
        codec_dtype=codec_dtype,
        frame_mode="graph" if cuda_graphs else "eager",
        prefix_length=prefix_length,
        codec_process=codec_process,
    )
