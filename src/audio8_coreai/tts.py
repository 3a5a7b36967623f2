"""The Python API: ``TTS.load(model)`` then ``tts.synthesize(text)`` -> (audio float32 [N], 44100)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from .backends.base import Backend, FrameRows
from .backends.choice import check_backend_choice, open_backend
from .checkpoint import DEFAULT_MODEL, Checkpoint, load_checkpoint
from .checkpoint.layout import FOLDER_CONTENTS
from .cloning import VoiceCloning
from .config import SamplingParams, check_int
from .engine.batch import generate_batch
from .engine.loop import frame_budget, generate
from .engine.overlap import UtteranceDecode
from .engine.stream import Piece, SpeechStream
from .errors import BackendError, CheckpointError, EngineError, PromptError, PromptTooLong
from .request import check_seed, sampling_config
from .settings import DEFAULTS
from .synthesis import Synthesis
from .text import PromptBuilder, check_text, load_tokenizer, split_text, warn_language
from .voices import Voice, VoiceStore


class TTS(VoiceCloning):
    """Audio8-TTS-Preview-0.6b loaded from a checkpoint, ready to speak.

    Build with :meth:`load`. One utterance at a time per instance (the KV state is the backend's): calls from
    several threads take turns (each generate, synthesize or generate_batch whole, a stream step by step), and a
    stream paused while another utterance runs raises EngineError when resumed (it cannot continue from the
    other's state). For utterances in parallel use one TTS per thread, or :meth:`generate_batch`.
    """

    def __init__(
        self, checkpoint: Checkpoint, backend: Backend, prompts: PromptBuilder, voices: VoiceStore | None = None
    ):
        self.checkpoint = checkpoint
        self.backend = backend
        self.prompts = prompts
        self.config = backend.cfg  # the backend's context: Core AI assets may hold less than max_seq_len
        self.voices = voices if voices is not None else VoiceStore()  # where voice=NAME is looked up

    @classmethod
    def load(
        cls,
        model: str | Path = DEFAULT_MODEL,
        *,
        device: str = "auto",
        dtype: str | None = None,
        backend: str = "torch",
        voices_dir: str | Path | None = None,
        assets: str | Path | None = None,
        precision: str | None = None,
        codec_dtype: str | None = None,
        cuda_graphs: bool | None = DEFAULTS.cuda_graphs,
        codec_process: bool | None = DEFAULTS.codec_process,
    ) -> TTS:
        """Load a checkpoint folder (publisher layout) or hub id, validate it and build the backend.

        ``device``: auto | cpu | cuda[:N]; ``dtype``: fp32 | bf16 (the codec stays fp32 on CPU).
        ``precision`` (torch): fp32 | bf16 | fp16w | int16 | int12 | int8 | int8-int16 (precision.py); given, it
        overrides ``dtype``; with neither, the default: on CPU fp16w for bf16 weights (the release: float16 holds
        them, so the draws are fp32's) and int16 for fp32 ones, fp32 on CUDA. ``codec_dtype`` (torch): bf16
        opts the codec decoder into bf16 on CPU (not exact); default fp32 on CPU, as the publisher.
        ``cuda_graphs`` (torch on CUDA): replay each frame as one captured CUDA graph, and batched frames
        (:meth:`batched`) as one per bucketed batch size (backends/torch/cudagraphs.py); None (the default): on
        when the device is CUDA; False: eager frames.
        ``codec_process`` (torch on CPU): the codec decoder in a process of its own, on another core beside the
        frames (streaming and :meth:`generate` overlap the two; same samples); None: on when 2+ CPUs are usable.
        :meth:`close` (or ``with TTS.load(...) as tts:``) ends that process; it also ends with this one.
        ``voices_dir``: the voice store's folder (default: the per-user one, see :mod:`.voices`).
        ``backend``: torch, or coreai with ``assets`` the folder ``audio8 convert`` wrote from this
        checkpoint (``device``/``dtype`` then do not apply: the assets fix the precision).
        Raises CheckpointError (missing/corrupt files, wrong shapes, no tokenizer), BackendError
        (unknown device/dtype/backend; missing, stale or foreign assets; cuda_graphs off CUDA).
        """
        check_backend_choice(backend, device, assets, cuda_graphs)
        ckpt = load_checkpoint(model)
        ckpt.fingerprint()  # of the files as loaded: voices are checked against these weights, not later files
        if ckpt.tokenizer_dir is None:
            raise CheckpointError(f"{ckpt.path} has no tokenizer.json: a checkpoint folder must hold {FOLDER_CONTENTS}")
        prompts = PromptBuilder(load_tokenizer(ckpt.tokenizer_dir), ckpt.config)
        chosen = open_backend(
            ckpt,
            backend,
            device=device,
            precision=precision or dtype,
            codec_dtype=codec_dtype,
            cuda_graphs=cuda_graphs,
            assets=assets,
            prefix_length=prompts.prefix_length,
            codec_process=codec_process,
        )
        return cls(ckpt, chosen, prompts, VoiceStore(voices_dir))

    def close(self) -> None:
        """End what the backend runs outside this process (the codec process); idempotent. A closed TTS raises
        BackendError on its next codec call."""
        self.backend.close()

    def __enter__(self) -> TTS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def sample_rate(self) -> int:
        return self.checkpoint.codec_config.sample_rate

    def sampling(
        self, temperature: float | None = None, top_k: int | None = None, top_p: float | None = None
    ) -> SamplingParams:
        """The checkpoint's generation defaults with the given overrides; raises ConfigError if invalid."""
        gen = sampling_config(self.checkpoint.generation, temperature, top_k, top_p)
        return SamplingParams.from_configs(self.config, gen)

    def generate(
        self,
        text: str,
        *,
        seed: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        max_frames: int | None = None,
        on_frame: Callable[[int], None] | None = None,
        on_start: Callable[[int], None] | None = None,
        voice: str | Voice | None = None,
        ref_audio: str | Path | None = None,
        ref_text: str | None = None,
    ) -> Synthesis:
        """Speak ``text``: prompt, prefill, frames until eos or the cap, codec. See :class:`Synthesis`.

        ``seed`` None draws a fresh one (reported in the result). ``max_frames`` None means the text's cap
        (3.0 s plus 0.74 s per text token, settings.py), at most the checkpoint's max_new_tokens (512, about
        23.8 s), clipped to the context; an explicit value is the caller's cap, and one that does not fit is an
        error. ``on_start(max_frames)`` and ``on_frame(step)`` drive progress bars. In a cloned voice:
        ``voice`` (a name in :attr:`voices`, or a :class:`Voice`), or a one-off clip ``ref_audio`` (a file, see
        :meth:`voice_from_clip`) with its transcript ``ref_text``; the prompt is then the publisher's clone prompt.
        Raises PromptError (empty/unspeakable text), EngineError (does not fit the context), ConfigError
        (bad sampling settings), VoiceError (unknown voice, one from another checkpoint, voice given twice),
        AudioError (an unusable ``ref_audio``).
        """
        params, text = self.sampling(temperature, top_k, top_p), warn_language(check_text(text))
        prompt = self._prompt(text, self._voice(voice, ref_audio, ref_text))
        budget = self._budget(text, prompt, max_frames, self.checkpoint.generation.max_new_tokens)
        seed = check_seed(seed)
        if on_start is not None:
            on_start(budget)
        with UtteranceDecode(self.backend) as decode:  # beside the frames when the codec has a process of its own
            gen = generate(self.backend, prompt, params, seed, budget, on_frame, on_codes=decode.add)
            t0 = time.perf_counter()
            audio = decode.audio(gen.codes)
        codec_s = time.perf_counter() - t0
        return Synthesis(
            audio,
            self.sample_rate,
            gen.codes,
            gen.reached_eos,
            seed,
            gen.prompt_length,
            budget,
            gen.prefill_s,
            gen.frames_s,
            codec_s,
        )

    def generate_batch(
        self,
        texts: Sequence[str],
        *,
        seeds: Sequence[int | None] | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        max_frames: int | None = None,
        voice: str | Voice | None = None,
        max_batch: int = 8,
    ) -> list[Synthesis]:
        """:meth:`generate` for several texts at once: up to ``max_batch`` utterances share every frame call
        (:mod:`.engine.batch`: the weights are read once per frame for all of them), then one batched codec call.

        Utterance i is what ``generate(texts[i], seed=seeds[i], ...)`` gives (same codes at fp32; at int16 the
        batched matmuls round differently and a draw may rarely differ). ``seeds`` None (or a None entry) draws
        fresh ones. Each text must fit one utterance (no splitting). ``frames_s`` is an utterance's time from
        its admission to its last frame (shared frame calls included), ``codec_s`` the batched decode's time.
        Raises as :meth:`generate`, and BackendError on a backend other than torch, ValueError when ``seeds``
        does not match ``texts`` or ``max_batch`` < 1, TypeError when ``texts`` is one string.
        """
        if not self.backend.batches:
            raise BackendError(f"batched generation runs on the torch backend, not {self.backend.name}")
        if isinstance(texts, str):  # a str is a sequence too: its characters would become texts
            raise TypeError(
                "texts must be a list of strings, not one string: use generate() for one text, or "
                "generate_batch([text])"
            )
        max_batch = check_int(max_batch, "max_batch")
        if not isinstance(texts, (list, tuple)):  # a set or dict has no order to keep; a generator no length
            raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
        if seeds is None:
            seeds = [None] * len(texts)
        if not isinstance(seeds, (list, tuple)) or len(seeds) != len(texts):
            raise ValueError(f"{len(texts)} texts but seeds {seeds!r}: give a list of one seed per text (or none)")
        params = self.sampling(temperature, top_k, top_p)
        chosen = self._voice(voice, None, None)
        texts = [warn_language(check_text(t)) for t in texts]
        prompts = [self._prompt(t, chosen) for t in texts]
        default = self.checkpoint.generation.max_new_tokens
        budgets = [self._budget(t, p, max_frames, default) for t, p in zip(texts, prompts)]
        seeds = [check_seed(s) for s in seeds]
        with self.backend.lease.hold():  # its prefills pass through the backend (the last logits it keeps)
            gens = generate_batch(self.backend, prompts, params, seeds, budgets, max_batch)
        t0 = time.perf_counter()
        audio = self.backend.decode_batch([g.codes for g in gens])
        codec_s = time.perf_counter() - t0
        return [
            Synthesis(
                a, self.sample_rate, g.codes, g.reached_eos, s, g.prompt_length, b, g.prefill_s, g.frames_s, codec_s
            )
            for a, g, s, b in zip(audio, gens, seeds, budgets)
        ]

    def batched(self, max_batch: int) -> tuple[FrameRows, list[TTS]]:
        """``max_batch`` TTS instances sharing this one's model through one frame thread (``Backend.frame_rows``:
        the torch backend's :class:`.backends.torch.rows.FrameServer`): one per server worker, their frames run as
        one batched call, graphs captured now for the default sampling. Raises BackendError on a backend that does
        not batch, ConfigError for ``max_batch`` < 1."""
        server = self.backend.frame_rows(check_int(max_batch, "max_batch"), warm=[self.sampling()])
        return server, [TTS(self.checkpoint, row, self.prompts, self.voices) for row in server.rows()]

    def synthesize(
        self,
        text: str,
        *,
        on_start: Callable[[int], None] | None = None,
        voice: str | Voice | None = None,
        ref_audio: str | Path | None = None,
        ref_text: str | None = None,
        **kwargs,
    ) -> tuple[np.ndarray, int]:
        """``(audio float32 [N], sample_rate)`` for ``text`` of any length; keyword arguments as :meth:`generate`.

        Text that fits one utterance (:meth:`fits_one_utterance`) is :meth:`generate`'s audio. Longer text is
        split and spoken piece by piece as :meth:`stream` does (the same samples, pauses included) and the pieces'
        audio joined; ``on_start`` then gets the most frames all pieces together may make. Raises as
        :meth:`generate` and :meth:`stream`.
        """
        chosen = self._voice(voice, ref_audio, ref_text)  # a clip is encoded once
        if self.fits_one_utterance(text, chosen):
            out = self.generate(text, on_start=on_start, voice=chosen, **kwargs)
            return out.audio, out.sample_rate
        # Every chunk DEFAULTS.chunk_frames long, the push size that decodes fastest (see TorchBackend.decode_window).
        speech = self.stream(
            text, chunk_frames=DEFAULTS.chunk_frames, first_chunk_frames=DEFAULTS.chunk_frames, voice=chosen, **kwargs
        )
        if on_start is not None:
            on_start(speech.max_frames)
        chunks = list(speech)
        return (np.concatenate(chunks) if chunks else np.zeros(0, np.float32)), self.sample_rate

    def fits_one_utterance(self, text: str, voice: str | Voice | None = None) -> bool:
        """Whether ``text`` spoken in ``voice`` (a name, a :class:`Voice` or None) is one utterance: :meth:`stream`
        keeps it in one piece (its prompt plus its estimated speech fit the context and the default frame
        budget). :meth:`synthesize` and ``audio8 say`` speak such text with :meth:`generate` and split the rest
        as :meth:`stream` does, so a text whose speech would run past the frame budget is not cut at the cap.
        Raises PromptError for unspeakable text or text that cannot be split, VoiceError as :meth:`generate`."""
        text, chosen = check_text(text), self._voice(voice, None, None)
        try:
            return len(self._split(text, chosen)) == 1
        except PromptTooLong:  # the prompt around the text alone fills the context
            return False

    def stream(
        self,
        text: str,
        *,
        chunk_frames: int = DEFAULTS.chunk_frames,
        first_chunk_frames: int | None = None,
        seed: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        max_frames: int | None = None,
        voice: str | Voice | None = None,
        ref_audio: str | Path | None = None,
        ref_text: str | None = None,
        on_frame: Callable[[int], None] | None = None,
        overlap_codec: bool | None = None,
        frame_cap: int | None = None,
    ) -> SpeechStream:
        """Speak ``text`` as it is made: a :class:`.streaming.SpeechStream` of float32 chunks (mono, 44.1 kHz),
        exact to the whole-utterance decode. The first chunk holds ``first_chunk_frames`` (None: 1, at most
        ``chunk_frames``), so the first audio comes sooner, and each next one twice the last up to
        ``chunk_frames`` (default 16 frames, 0.74 s), so sent audio covers the next chunk's making when frames
        come faster than real time.

        Text is split (:func:`.text.split_text`) into pieces whose estimated speech (``DEFAULTS.frames_per_token``
        frames per text token) fits the context and the checkpoint's ``max_new_tokens``; they are spoken in
        order in the same voice, the seed's noise stream running on, with a short pause between. Text the
        splitter keeps in one piece gives :meth:`generate`'s samples with the same arguments (a prompt that fits
        the context may still be split, when its estimated speech would not fit). ``max_frames`` caps every
        piece (None: as :meth:`generate`, at most ``frame_cap`` when given: a ceiling clipped to what the
        context leaves, as a server's cap); ``on_frame`` as in :class:`.streaming.SpeechStream`;
        ``overlap_codec`` decodes each chunk while the next chunk's frames are made (same samples; None: when the
        codec runs in a process of its own, see :meth:`load`; see SpeechStream); the other arguments as
        :meth:`generate`.
        Everything is checked here, before any frame (the stream's ``seed`` tells the one drawn when None):
        raises as :meth:`generate` does, PromptError for a run of text that cannot be split to fit, and
        ConfigError for ``chunk_frames`` or ``first_chunk_frames`` < 1 (a first chunk may be longer than the
        others through the API; the CLI and server keep it at most ``chunk_frames``).
        """
        params = self.sampling(temperature, top_k, top_p)
        text = warn_language(check_text(text))
        chosen = self._voice(voice, ref_audio, ref_text)
        parts = self._split(text, chosen)
        default_frames = self.checkpoint.generation.max_new_tokens
        if frame_cap is not None:
            default_frames = min(default_frames, check_int(frame_cap, "frame_cap"))
        pieces = []
        for index, words in enumerate(parts):
            prompt = self._prompt(words, chosen)
            try:
                budget = self._budget(words, prompt, max_frames, default_frames)
            except EngineError as e:
                if len(parts) == 1:
                    raise
                start = words if len(words) <= 40 else words[:40] + "..."
                raise EngineError(f"piece {index + 1} of {len(parts)} ({start!r}): {e}") from None
            pieces.append(Piece(words, prompt, budget))
        codec = self.checkpoint.codec_config
        return SpeechStream(
            self.backend,
            pieces,
            params,
            check_seed(seed),
            chunk_frames=chunk_frames,
            first_chunk_frames=first_chunk_frames,
            sample_rate=self.sample_rate,
            frame_length=codec.frame_length,
            on_frame=on_frame,
            overlap_codec=overlap_codec,
        )

    def _split(self, text: str, voice: Voice | None) -> list[str]:
        """Checked ``text`` as the pieces :meth:`stream` speaks in ``voice``: each one's prompt plus its estimated
        speech (DEFAULTS.frames_per_token frames per text token) fits the context, and its frames the default frame
        budget. Raises PromptError for a run of text that cannot be split to fit."""

        def count(words: str) -> int:
            return len(self.prompts.encode(words))

        overhead = self._prompt("a", voice).shape[1] - count("a")
        max_tokens = min(
            (self.config.max_seq_len - overhead) // (1 + DEFAULTS.frames_per_token),
            self.checkpoint.generation.max_new_tokens // DEFAULTS.frames_per_token,
        )
        try:
            return split_text(text, max_tokens, count)
        except PromptError as e:
            if voice is None:
                raise
            raise PromptError(
                f"{e}; here the prompt around the text (the voice's reference clip and transcript "
                f"included) takes {overhead} of the context's {self.config.max_seq_len} positions, so a "
                "voice made from a shorter clip leaves room for longer pieces"
            ) from None

    def _budget(self, text: str, prompt: np.ndarray, max_frames: int | None, default_frames: int) -> int:
        """The frame cap of checked ``text`` spoken after ``prompt``: :func:`.engine.loop.frame_budget`, the text's
        own cap (settings.py, cap_base_frames) included."""
        return frame_budget(self.config, prompt.shape[1], max_frames, default_frames, len(self.prompts.encode(text)))

    def _prompt(self, text: str, voice: Voice | None) -> np.ndarray:
        """The [1+C, P] prompt of checked ``text``: plain, or the clone prompt of ``voice``."""
        if voice is None:
            return self.prompts.plain(text)
        return self.prompts.clone(text, voice.transcript, voice.codes)
