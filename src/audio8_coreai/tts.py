"""The Python API: ``TTS.load(model)`` then ``tts.synthesize(text)`` -> (audio float32 [N], 44100)."""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .backends.base import Backend
from .backends.choice import check_backend_choice, open_backend
from .batching import Batching
from .checkpoint import DEFAULT_MODEL, Checkpoint, load_checkpoint
from .checkpoint.layout import FOLDER_CONTENTS
from .cloning import VoiceCloning, warn_clip
from .config import SamplingParams
from .engine.loop import generate
from .engine.overlap import UtteranceDecode
from .engine.stream import SpeechStream
from .errors import BackendError, CheckpointError, EngineError, UnsupportedLanguageWarning
from .plan import Plan, make_plan, sampling_defaults
from .request import REQUEST_KEYWORDS, CheckedRequest, check_callback, check_request, sampling_config
from .settings import DEFAULTS
from .synthesis import Synthesis
from .text import PromptBuilder, load_tokenizer
from .values import check_int, check_switch
from .voices import Voice, VoiceStore


class TTS(VoiceCloning, Batching):
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
        self.closed = False

    @classmethod
    def load(
        cls,
        model: str | Path = DEFAULT_MODEL,
        *,
        device: str = "auto",
        backend: str = "torch",
        voices_dir: str | Path | None = None,
        assets: str | Path | None = None,
        precision: str | None = None,
        codec_dtype: str | None = DEFAULTS.torch.codec_dtype,
        cuda_graphs: bool | None = DEFAULTS.torch.cuda_graphs,
        codec_process: bool | None = DEFAULTS.torch.codec_process,
    ) -> TTS:
        """Load a checkpoint folder (publisher layout) or hub id, validate it and build the backend.

        ``device``: auto | cpu | cuda[:N]. ``precision`` (torch): a name of precision.py's table (fp32, bf16, fp16w,
        bf16w, int16, ...); None, the default: on CPU fp16w for bf16 weights (the release: float16 holds them, so
        the draws are fp32's) and int16 for fp32 ones, fp32 on CUDA. ``codec_dtype`` (torch): the codec decoder's
        form, opt-in and not exact: bf16, or tf32 on CUDA (fp32 with cuDNN's TF32 convolutions, about twice the
        batched codec's streams, samples within about 4e-3 of fp32; the encoder stays fp32); None: fp32 on CPU, as
        the publisher, the model's dtype on CUDA; default ``DEFAULTS.torch.codec_dtype``.
        ``cuda_graphs`` (torch on CUDA): replay each frame as one captured CUDA graph, and batched frames
        (:meth:`batched`) as one per bucketed batch size (backends/torch/cudagraphs.py); None: on when the device
        is CUDA; False: eager frames; default ``DEFAULTS.torch.cuda_graphs``.
        ``codec_process`` (torch on CPU): the codec decoder in a process of its own, on another core beside the
        frames (streaming and :meth:`generate` overlap the two; the same samples up to float rounding, 1e-5);
        None: on when 2+ CPUs are usable; default ``DEFAULTS.torch.codec_process``.
        :meth:`close` (or ``with TTS.load(...) as tts:``) ends that process; it also ends with this one.
        ``voices_dir``: the voice store's folder (default: the per-user one, see :mod:`.voices`).
        ``backend``: torch, or coreai with ``assets`` the folder ``audio8 convert`` wrote from this
        checkpoint (``device`` then does not apply, and a ``precision`` must be the assets' own: they fix it).
        Raises CheckpointError (missing/corrupt files, wrong shapes, no tokenizer), BackendError
        (unknown device/backend; missing, stale or foreign assets, a codec decoder among them: checked at load;
        cuda_graphs or a tf32 codec off CUDA), PrecisionError (a precision unknown or not the backend's), VoiceError
        (``voices_dir`` a file), ConfigError (``cuda_graphs`` or ``codec_process`` not True, False or None, an
        unknown ``codec_dtype``).
        """
        cuda_graphs = check_switch("cuda_graphs", cuda_graphs)
        codec_process = check_switch("codec_process", codec_process)
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
            precision=precision,
            codec_dtype=codec_dtype,
            cuda_graphs=cuda_graphs,
            assets=assets,
            prefix_length=prompts.prefix_length,
            codec_process=codec_process,
        )
        chosen.ready()  # a Core AI codec part that is missing or damaged: said now, not after the frames
        return cls(ckpt, chosen, prompts, VoiceStore(voices_dir))

    def close(self) -> None:
        """End what the backend runs outside this process (the codec process); idempotent. A closed TTS speaks no
        more: generate, stream, synthesize, generate_batch and batched raise BackendError (load it again)."""
        self.closed = True
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

    def plan(self, checked: CheckedRequest, *, split: bool = True, frame_cap: int | None = None) -> Plan:
        """What ``checked`` (:func:`.request.check_request`) is on this model, decided once (:class:`.plan.Plan`):
        its voice resolved (a stored voice read and a clip encoded here, once, and either checked against this
        checkpoint), its text cut into pieces (``split``: as :meth:`stream` speaks it, each piece's prompt plus its
        estimated speech fitting the context and the frame budget; False: the whole text as one utterance, as
        :meth:`generate` speaks it), each piece's prompt and frame cap, the text's token count, the sampling
        settings and the language warning. ``frame_cap``: a ceiling on the default frame cap (a server's), clipped
        to what the context leaves; an explicit ``max_frames`` is the request's.

        A frame cap (``max_frames`` None) is ``DEFAULTS.speech.cap_base_frames`` plus ``cap_frames_per_token``
        per text token (settings.py), at most the checkpoint's max_new_tokens, clipped to the context; an
        explicit one that does not fit is an error. Raises VoiceError (unknown voice, one from another
        checkpoint), AudioError (an unusable clip), PromptError (a prompt that fills the context, a damaged
        voice's codes, a run of text that cannot be split), EngineError (an explicit ``max_frames`` past the
        context; of a split text, naming the piece), ConfigError (``frame_cap`` no whole number >= 1), TypeError
        (``checked`` no CheckedRequest).
        """
        if not isinstance(checked, CheckedRequest):
            raise TypeError(
                f"plan takes a checked request, not {type(checked).__name__}: "
                "tts.plan(check_request(text, ...)) (audio8_coreai.request.check_request)"
            )
        voice = self._voice(checked)
        ckpt, defaults = self.checkpoint, sampling_defaults(self.checkpoint.generation, self.backend.sampling)
        made_for = (self.prompts, self.config, defaults, ckpt.fingerprint())
        return make_plan(checked, voice, *made_for, split=split, frame_cap=frame_cap)

    def generate(
        self,
        text: str | Plan,
        *,
        on_frame: Callable[[int], None] | None = None,
        on_start: Callable[[int], None] | None = None,
        **request: Any,
    ) -> Synthesis:
        """Speak ``text`` as one utterance: prompt, prefill, frames until eos or the cap, codec. See :class:`Synthesis`.

        ``text`` is a :class:`.plan.Plan` of one piece (:meth:`plan`), spoken as it is; or a string with the keywords
        of :func:`.request.check_request` (``voice``: a name in :attr:`voices` or a :class:`Voice`; or a one-off clip
        ``ref_audio`` with its transcript ``ref_text``; ``seed``, None drawing a fresh one, reported in the result;
        ``temperature``, ``top_k``, ``top_p``; ``max_frames``, see :meth:`plan`), checked and planned whole (not
        split), text outside the model's languages told as an UnsupportedLanguageWarning. ``on_start(max_frames)``
        and ``on_frame(step)`` drive progress bars. A model that ends the utterance on its first frame (eos) gives
        ``frames`` 0 and no audio: speak again with another seed (the CLI and the server refuse such a result).
        Raises what check_request and :meth:`plan` raise; EngineError for a plan of several pieces; TypeError
        for a plan given with request keywords; ConfigError for an ``on_*`` that is no function.
        """
        check_callback("on_frame", on_frame)
        check_callback("on_start", on_start)
        plan = self._planned(text, request, split=False)
        if len(plan.pieces) != 1:
            raise EngineError(
                f"generate speaks one utterance and this plan holds {len(plan.pieces)} pieces: speak it with "
                "stream() or synthesize(), or plan it with split=False"
            )
        (piece,) = plan.pieces
        if on_start is not None:
            on_start(piece.max_frames)
        with UtteranceDecode(self.backend) as decode:  # beside the frames when the codec has a process of its own
            gen = generate(
                self.backend, piece.prompt, plan.params, plan.seed, piece.max_frames, on_frame, on_codes=decode.add
            )
            t0 = time.perf_counter()
            audio = decode.audio(gen.codes)
        codec_s = time.perf_counter() - t0
        return Synthesis(
            audio,
            self.sample_rate,
            gen.codes,
            gen.reached_eos,
            plan.seed,
            gen.prompt_length,
            piece.max_frames,
            gen.prefill_s,
            gen.frames_s,
            codec_s,
        )

    def synthesize(
        self, text: str | Plan, *, on_start: Callable[[int], None] | None = None, **request: Any
    ) -> tuple[np.ndarray, int]:
        """``(audio float32 [N], sample_rate)`` for ``text`` of any length: a plan (:meth:`plan`, split) or a string
        with the keywords of :meth:`generate`.

        A plan of one piece is :meth:`generate`'s audio. Longer text is spoken piece by piece as :meth:`stream`
        does (the same samples, pauses included; its chunk sizes do not matter here) and the pieces' audio joined;
        ``on_start`` then gets the most frames all pieces together may make. Without a ``seed`` a fresh one is drawn
        and not returned: to hear a result again, give ``seed``, or plan first (``plan.seed``) or call
        :meth:`generate` (``Synthesis.seed``) or :meth:`stream` (its ``seed``). Raises as :meth:`generate` and
        :meth:`stream`.
        """
        check_callback("on_start", on_start)
        plan = self._planned(text, request, split=True)
        if len(plan.pieces) == 1:
            out = self.generate(plan, on_start=on_start)
            return out.audio, out.sample_rate
        # Every chunk DEFAULTS.speech.chunk_frames long, the push size that decodes fastest (see
        # TorchBackend.decode_window).
        chunks = DEFAULTS.speech.chunk_frames
        speech = self.stream(dataclasses.replace(plan, chunk_frames=chunks, first_chunk_frames=chunks))
        if on_start is not None:
            on_start(speech.max_frames)
        with self.backend.lease.reserve():  # whole: another thread's utterance between pieces would overtake it
            audio = list(speech)
        return (np.concatenate(audio) if audio else np.zeros(0, np.float32)), self.sample_rate

    def fits_one_utterance(self, text: str, voice: str | Voice | None = None) -> bool:
        """Whether ``text`` spoken in ``voice`` (a name, a :class:`Voice` or None) is one utterance: its plan
        (:meth:`plan`, split as :meth:`stream` splits) holds one piece. Raises PromptError for unspeakable text or
        text that cannot be split, VoiceError as :meth:`generate`."""
        return len(self.plan(check_request(text, voice=voice)).pieces) == 1

    def stream(
        self,
        text: str | Plan,
        *,
        on_frame: Callable[[int], None] | None = None,
        overlap_codec: bool | None = None,
        frame_cap: int | None = None,
        **request: Any,
    ) -> SpeechStream:
        """Speak ``text`` as it is made: a :class:`.engine.stream.SpeechStream` of float32 chunks (mono, 44.1 kHz),
        exact to the whole-utterance decode. The first chunk holds ``first_chunk_frames`` (None:
        ``DEFAULTS.speech.first_chunk_frames``), each next one twice the last up to ``chunk_frames`` (default
        ``DEFAULTS.speech.chunk_frames``): the first audio comes soon, and sent audio covers the next chunk's making.

        ``text`` is a plan (:meth:`plan`), spoken as it is; or a string with the keywords of :meth:`generate`,
        ``chunk_frames``, ``first_chunk_frames`` (here it may exceed ``chunk_frames``; the CLI and server keep it
        within) and ``frame_cap`` (a ceiling on the default frame cap, as a server's), checked and split into pieces
        whose estimated speech (``DEFAULTS.speech.split_frames_per_token`` frames a text token) fits the context and
        the checkpoint's ``max_new_tokens``: spoken in order in one voice, the seed's noise running on, a short pause
        between. Text kept in one piece gives :meth:`generate`'s samples; ``max_frames`` caps every piece.
        ``on_frame`` as in :class:`.engine.stream.SpeechStream`; ``overlap_codec`` decodes each chunk while the next
        one's frames are made (same samples; None: when the codec runs in its own process, see :meth:`load`).
        Everything is checked before any frame (the stream's ``seed`` tells the one drawn when None): raises as
        :meth:`generate` and :meth:`plan`, and ConfigError for ``chunk_frames`` or ``first_chunk_frames`` < 1, an
        ``overlap_codec`` not True, False or None, an ``on_frame`` no function.
        """
        check_callback("on_frame", on_frame)
        overlap_codec = check_switch("overlap_codec", overlap_codec)
        first = None if isinstance(text, Plan) else request.pop("first_chunk_frames", None)
        plan = self._planned(text, request, split=True, frame_cap=frame_cap, first_chunk_frames=first)
        return SpeechStream(
            self.backend,
            list(plan.pieces),
            plan.params,
            plan.seed,
            chunk_frames=plan.chunk_frames,
            first_chunk_frames=plan.first_chunk_frames,
            sample_rate=self.sample_rate,
            frame_length=self.checkpoint.codec_config.frame_length,
            on_frame=on_frame,
            overlap_codec=overlap_codec,
        )

    def _open(self) -> None:
        """BackendError when this model was closed (:meth:`close`)."""
        if self.closed:
            raise BackendError("this model was closed (TTS.close, or its with block ended): load it again")

    def _planned(
        self,
        text: str | Plan,
        request: dict[str, Any],
        split: bool,
        frame_cap: int | None = None,
        first_chunk_frames: int | None = None,
    ) -> Plan:
        """``text`` when it is a plan (TypeError if anything else is given), else the plan of ``text`` with the
        keywords of :func:`.request.check_request` in ``request``, ``frame_cap`` and a stream's
        ``first_chunk_frames`` (through the API it may pass ``chunk_frames``), its language warning told as an
        UnsupportedLanguageWarning and a ``ref_audio`` clip's as ClipWarnings (the keyword API's way)."""
        self._open()
        if isinstance(text, Plan):
            return text.reused(self.checkpoint.fingerprint(), {**request, "frame_cap": frame_cap})
        unknown = [key for key in request if key not in REQUEST_KEYWORDS]
        if unknown:  # said as the caller's own, not check_request's
            raise TypeError(
                f"unexpected keyword argument {unknown[0]!r}: a request takes {', '.join(REQUEST_KEYWORDS)}"
            )
        checked = check_request(text, **request)
        if first_chunk_frames is not None:
            checked = dataclasses.replace(
                checked, first_chunk_frames=check_int(first_chunk_frames, "first_chunk_frames")
            )
        plan = self.plan(checked, split=split, frame_cap=frame_cap)
        if plan.warning:  # stacklevel: the line that called generate, stream, synthesize or generate_batch
            warnings.warn(plan.warning, UnsupportedLanguageWarning, stacklevel=3)
        if checked.ref_audio is not None:
            warn_clip(plan.voice, stacklevel=3)
        return plan
