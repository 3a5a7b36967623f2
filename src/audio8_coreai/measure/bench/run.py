"""Configurations loaded in one process and timed side by side, round by round; the codec; peak RSS."""

from __future__ import annotations

import resource
import statistics
import time

import numpy as np

from ...errors import ConfigError
from ...settings import DEFAULTS, BenchSettings
from .baseline import BaselineFrame
from .config import PUBLISHER, PUBLISHER_SIZE, SENTENCE, STREAM_CHUNK, STREAM_WINDOW, label, median_ms
from .parts import frame_ops, frame_parts, read_bandwidth_gbps, weight_floor


def _load(cfg: BenchSettings):
    import torch

    from ...tts import TTS

    if cfg.backend != "torch":
        raise ValueError(f"the bench drives the torch backend; got {cfg.backend!r}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)  # before loading: ONNX Runtime sessions take the count then
    return TTS.load(
        cfg.checkpoint,
        device=cfg.device,
        precision="fp32" if cfg.baseline else cfg.precision,
        codec_dtype=cfg.codec_dtype,
        cuda_graphs=cfg.cuda_graphs,
        codec_process=False,  # the codec timed here, at the configuration's threads (its own process runs one)
    )


def _random_codes(cc, n: int, rng) -> np.ndarray:
    return np.concatenate(
        [
            rng.integers(0, cc.semantic_codebook_size, (1, n)),
            rng.integers(0, cc.residual_codebook_size, (cc.residual_codebooks, n)),
        ]
    )


class _Run:
    """One loaded configuration and its samples; :meth:`round` takes one sample of everything."""

    def __init__(self, cfg: BenchSettings):
        import torch

        t0 = time.perf_counter()
        self.cfg, self.tts = cfg, _load(cfg)
        self.load_s = time.perf_counter() - t0
        self.threads = torch.get_num_threads()
        self.backend = self.tts.backend
        self.mc = self.tts.config
        self.params = self.tts.sampling()
        self.prompt = self.tts.prompts.plain(SENTENCE)
        room = self.mc.max_seq_len - self.prompt.shape[1]
        if cfg.frames > room:
            raise ConfigError(
                f"--frames {cfg.frames} does not fit: the bench's prompt ({self.prompt.shape[1]} columns) and its "
                f"frames must fit the checkpoint's context ({self.mc.max_seq_len}): give --frames {room} or fewer",
                "frames",
            )
        self.baseline = BaselineFrame(self.backend, self.params) if cfg.baseline else None
        self.samples: dict[str, list[float]] = {}
        self._parts = self._floor = None
        self.ops: dict[str, int] = {}  # operator calls of a frame and its parts (parts.frame_ops), counted once
        self.read_gbps: float | None = None  # the CPU's read bandwidth at this run's threads (measure_group)

    def _add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def _frame_loop(self) -> tuple[float, float]:
        """(wall ms, CPU ms) per frame of one run of up to ``frames`` frames after a prefill: the product's frame
        loop (:func:`...engine.loop.frame_steps`, which stops at eos), or the baseline's frames."""
        from ...engine.loop import Utterance, frame_steps
        from ...engine.noise import noise_source

        b, mc, p_len = self.backend, self.mc, self.prompt.shape[1]
        b.prefill(self.prompt)
        noise = noise_source(mc, 0)
        t0, c0 = time.perf_counter(), time.process_time()
        if self.baseline is not None:
            n = self._baseline_frames(noise)
        else:
            n = sum(1 for _ in frame_steps(b, Utterance(b.cfg, p_len, self.cfg.frames, noise), self.params))
        return (time.perf_counter() - t0) * 1e3 / n, (time.process_time() - c0) * 1e3 / n

    def _baseline_frames(self, noise) -> int:
        """``frames`` frames of the publisher-style baseline (it makes frame 0 from a slow step too: one more step
        per run), eos not special: the baseline's cost per frame, not an utterance."""
        from ...sampling import RasWindow

        mc, p_len = self.mc, self.prompt.shape[1]
        window = RasWindow(mc.ras_window_size)
        column = np.zeros(mc.num_codebooks + 1, dtype=np.int64)
        column[0] = mc.semantic_begin_id
        for step in range(self.cfg.frames):
            noise_slow, noise_fast = noise.next_frame()
            sem, codes = self.baseline(column, p_len + step - 1, noise_slow, window.current(), noise_fast)
            window.push(sem)
            column = np.concatenate([[sem], codes])
        return self.cfg.frames

    def round(self) -> None:
        """One sample of every figure (the caller drops the first round: the warm-up)."""
        import torch

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        # Every column computed (ms per token), then with the prompt's head kept, as requests in one voice run
        # it after the first (TTFA).
        head = self.backend.prefix_length
        self.backend.prefix_length = None
        self._add("prefill_ms", median_ms(lambda: self.backend.prefill(self.prompt), 1)[0])
        self.backend.prefix_length = head
        if head is not None:
            self.backend.prefill(self.prompt)  # the head is kept from here on
            self._add("prefill_head_kept_ms", median_ms(lambda: self.backend.prefill(self.prompt), 1)[0])
        wall, cpu = self._frame_loop()
        self._add("ms_per_frame", wall)
        self._add("cpu_ms_per_frame", cpu)
        if self.baseline is not None:
            return
        if self._parts is None:
            pos = self.prompt.shape[1] + self.cfg.frames // 2
            self._parts = frame_parts(self.backend, self.params, pos)
            self.ops = frame_ops(self.backend, self.params, pos)
        for name, fn in self._parts.items():
            self._add(f"{name}_ms", median_ms(fn, 1, inner=3)[0])
        floor = weight_floor(self.backend, 1)
        self._floor = floor
        for key in ("floor_ms", "floor_slow_ms", "floor_fast_ms"):
            self._add(key, floor[key])

    def result(self) -> dict:
        out: dict = {
            "label": label(self.cfg),
            **self.cfg.model_dump(),
            "threads_used": self.threads,
            "load_s": self.load_s,
            "prompt_columns": int(self.prompt.shape[1]),
            "description": self.backend.description,
        }
        for key, vals in self.samples.items():
            vals = vals[1:] if len(vals) > 1 else vals  # the first round is the warm-up
            out[key] = statistics.median(vals)
            if key == "ms_per_frame":
                out["frame_runs_ms"] = vals
        out["prefill_ms_per_token"] = out["prefill_ms"] / out["prompt_columns"]
        out.update(self.ops)
        if self._floor is not None:
            out["fast_passes"] = self._floor["fast_passes"]
            out["weights_per_frame_m"] = self._floor["weights_per_frame_m"]
            out["other_ms"] = out["ms_per_frame"] - sum(out[f"{k}_ms"] for k in self._parts)
            out["frame_floor_ratio"] = out["ms_per_frame"] / out["floor_ms"]
            out["weight_gb_per_frame"] = self._floor["weight_gb_per_frame"]
            if self.read_gbps:  # the physical floor: the frame's weight bytes at the bandwidth one reads
                out["read_gbps"] = self.read_gbps
                out["physical_floor_ms"] = 1e3 * out["weight_gb_per_frame"] / self.read_gbps
                out["frame_physical_ratio"] = out["ms_per_frame"] / out["physical_floor_ms"]
        if (self.mc.dim, self.mc.n_layer, self.mc.n_fast_layer) == PUBLISHER_SIZE:  # another size: no comparison
            out["vs_publisher"] = PUBLISHER["ms_per_frame"] / out["ms_per_frame"]
        if out.get("other_ms", 0.0) < 0:  # parts timed longer than the whole frame: another process held the core
            out["noisy"] = True
        return out


def measure_codec(backend, runs: int) -> dict:
    """The codec, median of ``runs`` after a warm-up: ``decode_window`` of a [10, 160] window (the whole-utterance
    cost per frame) and pushes into a fresh ``codec_stream``: the first, of ``DEFAULTS.speech.first_chunk_frames``
    frames as :class:`...engine.stream.SpeechStream` sends first (``codec_first_chunk_ms``), and the steady state
    (``codec_ms_per_chunk``: the 2nd and 3rd pushes of 32 frames)."""
    cc = backend.checkpoint.codec_config
    rng = np.random.default_rng(0)
    window = _random_codes(cc, STREAM_WINDOW, rng)
    out = {
        "codec_ms_per_window": median_ms(lambda: backend.decode_window(window), runs)[0],
        "codec_window_frames": STREAM_WINDOW,
        "frame_audio_ms": cc.frame_length / cc.sample_rate * 1e3,
    }
    first, steady, head = [], [], DEFAULTS.speech.first_chunk_frames
    for _ in range(runs + 1):
        stream = backend.codec_stream()
        t0 = time.perf_counter()
        stream.push(window[:, :head])
        first.append((time.perf_counter() - t0) * 1e3)
        for i in (1, 2):
            t0 = time.perf_counter()
            stream.push(window[:, head + (i - 1) * STREAM_CHUNK : head + i * STREAM_CHUNK])
            steady.append((time.perf_counter() - t0) * 1e3)
    out.update(
        codec_first_chunk_ms=statistics.median(first[1:]),
        codec_ms_per_chunk=statistics.median(steady[2:]),
        codec_streaming="incremental",
    )
    return out


def with_totals(row: dict, codec: dict) -> dict:
    """``row`` plus the codec figures and what follows from them: RTF (whole, streaming) and TTFA."""
    row = {**row, **codec}
    frame_audio_ms = codec["frame_audio_ms"]
    per_frame = codec["codec_ms_per_window"] / codec["codec_window_frames"]
    n, f = row["frames"], row["ms_per_frame"]
    row["codec_ms_per_frame"] = per_frame
    row["rtf"] = (row["prefill_ms"] + n * (f + per_frame)) / (n * frame_audio_ms)
    row["rtf_streaming"] = (STREAM_CHUNK * f + codec["codec_ms_per_chunk"]) / (STREAM_CHUNK * frame_audio_ms)
    prefill = row.get("prefill_head_kept_ms", row["prefill_ms"])
    row["ttfa_ms"] = prefill + DEFAULTS.speech.first_chunk_frames * f + codec["codec_first_chunk_ms"]
    return row


def measure_group(configs: list[BenchSettings]) -> list[dict]:
    """Several configurations in this process, side by side: all loaded, then ``runs + 1`` rounds in which each
    takes one sample of every figure in turn (the first round is the warm-up), so a change of machine load
    hits every configuration alike and their ratios hold. The codec (the same fp32 module whatever the
    precision on CPU) is measured once, after the rounds, on the first configuration's backend."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    runs = [_Run(c) for c in configs]
    for _ in range(max(c.runs for c in configs) + 1):
        for r in runs:
            r.round()
    codecs: dict = {}
    for r in runs:  # the codec is the same module whatever the precision: once per codec dtype and threads
        key = (r.cfg.codec_dtype, r.cfg.threads)
        if key not in codecs:
            if r.cfg.threads:
                import torch

                torch.set_num_threads(r.cfg.threads)
            codecs[key] = measure_codec(r.backend, r.cfg.runs)
    cpu_use = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    bandwidth = {  # the read bandwidth beside the frames: on the CPU, per thread count
        t: read_bandwidth_gbps(t) for t in {r.threads for r in runs if r.backend.device_name == "cpu"}
    }
    for r in runs:
        r.read_gbps = bandwidth.get(r.threads)
    rows = [
        with_totals(
            {**r.result(), "cpu_use": cpu_use, "codec_process_rss_gb": _codec_peak_gb(r.backend)},
            codecs[(r.cfg.codec_dtype, r.cfg.threads)],
        )
        for r in runs
    ]
    base = next((r for r in rows if r.get("baseline")), None)
    for r in rows:
        if base is not None:
            r["vs_baseline"] = base["ms_per_frame"] / r["ms_per_frame"]
    return rows


def measure_rss(cfg: BenchSettings) -> dict:
    """Peak RSS of one configuration alone: load, prefill, a few frames, one streaming-chunk decode."""
    r = _Run(cfg.model_copy(update={"frames": 4}))
    r.backend.prefill(r.prompt)
    r._frame_loop()
    cc = r.backend.checkpoint.codec_config
    r.backend.decode_window(_random_codes(cc, STREAM_WINDOW, np.random.default_rng(0)))
    return {"label": label(cfg), **peak_rss(r.backend), "load_s_alone": r.load_s}


def measure(cfg: BenchSettings) -> dict:
    """Every figure for one configuration in this process (peak RSS included: it is alone here)."""
    row = measure_group([cfg])[0]
    row["peak_rss_gb"] = _own_peak_gb() + row["codec_process_rss_gb"]
    return row


def peak_rss(backend) -> dict:
    """Peak RSS in GB (1e9 bytes) of this process (``ru_maxrss``) and, when ``backend``'s codec runs in a process of
    its own, of that process (its ``VmHWM``; not this process's child in ``getrusage``'s sense: a fork server's):
    ``peak_rss_gb`` their sum, ``codec_process_rss_gb`` the codec process's part (0.0 without one)."""
    codec = _codec_peak_gb(backend)
    return {"peak_rss_gb": _own_peak_gb() + codec, "codec_process_rss_gb": codec}


def _own_peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _codec_peak_gb(backend) -> float:
    """The peak RSS (GB) of ``backend``'s codec process; 0.0 without one."""
    pid = backend.codec_process_pid
    return 0.0 if pid is None else _hwm_gb(pid)


def _hwm_gb(pid: int) -> float:
    """``VmHWM`` of process ``pid`` in GB; 0.0 when it cannot be read (gone, not Linux)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 / 1e9 for line in f if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        return 0.0
