"""The torch backend: the one frame (:mod:`...model.frame`) and the codec in PyTorch, CPU or CUDA.

It implements :class:`..base.Backend`; tensors stay on the device between the calls of one frame.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from ...audio.samples import clip_samples
from ...checkpoint import MODEL_FILE, Checkpoint, require_finite
from ...config import ModelConfig, SamplingParams
from ...errors import BackendError, ConfigError, QuantError
from ...model.codec import CodecDecoder, CodecEncoder
from ...model.dualar import DualAR
from ...model.frame import PREFILL_WIDTH, Frame, packed
from ...packages import require
from ...precision import default_precision, resolve_precision, runtime_of
from ...settings import DEFAULTS
from ..base import Backend, BatchFrames, FrameResult, FrameRows, StepInputs
from .codec_streams import FiniteStream, TorchCodecStream
from .codec_worker import CodecWorker, build_decoder, default_codec_process
from .cudagraphs import GraphedFrame
from .cudnn import convolutions
from .heads import PromptHeads
from .host_edge import draw_ahead, frame_inputs, frame_results, prefilled
from .memory import back_with_huge_pages_soon, device_memory_bytes, release_freed_memory
from .quantize import apply_precision
from .threads import CallThreads, running_on

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


def resolve_device(device: str) -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; raises BackendError."""
    if not isinstance(device, (str, torch.device)):
        raise BackendError(f"device must be a name (auto, cpu, cuda or cuda:N), got {device!r}")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise BackendError(f"unknown device {device!r}: use auto, cpu, cuda or cuda:N") from e
    if dev.type not in ("cpu", "cuda"):
        raise BackendError(f"unsupported device {device!r}: use auto, cpu, cuda or cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(
            f"device {device!r} requested but this PyTorch build sees no CUDA GPU; use --device cpu (device='cpu')"
        )
    return dev


def resolve_codec_dtype(name: str, device: torch.device) -> tuple[torch.dtype, bool]:
    """A codec form: ``fp32`` or ``bf16`` (aliases float32, bfloat16), or ``tf32`` on CUDA (fp32 with cuDNN's TF32
    convolutions in the decoder, :mod:`.cudnn`); the dtype and whether TF32. Raises ConfigError for another name,
    BackendError for tf32 off CUDA."""
    if name != "tf32":
        if not isinstance(name, str) or name not in DTYPES:
            raise ConfigError(f"unknown codec dtype {name!r}: use fp32, bf16 or tf32 (CUDA)", "codec_dtype")
        return DTYPES[name], False
    if device.type != "cuda":
        raise BackendError(
            f"the tf32 codec is cuDNN's TF32 convolutions, a CUDA form, not for {device}: use fp32 or bf16 "
            "(AUDIO8_TORCH__CODEC_DTYPE)"
        )
    return torch.float32, True


class TorchBackend(Backend):
    """The DualAR and the codec in PyTorch on one device, one utterance at a time (batch 1).

    The KV state [n_layer, 1, n_kv, max_seq_len, head_dim] is allocated once and reused; ``reset``
    zeroes it between utterances so nothing leaks from one to the next. The codec runs in fp32 on CPU
    (as the publisher's load_codec) and in the model dtype on CUDA; the encoder always runs in fp32
    (bf16 flips the VQ's nearest-neighbour choices: 79 % of codes on the tiny oracle).

    fp32 on CUDA turns TF32 products off for the process (``torch.backends.cuda.matmul.allow_tf32``), as fp32
    parity with the publisher's CPU run needs; the codec's convolutions take their form's switch per call
    (:mod:`.cudnn`: fp32 unless the ``tf32`` codec).

    ``frame_mode``: ``eager`` or ``graph`` (:func:`..choice.open_backend` picks ``graph`` on CUDA by default): each
    frame after the first runs the frame's static ``graph`` mode (:mod:`..cudagraphs`), captured and replayed as
    one CUDA graph on a CUDA device (instead of launching its kernels one by one), run as it is elsewhere (which
    proves the form on the CPU); batched rows over this backend (:mod:`.rows`) follow it.
    ``prefix_length``: where a prompt's head ends (:meth:`.prompt.PromptBuilder.prefix_length`), to keep the KV
    state of heads (see :meth:`prefill`); None keeps none.

    ``fused_kernels`` (CUDA only; None, ``DEFAULTS.torch.fused_kernels``: on where the device is CUDA): the
    blocks' small op chains as Triton kernels (:mod:`.fused`: one launch per norm after an add, per RoPE and KV
    write, per SwiGLU).

    ``codec_process`` (CPU only): the codec decoder runs in a child process of its own (:mod:`.codec_worker`), on
    another core beside the frames, and this process holds no copy of its weights; None
    (``DEFAULTS.torch.codec_process``): on when the device is the CPU and the process may use 2+ CPUs. Off, the
    decoder is built here on first use.
    ``codec_worker`` is the child's handle (None when off); :meth:`close` ends the child (a finalizer does when the
    backend is dropped).

    ``threads`` (:class:`.threads.CallThreads`): prefills and this process's codec run on torch's thread count where
    the backend was loaded (``torch.set_num_threads``, ``OMP_NUM_THREADS``); with the codec process on, it takes
    ``DEFAULTS.torch.codec_threads`` of them (None: half) and frames the rest; set on whichever OS thread makes the
    call.
    """

    name = "torch"
    overlaps_codec = True
    batches = True

    def __init__(
        self,
        checkpoint: Checkpoint,
        device: str = "cpu",
        precision: str | None = None,
        codec_dtype: str | None = None,
        frame_mode: str = "eager",
        prefix_length: Callable[[np.ndarray], int] | None = None,
        codec_process: bool | None = DEFAULTS.torch.codec_process,
        fused_kernels: bool | None = DEFAULTS.torch.fused_kernels,
    ):
        self.device = resolve_device(device)
        if fused_kernels and self.device.type != "cuda":
            raise BackendError(
                f"fused kernels are CUDA kernels (Triton), not for {self.device}: drop fused_kernels=True "
                "(AUDIO8_TORCH__FUSED_KERNELS=true)"
            )
        self.noise_ahead = self.device.type == "cuda"  # a GPU's frames leave the host idle
        if frame_mode not in ("eager", "graph"):
            raise BackendError(f"unknown frame mode {frame_mode!r}: eager or graph")
        if codec_process and self.device.type != "cpu":
            raise BackendError(f"the codec process runs the CPU codec: drop codec_process on {self.device}")
        super().__init__()
        # ``precision``: a name of precision.PRECISIONS that the torch backend runs; None: the default for the
        # device and the checkpoint's stored dtype.
        # checked before any weight is read: PrecisionError names the precisions this device runs
        runtime = runtime_of("torch", self.device.type)
        if precision is None:
            precision = default_precision(self.device.type, checkpoint.stored_dtype)
        self.spec = resolve_precision(precision, runtime)
        self.precision = self.spec.name
        self.dtype = self.spec.dtype
        if self.device.type == "cuda" and self.dtype == torch.float32:
            # TF32 products: 10-bit mantissas. fp32 means fp32. (cuDNN's TF32 convolutions, PyTorch's CUDA default,
            # moved the codec's waveform off the fp32 oracle by ~4e-4 and changed encoder codes: each codec call
            # sets that switch itself, .cudnn.)
            torch.backends.cuda.matmul.allow_tf32 = False
        self.cfg: ModelConfig = checkpoint.config
        self.checkpoint = checkpoint
        self.codec_dtype, self.codec_tf32 = (torch.float32 if self.device.type == "cpu" else self.dtype), False
        if codec_dtype is not None:  # opt-in, not exact: bf16 (CPU about 1.5x faster), tf32 (CUDA, about 2x)
            self.codec_dtype, self.codec_tf32 = resolve_codec_dtype(codec_dtype, self.device)
        self.codec_process = default_codec_process(self.device) if codec_process is None else bool(codec_process)
        self.threads = CallThreads.for_backend(
            torch.get_num_threads(), self.codec_process, DEFAULTS.torch.codec_threads
        )
        # Started first, so the child builds its decoder while the model loads here. Sized for the longest utterance
        # the context allows, as the in-process decoder.
        self.codec_worker = (
            CodecWorker(checkpoint, self.cfg.max_seq_len, self.codec_dtype, self.threads.codec)
            if self.codec_process
            else None
        )
        state = checkpoint.model_state_dict()
        # A quantized precision builds in the stored dtype (bf16 in the release: quantizing from it is exact and no
        # fp32 copy of the weights is ever held); apply_precision brings the rest to the precision's dtype.
        build = state["embeddings.weight"].dtype if self.spec.quantized else self.dtype
        self.model = DualAR.from_state_dict(self.cfg, state, build, self.device)
        del state
        if self.spec.quantized:
            try:
                apply_precision(self.model, self.spec)
            except QuantError as e:
                raise BackendError(str(e)) from None
        self.fused = self.device.type == "cuda" if fused_kernels is None else fused_kernels
        if self.fused:
            require("triton", BackendError)
            from .fused import install_fused

            install_fused(self.model)
        self.frame_maths = Frame(self.model)  # the one frame, eager mode
        # Kept for the encoder (built on first use) when it maps the file: nothing is resident until read, and
        # voices are encoded by the codec loaded here even when a new file is moved into place later. A legacy
        # pickle is read whole (1.6 GB for the release), so the encoder re-reads that one.
        self._codec_state = checkpoint.codec_state_dict(mapped=True) if checkpoint.codec_mapped else None
        self._decoder: CodecDecoder | None = None
        if self.codec_worker is None:
            self.decoder  # noqa: B018 - built now, as loading is when a damaged codec file should fail
        self._encoder: CodecEncoder | None = None
        self._encoder_frames = 0
        self.k_cache, self.v_cache = self.model.new_kv_cache()  # never reallocated: a CUDA graph writes these
        self._graphed = None
        self.frame_mode = frame_mode
        if frame_mode == "graph":
            self._graphed = GraphedFrame(self.model, self.k_cache, self.v_cache, capture=self.device.type == "cuda")
        self.prefix_length = prefix_length
        self.heads = PromptHeads(DEFAULTS.torch.prefix_cache)  # the prompt heads whose KV state is kept
        if self.device.type == "cpu" and checkpoint.model_file.stat().st_size >= DEFAULTS.torch.huge_pages_min_bytes:
            back_with_huge_pages_soon()  # the weights the frames stream, in 2 MiB pages
        if self.codec_worker is not None:
            self.codec_worker.wait_ready()

    @property
    def decoder(self) -> CodecDecoder:
        """The codec decoder in this process, on this backend's device (built on first use: with the codec process
        on, only tools that inspect its stages use it). Sized for the longest utterance the context allows, so
        whole-utterance decodes never need windows."""
        if self._decoder is None:
            self._decoder = build_decoder(self.checkpoint, self.cfg.max_seq_len, self.codec_dtype).to(self.device)
            release_freed_memory()  # a legacy pickle is read whole, then dropped
        return self._decoder

    def batch_frames(self, max_batch: int) -> BatchFrames:
        from .rows import TorchBatchFrames  # rows builds on this module

        return TorchBatchFrames(self, max_batch)

    def frame_rows(self, max_batch: int, warm: Sequence[SamplingParams] = ()) -> FrameRows:
        from .rows import FrameServer

        return FrameServer(self, max_batch, warm=warm)

    def memory_bytes(self) -> int | None:
        return device_memory_bytes(self.device)

    @torch.inference_mode()
    def codec_stages(self, codes: np.ndarray) -> dict[str, np.ndarray]:
        with convolutions(self.codec_tf32):
            stages = self.decoder.intermediates(torch.as_tensor(codes, device=self.device))
        return {name: value.float().cpu().numpy() for name, value in stages.items()}

    @torch.inference_mode()
    def encoder_latent(self, audio: np.ndarray) -> np.ndarray:
        frames = len(audio) // self.checkpoint.codec_config.frame_length
        with convolutions(False):  # the encoder in fp32 whatever the decoder's form
            latent = self.codec_encoder(frames).latent(torch.as_tensor(audio, device=self.device)[None, None])
        return latent.float().cpu().numpy()

    @property
    def codec_process_pid(self) -> int | None:
        return None if self.codec_worker is None else self.codec_worker.pid

    def close(self) -> None:
        """End the codec process, if any (see :class:`.codec_worker.CodecWorker`); the model's other calls still
        work, its codec calls then raise BackendError. Idempotent."""
        if self.codec_worker is not None:
            self.codec_worker.close()

    @property
    def description(self) -> str:
        graphs = "" if self._graphed is None else " cuda-graphs" if self._graphed.capture else " graph-frame"
        tf32 = " codec-tf32" if self.codec_tf32 else ""
        return f"torch {self.device} {self.precision}{graphs}{' fused' if self.fused else ''}{tf32}"  # precision's name

    @property
    def device_name(self) -> str:
        return str(self.device)

    def reset(self) -> None:
        """Zero the KV state (a new utterance)."""
        self.k_cache.zero_()
        self.v_cache.zero_()

    @torch.inference_mode()
    def prefill(
        self, prompt: np.ndarray, k_cache: torch.Tensor | None = None, v_cache: torch.Tensor | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run the prompt int [1+C, P] in windows of 32 columns from slot 0.

        Returns the last column's compact logits [V+1] and post-norm hidden [dim] (float32), the
        inputs of frame 0. The last window is as wide as what is left of the prompt: eager
        PyTorch needs no static shape, and padding a 49-column prompt to 64 cost a quarter more work.
        Writes this backend's KV state (zeroed first), or ``k_cache``/``v_cache`` [n_layer, 1, n_kv, L, D] when
        given (a row of a batch, see rows.py: slots past the prompt are left as they are, never attended).

        With :attr:`prefix_length` set, the prompt's head (its first ``prefix_length(prompt)`` columns: the
        system turn and a voice's reference) runs as windows of its own, and its KV state is kept for the
        next prompt with the same head (the last DEFAULTS.torch.prefix_cache heads), which then runs only the rest. A
        head's state is the same whether computed or kept, so a seed gives the same audio either way; against one
        sweep over the whole prompt the windows differ, so logits differ by float rounding.
        """
        if k_cache is None:
            self.reset()
            k_cache, v_cache = self.k_cache, self.v_cache
        n = prompt.shape[1]
        start = self.prefix_length(prompt) if self.prefix_length is not None else 0
        if not 0 < start < n:  # no head, or nothing after it
            return self._windows(prompt, 0, k_cache, v_cache)
        key = np.ascontiguousarray(prompt[:, :start], dtype=np.int64).tobytes()
        kept = self.heads.take(key)
        if kept is None:
            self._windows(prompt[:, :start], 0, k_cache, v_cache)
            self.heads.keep(key, k_cache[:, :, :, :start].clone(), v_cache[:, :, :, :start].clone())
        else:
            k_cache[:, :, :, :start] = kept[0]
            v_cache[:, :, :, :start] = kept[1]
        return self._windows(prompt, start, k_cache, v_cache)

    def _windows(
        self, prompt: np.ndarray, first: int, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        """Prefill windows over ``prompt`` columns ``first..`` (slots alike); the last column's logits, hidden."""
        n = prompt.shape[1]
        logits = hidden = None
        with running_on(self.threads.total):
            for start in range(first, n, PREFILL_WIDTH):
                window = np.ascontiguousarray(prompt[:, start : start + PREFILL_WIDTH], dtype=np.int64)
                codes = torch.from_numpy(window)[None].to(self.device)
                lg, hd = self.frame_maths.prefill(codes, start, k_cache, v_cache)
                logits, hidden = lg[0, -1], hd[0, -1]
        self._last = (logits, hidden)
        return require_finite(logits.float().cpu().numpy(), "model", MODEL_FILE), hidden.float().cpu().numpy()

    @torch.inference_mode()
    def frame(self, params: SamplingParams, step: StepInputs) -> FrameResult:
        """One frame (:meth:`...model.frame.Frame.forward`, or its graph): the slow step on the previous column at
        slot ``step.pos`` then the draws; frame 0 (``step.column`` None) drawn from the prefill's last logits and
        hidden."""
        kept = self._last if step.column is None else None
        with running_on(self.threads.frame):
            if self._graphed is not None:
                out, ids = self._graphed.step(params, step, kept)
            else:
                first = prefilled([kept])
                out = self.frame_maths(
                    params, frame_inputs(self.cfg, [step], self.device), self.k_cache, self.v_cache, first
                )
                ids = packed(out)
        draw_ahead([step])  # the frame launched (on a GPU: running), its results not yet read
        return frame_results(out, ids, [0], [step.logits])[0]

    @torch.inference_mode()
    def decode_window(self, codes: np.ndarray) -> np.ndarray:
        """Codec decode of codes int [C, T] -> float32 audio [T * frame_length] at 44.1 kHz.

        The publisher's whole-utterance decode, run as the exact incremental decoder
        (:class:`.model.codec.StreamingDecoder`) in pushes of ``DEFAULTS.torch.decode_chunk_frames``: equal to one whole
        run up to float rounding (about 6e-6 on the 0.6b codec), faster and smaller (settings.py says why).
        """
        return self.decode_batch([np.asarray(codes)])[0]

    @torch.inference_mode()
    def decode_batch(self, codes: list[np.ndarray]) -> list[np.ndarray]:
        """:meth:`decode_window` of several utterances (codes int [C, T_i] each) in one batched codec call.

        Shorter ones are padded at the end with code 0; the codec is causal, so padding never reaches the
        samples kept (each result equals its own decode_window to float rounding). Returns float32 [T_i * 2048]
        each; an utterance of 0 frames gives 0 samples. Runs in the codec process when it is on.
        """
        hop = self.checkpoint.codec_config.frame_length
        longest = max((c.shape[1] for c in codes), default=0)
        if longest == 0:
            return [np.zeros(0, dtype=np.float32) for _ in codes]
        batch = np.zeros((len(codes), self.cfg.num_codebooks, longest), dtype=np.int64)
        for i, c in enumerate(codes):
            batch[i, :, : c.shape[1]] = c
        push = self.codec_stream().push_rows
        starts = range(0, longest, DEFAULTS.torch.decode_chunk_frames)
        wav = np.concatenate(
            [push(batch[..., start : start + DEFAULTS.torch.decode_chunk_frames]) for start in starts], axis=-1
        )
        return [wav[i, : c.shape[1] * hop] for i, c in enumerate(codes)]

    def codec_stream(self) -> TorchCodecStream | FiniteStream:
        """A fresh exact incremental decoder for one utterance: a stream on the codec process when it is on
        (:class:`.codec_worker.WorkerStream`), else :class:`TorchCodecStream`; both check the audio is finite."""
        if self.codec_worker is not None:
            return FiniteStream(self.codec_worker.stream())
        return TorchCodecStream(self.decoder, self.threads.total, self.codec_tf32)

    def codec_encoder(self, frames: int) -> CodecEncoder:
        """The fp32 codec encoder on this device, built on first use and rebuilt when a clip needs more
        than the ``frames`` (code frames of 2048 samples) it was sized for."""
        if self._encoder is None or self._encoder_frames < frames:
            self._encoder = CodecEncoder.from_state_dict(
                self.checkpoint.codec_config,
                self._codec_state or self.checkpoint.codec_state_dict(),
                max_frames=max(frames, 1),
            ).to(self.device)
            self._encoder_frames = max(frames, 1)
        return self._encoder

    @torch.inference_mode()
    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Codec encode of mono 44.1 kHz float32 audio [N] -> codes int64 [C, ceil(N / frame_length)]. Raises
        AudioError (:func:`...audio.samples.clip_samples`: not mono float samples, none)."""
        audio = clip_samples(audio)
        frames = -(-len(audio) // self.checkpoint.codec_config.frame_length)
        x = torch.as_tensor(audio, device=self.device)
        with running_on(self.threads.total), convolutions(False):  # fp32 whatever the decoder's form
            codes, _ = self.codec_encoder(frames).encode(x)
        return codes.cpu().numpy()[0]
