"""The Python API: ``TTS.load(model)`` then ``tts.synthesize(text)`` -> (audio float32 [N], 44100)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .backends.torch import TorchBackend
from .checkpoint import DEFAULT_MODEL, Checkpoint, CheckpointError, load_checkpoint
from .config import ConfigError
from .engine import frame_budget, generate
from .graphs import SamplingParams
from .prompt import PromptBuilder, check_text
from .tokenizer import load_tokenizer

BACKENDS = ("torch",)


@dataclass
class Synthesis:
    """One utterance: ``audio`` float32 [N] at ``sample_rate`` Hz (N = frames x 2048), its ``codes``
    int64 [num_codebooks, frames], whether eos ended it (False: stopped at the frame cap), the seed that
    reproduces it, and times in seconds (``rtf`` = compute time / audio duration)."""

    audio: np.ndarray
    sample_rate: int
    codes: np.ndarray
    reached_eos: bool
    seed: int
    prompt_length: int
    max_frames: int
    prefill_s: float
    frames_s: float
    codec_s: float

    @property
    def frames(self) -> int:
        return int(self.codes.shape[1])

    @property
    def duration_s(self) -> float:
        return len(self.audio) / self.sample_rate

    @property
    def rtf(self) -> float:
        total = self.prefill_s + self.frames_s + self.codec_s
        return total / self.duration_s if self.duration_s else float("inf")


class TTS:
    """Audio8-TTS-Preview-0.6b loaded from a checkpoint, ready to speak.

    Build with :meth:`load`. Not thread-safe: one utterance at a time per instance (the KV state is
    the backend's).
    """

    def __init__(self, checkpoint: Checkpoint, backend: TorchBackend, prompts: PromptBuilder):
        self.checkpoint = checkpoint
        self.backend = backend
        self.prompts = prompts
        self.config = checkpoint.config

    @classmethod
    def load(cls, model: str | Path = DEFAULT_MODEL, *, device: str = "auto", dtype: str = "fp32",
             backend: str = "torch") -> "TTS":
        """Load a checkpoint folder (publisher layout) or hub id, validate it and build the backend.

        ``device``: auto | cpu | cuda[:N]; ``dtype``: fp32 | bf16 (the codec stays fp32 on CPU).
        Raises CheckpointError (missing/corrupt files, wrong shapes, no tokenizer), BackendError
        (unknown device/dtype/backend).
        """
        from .backends.torch import BackendError

        if backend not in BACKENDS:
            raise BackendError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
        ckpt = load_checkpoint(model)
        if ckpt.tokenizer_dir is None:
            raise CheckpointError(f"{ckpt.path} has no tokenizer.json: a checkpoint folder must hold the "
                                  "tokenizer files (tokenizer.json, tokenizer_config.json) to speak text")
        prompts = PromptBuilder(load_tokenizer(ckpt.tokenizer_dir), ckpt.config)
        return cls(ckpt, TorchBackend(ckpt, device, dtype), prompts)

    @property
    def sample_rate(self) -> int:
        return self.checkpoint.codec_config.sample_rate

    def sampling(self, temperature: float | None = None, top_k: int | None = None,
                 top_p: float | None = None) -> SamplingParams:
        """The checkpoint's generation defaults with the given overrides; raises ConfigError if invalid."""
        gen = self.checkpoint.generation
        over = {k: v for k, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)) if v is not None}
        gen = dataclasses.replace(gen, **over)
        gen.check("sampling settings")
        return SamplingParams.from_configs(self.config, gen)

    def generate(self, text: str, *, seed: int | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, max_frames: int | None = None,
                 on_frame: Callable[[int], None] | None = None,
                 on_start: Callable[[int], None] | None = None) -> Synthesis:
        """Speak ``text``: prompt, prefill, frames until eos or the cap, codec. See :class:`Synthesis`.

        ``seed`` None draws a fresh one (reported in the result). ``max_frames`` None means the
        checkpoint's max_new_tokens (512, about 23.8 s) clipped to the context; an explicit value that
        does not fit is an error. ``on_start(max_frames)`` and ``on_frame(step)`` drive progress bars.
        Raises PromptError (empty/unspeakable text), EngineError (does not fit the context), ConfigError
        (bad sampling settings).
        """
        params = self.sampling(temperature, top_k, top_p)
        prompt = self.prompts.plain(check_text(text))
        budget = frame_budget(self.config, prompt.shape[1], max_frames, self.checkpoint.generation.max_new_tokens)
        if seed is None:
            seed = secrets.randbelow(2**31)
        elif not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seed must be an integer >= 0, got {seed!r}")
        if on_start is not None:
            on_start(budget)
        gen = generate(self.backend, prompt, params, seed, budget, on_frame)
        t0 = time.perf_counter()
        if gen.frames:
            audio = self.backend.decode_window(gen.codes)
        else:
            audio = np.zeros(0, dtype=np.float32)
        codec_s = time.perf_counter() - t0
        return Synthesis(audio, self.sample_rate, gen.codes, gen.reached_eos, seed, gen.prompt_length, budget,
                         gen.prefill_s, gen.frames_s, codec_s)

    def synthesize(self, text: str, **kwargs) -> tuple[np.ndarray, int]:
        """``(audio float32 [N], sample_rate)`` for ``text``; keyword arguments as :meth:`generate`."""
        out = self.generate(text, **kwargs)
        return out.audio, out.sample_rate

