"""The Core AI runtime side: :class:`CoreAIBackend` loads an asset folder (manifest.py) and runs its functions
with ``coreai.runtime`` (natively on Apple devices; on Linux in a slow CPU interpreter)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import sys
import threading
import weakref
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import numpy as np

from ...audio.samples import clip_samples
from ...checkpoint import Checkpoint
from ...config import ModelConfig, SamplingParams
from ...errors import AssetError, BackendError
from ...model.frame import PREFILL_WIDTH
from ..base import Backend, FrameResult, StepInputs
from .manifest import DUALAR_FUNCTIONS, checked_manifest, require_coreai


def _specialization() -> Any:
    """None on Linux (the CPU interpreter takes no options); the GPU on macOS."""
    import coreai.runtime as rt

    if sys.platform != "darwin" or not rt.SpecializationOptions.is_supported():
        return None
    return rt.SpecializationOptions.from_preferred_compute_unit_kind(rt.ComputeUnitKind.gpu())


def _said(p: SamplingParams) -> str:
    """Sampling settings in the words of the options that set them."""
    if not p.do_sample:
        return "greedy (argmax)"
    return f"temperature {p.temperature:g}, top-k {p.top_k}, top-p {p.top_p:g}"


def _sampling_refused(baked: SamplingParams, asked: SamplingParams) -> str:
    """Why assets whose frame graphs bake in ``baked`` cannot draw with ``asked``, and what to do."""
    if not baked.do_sample:
        return (
            "these Core AI assets were converted with --greedy (argmax draws, for audio8 parity); speech samples "
            "with the checkpoint's settings: convert without --greedy into a new folder"
        )
    return (
        f"these Core AI assets draw with the sampling baked into their frame graphs when converted "
        f"({_said(baked)}); {_said(asked)} was asked for: drop temperature, top_k and top_p "
        "(--temperature, --top-k, --top-p) to speak with theirs, or convert again with the sampling you want"
    )


class _RuntimeLoop:
    """An event loop on its own daemon thread, running coreai.runtime's coroutines for synchronous callers.

    coreai.runtime loads models and runs functions as coroutines. A loop driven from the caller's thread
    (``run_until_complete``) fails whenever that thread already runs a loop, as in an async web handler or a
    notebook: asyncio allows one running loop per thread ("Cannot run the event loop while another loop is
    running"). A loop on a thread of its own serves any caller; the caller blocks until the call is done.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="coreai-runtime", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop's thread and return its result (its exception is raised here). A
        KeyboardInterrupt (Ctrl-C) is raised once the call is done: a runtime call cannot be cut short, and a
        process that exits while one runs is aborted by the runtime (SIGABRT), its model half loaded."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            while not future.done():
                with contextlib.suppress(KeyboardInterrupt):
                    concurrent.futures.wait([future])
            raise

    def close(self, stack: contextlib.AsyncExitStack) -> None:
        """Exit ``stack`` (releasing the loaded models) on the loop, then stop the loop and its thread."""
        if self.loop.is_closed():
            return
        try:
            self.run(stack.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


class CoreAIBackend(Backend):
    """The DualAR and the codec as Core AI assets, behind :class:`..base.Backend` (batch 1).

    ``checkpoint`` is the one the assets were converted from (its fingerprint is checked; its config,
    tokenizer and codec sizes are used); ``assets`` is the folder :func:`~.convert.convert` wrote. ``cfg`` is the
    checkpoint's config with ``max_seq_len`` set to the assets' context. The calls are synchronous: each
    runtime call runs on this object's own event loop in a thread of its own (:class:`_RuntimeLoop`), so they
    work from any thread, inside a running event loop too (which they block for the call, as a torch call
    would: an async server should call them from a worker thread). Not thread-safe: one utterance at a time
    (the KV state is the backend's).

    The loaded models are held for the backend's life (a function whose model was collected returns
    garbage); :meth:`close` releases them. The KV state is allocated as explicit zeros (the Linux runtime
    does not zero new arrays) and re-allocated by :meth:`reset`. ``calls`` counts runtime calls: one per
    prefill window, one per frame, one per codec push of up to the decoder's ``push`` frames.

    Raises AssetError (missing, stale or foreign assets) or BackendError (Core AI packages missing).
    """

    name = "coreai"

    def __init__(self, checkpoint: Checkpoint, assets: str | Path):
        super().__init__()
        require_coreai()
        self.checkpoint = checkpoint
        self.folder = Path(assets).expanduser()
        if self.folder.exists() and not self.folder.is_dir():
            raise AssetError(
                f"{self.folder} is a file, not a Core AI asset folder: give assets (--assets) the folder audio8 "
                f"convert wrote (audio8 convert --model {checkpoint.path} --out NEW writes one)"
            )
        if not self.folder.is_dir():
            raise AssetError(
                f"no Core AI asset folder at {self.folder}; write one with: audio8 convert --model "
                f"{checkpoint.path} --out {self.folder}"
            )
        self.manifest = checked_manifest(self.folder, "dualar", checkpoint, None)
        self.precision: str = self.manifest["precision"]
        self.context: int = self.manifest["context"]
        self.sampling = SamplingParams(**self.manifest["sampling"])
        self.cfg: ModelConfig = dataclasses.replace(checkpoint.config, max_seq_len=self.context)
        self._state_specs = self.manifest["contract"]["prefill"]["states"]
        self._runtime = _RuntimeLoop()
        self._stack = contextlib.AsyncExitStack()
        self._finalizer = weakref.finalize(self, self._runtime.close, self._stack)
        self._models: dict[str, Any] = {}
        self._fns = {name: self._model("dualar").load_function(name) for name in DUALAR_FUNCTIONS}
        self._codec: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
        self.calls = 0
        self.closed = False
        self._state: dict[str, Any] = {}
        self._last: tuple[np.ndarray, np.ndarray] | None = None
        self.reset()

    @property
    def description(self) -> str:
        return f"coreai {self.precision} ({self.folder.name})"  # the folder's name: servers answer it

    def close(self) -> None:
        """Release the loaded models (the backend cannot be used afterwards: a call raises BackendError)."""
        self.closed = True
        self._models.clear()
        self._fns.clear()
        self._codec.clear()
        self._finalizer()

    def _model(self, part: str) -> Any:
        """The loaded model of ``part`` (loaded once, held until :meth:`close`)."""
        if part not in self._models:
            from coreai.authoring import AIModelAsset

            asset = AIModelAsset.load(self.folder / f"{part}.aimodel")
            self._models[part] = self._runtime.run(self._stack.enter_async_context(asset.executable(_specialization())))
        return self._models[part]

    def _open(self) -> None:
        """Raise BackendError once :meth:`close` has released the models (they were looked up as missing keys)."""
        if self.closed:
            raise BackendError(
                "these Core AI assets were closed (TTS.close, or its with block ended): load the model again"
            )

    def _call(
        self, fn: Any, inputs: dict[str, np.ndarray], state: dict[str, Any] | None = None
    ) -> dict[str, np.ndarray]:
        """One runtime call of ``fn`` (inputs as NumPy arrays, ``state`` mutated in place) -> outputs (copies); raises
        AssetError when the runtime refuses them (a program of another conversion under this manifest)."""
        import coreai.runtime as rt

        args = {k: rt.NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()}
        try:
            out = self._runtime.run(fn(inputs=args, state=state or {}))
        except RuntimeError as e:  # inputs built by the manifest's contract: the program is not the one it describes
            raise AssetError(
                f"{self.folder}: a program does not take what its manifest describes ({e}): the folder mixes files of "
                "two conversions (a copy or sync cut short?); convert the checkpoint again into a new folder"
            ) from None
        self.calls += 1
        # Copies: numpy() is a view of the runtime's buffer, which lives only as long as its NDArray.
        return {k: np.array(v.numpy()) for k, v in out.items()}

    def reset(self) -> None:
        """Fresh zero KV state (a new utterance)."""
        import coreai.runtime as rt

        self._state = {
            name: rt.NDArray(np.zeros(s["shape"], dtype=s["dtype"])) for name, s in self._state_specs.items()
        }
        self._last = None

    def prefill(self, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`TorchBackend.prefill`: windows of 32 columns from slot 0, one runtime call each.

        Raises BackendError when the prompt does not fit the assets' context.
        """
        self._open()
        n = prompt.shape[1]
        if n >= self.context:
            raise BackendError(
                f"the prompt is {n} tokens but these Core AI assets hold a context of {self.context} "
                "(prompt + frames); shorten the text, or convert with a larger --context (at most "
                f"{self.checkpoint.config.max_seq_len})"
            )
        self.reset()
        out: dict[str, np.ndarray] = {}
        real = 0
        for start in range(0, n, PREFILL_WIDTH):
            chunk = prompt[:, start : start + PREFILL_WIDTH]
            real = chunk.shape[1]
            window = np.zeros((prompt.shape[0], PREFILL_WIDTH), dtype=np.int32)
            window[0] = self.cfg.pad_token_id
            window[:, :real] = chunk
            out = self._call(
                self._fns["prefill"], {"codes": window[None], "pos": np.array([start], np.int32)}, self._state
            )
        self._last = (out["logits"][real - 1], out["hidden"][real - 1])
        return self._last[0].astype(np.float32), self._last[1].astype(np.float32)

    def codec_stream(self) -> CoreAICodecStream:
        """A fresh incremental codec for one utterance (:class:`CoreAICodecStream`): its own zero decoder state."""
        fns, manifest = self._codec_fns("codec_decoder")
        return CoreAICodecStream(self, fns, manifest)

    def _tail(self, params: SamplingParams, step: StepInputs) -> dict[str, np.ndarray]:
        if not self.draws_like(params):
            raise BackendError(_sampling_refused(self.sampling, params))
        noise_slow, window, noise_fast, forced = step.noise_slow, step.window, step.noise_fast, step.forced
        f = np.zeros(1 + self.cfg.num_codebooks, np.int32) if forced is None else np.asarray(forced, np.int32)
        return {
            "noise_slow": np.asarray(noise_slow, np.float32),
            "window": np.asarray(window, np.int32),
            "noise_fast": np.asarray(noise_fast, np.float32),
            "forced": f,
            "use_forced": np.array([0.0 if forced is None else 1.0], np.float32),
        }

    @staticmethod
    def _result(out: dict[str, np.ndarray]) -> FrameResult:
        return FrameResult(
            int(out["semantic"][0]),
            out["codes"].astype(np.int64),
            int(out["sampled_semantic"][0]),
            out["sampled_codes"].astype(np.int64),
            logits=out["logits"].astype(np.float32),
            hidden=out["hidden"].astype(np.float32),
            fast_logits=out["fast_logits"].astype(np.float32),
        )

    def frame(self, params: SamplingParams, step: StepInputs) -> FrameResult:
        """Frame 0 from the prefill's last logits and hidden (``step.column`` None: ``first_frame``), or the slow
        step on the previous column at slot ``step.pos`` and the next frame (``frame``); one runtime call.

        Raises BackendError before a prefill, for a slot outside the context, or for sampling settings other than
        the baked ones.
        """
        self._open()
        tail = self._tail(params, step)
        if step.column is None:
            if self._last is None:
                raise BackendError("frame 0 needs a prefill first")
            logits, hidden = self._last
            return self._result(self._call(self._fns["first_frame"], {"logits": logits, "hidden": hidden, **tail}))
        if not 0 <= step.pos < self.context:
            raise BackendError(f"slot {step.pos} is outside the assets' context of {self.context}")
        codes = np.asarray(step.column, np.int32).reshape(1, -1, 1)
        inputs = {"codes": codes, "pos": np.array([step.pos], np.int32), **tail}
        return self._result(self._call(self._fns["frame"], inputs, self._state))

    def _codec_fns(self, part: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The loaded functions of a codec part (name -> function, every one its contract names) and its manifest."""
        self._open()
        if part not in self._codec:
            manifest = checked_manifest(self.folder, part, self.checkpoint, self.precision)
            fns = {name: self._model(part).load_function(name) for name in manifest["contract"]}
            self._codec[part] = (fns, manifest)
        return self._codec[part]

    def ready(self) -> None:
        """The codec decoder loaded and checked now (manifest, program hash, checkpoint, precision), and the encoder
        too where the folder holds one (a folder without it speaks, in stored voices only); raises AssetError."""
        self._codec_fns("codec_decoder")
        if (self.folder / "codec_encoder.aimodel").exists():
            self._codec_fns("codec_encoder")

    def decode_window(self, codes: np.ndarray) -> np.ndarray:
        """Codes int [C, T] -> float32 audio [T * frame_length] at 44.1 kHz: the whole utterance pushed through a
        fresh :meth:`codec_stream` (one runtime call per push of up to the decoder's ``push`` frames; exact)."""
        return self.codec_stream().push(codes)

    def encode(self, audio: np.ndarray) -> np.ndarray:
        """Mono 44.1 kHz float32 audio [N] -> codes int64 [C, ceil(N / frame_length)] (one call).

        The clip is right-padded with zeros to the encoder's bucket (the encoder is causal). Raises AudioError
        (:func:`...audio.samples.clip_samples`: not mono float samples, none), BackendError for a clip longer than
        the bucket (``audio8 convert --encoder-frames``, ``DEFAULTS.coreai.encoder_frames`` by default).
        """
        fns, manifest = self._codec_fns("codec_encoder")
        bucket = manifest["frames"]
        hop, rate = self.checkpoint.codec_config.frame_length, self.checkpoint.codec_config.sample_rate
        audio = clip_samples(audio)
        frames = -(-len(audio) // hop)
        if frames > bucket:
            raise BackendError(
                f"the Core AI codec encoder of these assets takes clips of up to {bucket * hop / rate:.1f} s "
                f"({bucket} frames); this one is {len(audio) / rate:.1f} s: cut it, convert the assets with "
                f"--encoder-frames {frames} or more, or use the torch backend"
            )
        padded = np.zeros((1, 1, bucket * hop), dtype=np.float32)
        padded[0, 0, : len(audio)] = audio
        return self._call(fns["main"], {"audio": padded})["codes"][0, :, :frames].astype(np.int64)


class CoreAICodecStream:
    """One utterance's codec on the stateful decoder asset (manifest.py's codec decoder contract), behind
    :class:`..base.CodecStream`: ``push(codes int [C, n])`` -> float32 audio [n * frame_length], the samples the
    whole-utterance decode gives for those frames (the torch incremental decoder's, to float rounding).

    Every frame is decoded once: a push of up to the asset's ``push`` frames (P) is one runtime call, a longer
    one several. A call runs the asset's shortest function that holds its frames (``main``, P frames, or
    ``first``, 1 frame: a stream's first chunk), padded inside that fixed shape when it holds fewer (the codec
    is causal and the graph keeps only the real frames' state) and its audio trimmed. The decoder state is this
    stream's own, zeros at the start, shared by the functions. ``frames`` counts the utterance's frames pushed,
    ``decoded`` the frames its calls computed (padding included). Raises BackendError past the asset's
    ``max_frames`` frames in one utterance.
    """

    def __init__(self, backend: CoreAIBackend, fns: dict[str, Any], manifest: dict[str, Any]):
        import coreai.runtime as rt

        self._backend = backend
        # (frames per call, function), shortest first
        self._fns = sorted((manifest["pushes"][name], fn) for name, fn in fns.items())
        self.push_frames: int = manifest["push"]
        self.max_frames: int = manifest["max_frames"]
        self.frames = self.decoded = 0
        specs = manifest["contract"]["main"]["states"]
        self._state = {name: rt.NDArray(np.zeros(s["shape"], dtype=s["dtype"])) for name, s in specs.items()}
        self._hop = backend.checkpoint.codec_config.frame_length

    def push(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.int32)
        channels, n = codes.shape
        if self.frames + n > self.max_frames:
            raise BackendError(
                f"the Core AI codec decoder decodes up to {self.max_frames} frames per utterance (the model's "
                f"max_seq_len); this one reaches {self.frames + n}: decode fewer frames, or use the torch backend"
            )
        pieces = [np.zeros(0, np.float32)]
        for first in range(0, n, self.push_frames):
            count = min(self.push_frames, n - first)
            size, fn = next((size, fn) for size, fn in self._fns if size >= count)
            padded = np.zeros((1, channels, size), np.int32)
            padded[0, :, :count] = codes[:, first : first + count]
            inputs = {"codes": padded, "start": np.array([self.frames], np.int32), "count": np.array([count], np.int32)}
            wav = self._backend._call(fn, inputs, self._state)["wav"][0]
            pieces.append(wav[: count * self._hop].astype(np.float32))
            self.frames += count
            self.decoded += size
        return np.concatenate(pieces)
