"""Speed and memory of a backend: the harness behind ``audio8 bench`` and ``benchmarks/bench_torch.py``.

Timing lives here and in ``benchmarks/``, never in the tests. The machine is shared, so configurations
(backend, device, precision, threads, or the publisher-style baseline) are timed **side by side**: one
subprocess loads them all and takes ``runs + 1`` rounds, each configuration one sample of every figure per
round in turn (the first round is the warm-up); medians are reported, and a change of load hits every
configuration alike, so their ratios hold. Each configuration's peak RSS is then measured alone in its own
subprocess. Figures (milliseconds unless named):

* ``prefill_ms`` / ``prefill_ms_per_token``: ``backend.prefill`` of the plain prompt of a 26-word sentence, every
  column computed (no kept head);
* ``ms_per_frame`` (wall) and ``cpu_ms_per_frame`` (process CPU time: with one thread it leaves out the time
  other processes held the core): ``first_frame`` then ``frame`` for exactly ``frames`` frames with seeded
  noise and the RAS window as ``engine.generate`` drives them (eos ignored: a random checkpoint may draw it);
* the frame's split, each part timed alone with the callables the frame uses (``frame_parts``): ``slow_ms``
  (one slow-AR step), ``fast_ms`` (the fast AR's rows of one frame, no sampling), ``sampler_ms`` (the semantic
  draw with RAS and the nine codebook draws); ``other_ms`` = frame - parts (host work, copies);
* the **weight-streaming floor** of this precision, ``floor_ms``: every linear of the slow AR once plus every
  linear of the fast AR once per fast pass (9: rows 0 and 1 share a pass, both known before any fast draw),
  each called at batch 1 with the frame's own modules (so the same kernels and weight formats), nothing else;
  ``frame_floor_ratio`` = ms/frame / floor (1.0 = the frame does nothing but stream its weights);
* codec: ``decode_window`` of a [10, 160] window (the whole-utterance cost per frame) and the streaming chunk:
  32 frames pushed into the backend's exact incremental ``codec_stream`` (first push and steady state); the
  codec is the same module whatever the precision, so it is timed once per codec dtype and thread count;
* ``rtf`` (whole utterance of ``frames`` frames: prefill + frames + one decode, per second of audio),
  ``rtf_streaming`` (steady state: 32 frames plus one 32-frame chunk decode per 32 frames of audio),
  ``ttfa_ms`` (time to first audio when streaming: prefill + the first chunk's frames (``DEFAULT_FIRST_CHUNK_FRAMES``)
  + their decode; the prefill with the prompt's head kept, ``prefill_head_kept_ms``, where the backend keeps
  heads (torch): what every request in a voice after its first waits for);
* ``peak_rss_gb`` (``ru_maxrss`` of the configuration's own subprocess: load, prefill, frames, a chunk) and
  ``cpu_use`` (CPU s / wall s of the side-by-side run: well under the thread count means other processes
  took the cores and every wall time is inflated).

The **publisher-style baseline** (``baseline=True``) is fp32 with the full 155,776-row head, one call per fast
row and host-side NumPy sampling, as the publisher's ``generate`` does; ``vs_baseline`` is its ms/frame over a
row's, from the same side-by-side run.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .engine.stream import DEFAULT_FIRST_CHUNK_FRAMES

SENTENCE = ("The meeting has been moved to Thursday afternoon, so please update your calendars and let "
            "the rest of the team know before the end of the day.")
STREAM_CHUNK = 32  # frames emitted per streaming decode
FIRST_CHUNK = DEFAULT_FIRST_CHUNK_FRAMES  # frames of a stream's first chunk (streaming.py)
STREAM_WINDOW = 160  # frames decoded per streaming chunk (128 of context, attention window of the codec)
FAST_PASSES = 9  # rows 0+1 in one pass, then rows 2..9
DEFAULT_CHECKPOINT = Path("~/.cache/audio8-coreai/bench-0.6b")
PUBLISHER = {"ms_per_frame": 265.0, "rtf": 6.7, "peak_rss_gb": 5.75}  # its own fp32 generate, this machine


@dataclass(frozen=True)
class BenchConfig:
    """One configuration, run in its own subprocess."""

    checkpoint: str
    backend: str = "torch"
    device: str = "cpu"
    precision: str = "fp32"
    threads: int | None = None
    runs: int = 3
    frames: int = 32
    baseline: bool = False  # measure the publisher-style frame instead of the backend's
    codec_dtype: str | None = None  # None: the backend's default (fp32 on CPU); bf16 opts in
    cuda_graphs: bool = False  # the frame replayed as one CUDA graph (backends/torch/cudagraphs.py)

    @property
    def label(self) -> str:
        name = "baseline" if self.baseline else self.precision
        codec = f" codec {self.codec_dtype}" if self.codec_dtype else ""
        return f"{name} {self.threads or 'auto'}t{codec}" + (" graphs" if self.cuda_graphs else "")


def median_ms(fn: Callable[[], object], runs: int, inner: int = 1) -> tuple[float, list[float]]:
    """One warm-up call, then ``runs`` timed runs of ``inner`` calls; (median ms per call, all runs)."""
    fn()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) * 1e3 / inner)
    return statistics.median(out), out


# --- the pieces of a frame, timed alone -------------------------------------------------------------------


def linear_modules(module) -> list:
    """Every linear-like module under ``module`` (``nn.Linear`` or a quantized stand-in with ``in_features``)."""
    return [m for m in module.modules() if hasattr(m, "in_features") and hasattr(m, "out_features")]


def _input_dtype(m):
    import torch

    dt = getattr(m, "input_dtype", None)
    if dt is not None:
        return dt
    w = getattr(m, "weight", None)
    return w.dtype if isinstance(w, torch.Tensor) and w.is_floating_point() else torch.float32


def weight_floor(backend, runs: int, passes: int = FAST_PASSES) -> dict:
    """The weight-streaming floor of ``backend``'s precision: each linear called once at batch 1 (slow AR once,
    fast AR ``passes`` times in a row), nothing else. Returns ms and the weights read per frame."""
    import torch

    model = backend.model
    slow, fast = linear_modules(model.slow), linear_modules(model.fast)
    dev = backend.device

    def calls(mods):
        xs = [torch.randn(1, 1, m.in_features, device=dev).to(_input_dtype(m)) for m in mods]
        return list(zip(mods, xs))

    slow_calls, fast_calls = calls(slow), calls(fast)

    @torch.inference_mode()
    def run_slow():
        for m, x in slow_calls:
            m(x)
        _sync(dev)

    @torch.inference_mode()
    def run_fast():
        for _ in range(passes):
            for m, x in fast_calls:
                m(x)
        _sync(dev)

    slow_ms, _ = median_ms(run_slow, runs)
    fast_ms, _ = median_ms(run_fast, runs)
    n_slow = sum(m.in_features * m.out_features for m in slow)
    n_fast = sum(m.in_features * m.out_features for m in fast)
    return {"floor_ms": slow_ms + fast_ms, "floor_slow_ms": slow_ms, "floor_fast_ms": fast_ms,
            "fast_passes": passes, "weights_per_frame_m": (n_slow + passes * n_fast) / 1e6}


def _sync(dev) -> None:
    import torch

    if getattr(dev, "type", "cpu") == "cuda":
        torch.cuda.synchronize(dev)


def frame_parts(backend, params, pos: int) -> dict[str, Callable[[], object]]:
    """Callables for the parts of the torch backend's frame at slot ``pos``: ``slow`` (the slow step on one
    column, writing that slot), ``fast`` (the fast AR's rows, each fed code 0: no sampling), ``sampler`` (every
    draw of a frame on fixed logits)."""
    import torch

    from .sampling import sample_semantic, sample_top_k_top_p

    frame, cfg, dev = backend.frame_maths, backend.cfg, backend.device
    col = torch.zeros(1, cfg.num_codebooks + 1, 1, dtype=torch.long, device=dev)
    col[0, 0] = cfg.semantic_begin_id
    hidden = torch.randn(1, cfg.dim, device=dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    logits = torch.randn(1, cfg.num_semantic + 1, device=dev) * 3
    fast_logits = torch.randn(1, cfg.codebook_size, device=dev) * 3
    noise = torch.rand(1, 2, cfg.num_semantic + 1, device=dev).clamp(min=1e-6)
    noise_fast = torch.rand(1, cfg.codebook_size, device=dev).clamp(min=1e-6)
    window = torch.full((1, cfg.ras_window_size), -1, dtype=torch.long, device=dev)

    @torch.inference_mode()
    def slow():
        frame.slow_step(col, pos, backend.k_cache, backend.v_cache)
        _sync(dev)

    @torch.inference_mode()
    def fast():
        frame.fast_rows(hidden, zero, lambda row, lg: zero)
        _sync(dev)

    @torch.inference_mode()
    def sampler():
        sample_semantic(logits, noise, window, top_k=params.top_k, top_p=params.top_p,
                        temperature=params.temperature, ras_top_p=params.ras_top_p,
                        ras_temperature=params.ras_temperature, semantic_begin_id=cfg.semantic_begin_id,
                        eos_id=cfg.eos_token_id, eager=True)
        for _ in range(cfg.num_codebooks - 1):
            sample_top_k_top_p(fast_logits, noise_fast, params.top_k, params.top_p, params.temperature, eager=True)
        _sync(dev)

    return {"slow": slow, "fast": fast, "sampler": sampler}


# --- the publisher-style baseline frame -------------------------------------------------------------------


class BaselineFrame:
    """The publisher's way of making a frame, on our fp32 modules: the slow step with the full-vocabulary head
    (155,776 rows: the tied embedding), logits to the host, NumPy sampling with the mask, then the fast AR's rows
    with each row's logits to the host and a NumPy draw. THE baseline of the benchmark's side-by-side ratio, not a
    product path."""

    def __init__(self, backend, params):
        self.backend, self.params = backend, params
        cfg = backend.cfg
        self.allowed = np.concatenate([np.arange(cfg.semantic_begin_id, cfg.semantic_end_id + 1),
                                       [cfg.eos_token_id]])

    def __call__(self, column: np.ndarray, pos: int, noise_slow: np.ndarray, window: np.ndarray,
                 noise_fast: np.ndarray) -> tuple[int, np.ndarray]:
        import torch

        from .sampling import np_sample_semantic, np_sample_top_k_top_p

        b, cfg, p = self.backend, self.backend.cfg, self.params
        model = b.model
        with torch.inference_mode():
            col = torch.as_tensor(column, dtype=torch.long).view(1, -1, 1)
            _, hidden = b.frame_maths.slow_step(col, pos, b.k_cache, b.v_cache)
            full = torch.nn.functional.linear(hidden, model.slow.embeddings.weight)[0].numpy()
        logits = full[self.allowed]  # the publisher masks every other id to -inf before sampling
        sem, _, _ = np_sample_semantic(logits, noise_slow, window, top_k=p.top_k, top_p=p.top_p,
                                       temperature=p.temperature, ras_top_p=p.ras_top_p,
                                       ras_temperature=p.ras_temperature,
                                       semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id)
        code = int(np.clip(int(sem) - cfg.semantic_begin_id, 0, cfg.codebook_size - 1))
        codes = [code]

        def draw(row: int, lg: torch.Tensor) -> torch.Tensor:  # each row's logits to the host, a NumPy draw
            codes.append(int(np_sample_top_k_top_p(lg[0].float().numpy(), noise_fast[row - 1], p.top_k, p.top_p,
                                                   p.temperature)))
            return torch.tensor([codes[-1]])

        with torch.inference_mode():
            b.frame_maths.fast_rows(hidden, torch.tensor([code]), draw)
        return int(sem), np.asarray(codes, dtype=np.int64)


# --- configurations in one process, interleaved -----------------------------------------------------------


def _load(cfg: BenchConfig):
    import torch

    from .tts import TTS

    if cfg.backend != "torch":
        raise ValueError(f"the bench drives the torch backend; got {cfg.backend!r}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)  # before loading: ONNX Runtime sessions take the count then
    return TTS.load(cfg.checkpoint, device=cfg.device, precision="fp32" if cfg.baseline else cfg.precision,
                    codec_dtype=cfg.codec_dtype, cuda_graphs=cfg.cuda_graphs)


def _random_codes(cc, n: int, rng) -> np.ndarray:
    return np.concatenate([rng.integers(0, cc.semantic_codebook_size, (1, n)),
                           rng.integers(0, cc.residual_codebook_size, (cc.residual_codebooks, n))])


class _Run:
    """One loaded configuration and its samples; :meth:`round` takes one sample of everything."""

    def __init__(self, cfg: BenchConfig):
        import torch

        t0 = time.perf_counter()
        self.cfg, self.tts = cfg, _load(cfg)
        self.load_s = time.perf_counter() - t0
        self.threads = torch.get_num_threads()
        self.backend = self.tts.backend
        self.mc = self.tts.config
        self.params = self.tts.sampling()
        self.prompt = self.tts.prompts.plain(SENTENCE)
        self.baseline = BaselineFrame(self.backend, self.params) if cfg.baseline else None
        self.samples: dict[str, list[float]] = {}
        self._parts = self._floor = None

    def _add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    def _frame_loop(self) -> tuple[float, float]:
        """(wall ms, CPU ms) per frame of one run of ``frames`` frames after a prefill."""
        from .sampling import NoiseSource, RasWindow

        b, mc, p_len = self.backend, self.mc, self.prompt.shape[1]
        b.prefill(self.prompt)
        noise = NoiseSource(0, mc.num_semantic, mc.codebook_size, mc.num_codebooks - 1)
        window = RasWindow(mc.ras_window_size)
        t0, c0 = time.perf_counter(), time.process_time()
        column = None
        for step in range(self.cfg.frames):
            noise_slow, noise_fast = noise.next_frame()
            if self.baseline is not None:
                if column is None:  # the baseline makes frame 0 from a slow step too (one more step per run)
                    column = np.zeros(mc.num_codebooks + 1, dtype=np.int64)
                    column[0] = mc.semantic_begin_id
                sem, codes = self.baseline(column, p_len + step - 1, noise_slow, window.current()[0], noise_fast)
            else:
                if column is None:
                    res = b.first_frame(self.params, noise_slow, window.current()[0], noise_fast)
                else:
                    res = b.frame(self.params, column, p_len + step - 1, noise_slow, window.current()[0],
                                  noise_fast)
                sem, codes = res.semantic, res.codes
            window.push(sem)
            column = np.concatenate([[sem], codes])
        n = self.cfg.frames
        return (time.perf_counter() - t0) * 1e3 / n, (time.process_time() - c0) * 1e3 / n

    def round(self) -> None:
        """One sample of every figure (the caller drops the first round: the warm-up)."""
        import torch

        if self.cfg.threads:
            torch.set_num_threads(self.cfg.threads)
        # Every column computed (ms per token), then with the prompt's head kept, as requests in one voice run
        # it after the first (TTFA).
        head = getattr(self.backend, "prefix_length", None)
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
            self._parts = frame_parts(self.backend, self.params, self.prompt.shape[1] + self.cfg.frames // 2)
        for name, fn in self._parts.items():
            self._add(f"{name}_ms", median_ms(fn, 1, inner=3)[0])
        floor = weight_floor(self.backend, 1)
        self._floor = floor
        for key in ("floor_ms", "floor_slow_ms", "floor_fast_ms"):
            self._add(key, floor[key])

    def result(self) -> dict:
        out: dict = {"label": self.cfg.label, **asdict(self.cfg), "threads_used": self.threads,
                     "load_s": self.load_s, "prompt_columns": int(self.prompt.shape[1]),
                     "description": getattr(self.backend, "description", "")}
        for key, vals in self.samples.items():
            vals = vals[1:] if len(vals) > 1 else vals  # the first round is the warm-up
            out[key] = statistics.median(vals)
            if key == "ms_per_frame":
                out["frame_runs_ms"] = vals
        out["prefill_ms_per_token"] = out["prefill_ms"] / out["prompt_columns"]
        if self._floor is not None:
            out["fast_passes"] = self._floor["fast_passes"]
            out["weights_per_frame_m"] = self._floor["weights_per_frame_m"]
            out["other_ms"] = out["ms_per_frame"] - sum(out[f"{k}_ms"] for k in self._parts)
            out["frame_floor_ratio"] = out["ms_per_frame"] / out["floor_ms"]
        out["vs_publisher"] = PUBLISHER["ms_per_frame"] / out["ms_per_frame"]
        return out


def measure_codec(backend, runs: int) -> dict:
    """The codec, median of ``runs`` after a warm-up: ``decode_window`` of a [10, 160] window (the whole-utterance
    cost per frame) and, when the backend streams (``codec_stream``), pushes into a fresh stream: the first, of
    ``DEFAULT_FIRST_CHUNK_FRAMES`` frames as :class:`.streaming.SpeechStream` sends first (``codec_first_chunk_ms``),
    and the steady state (``codec_ms_per_chunk``: the 2nd and 3rd pushes of 32 frames). Without a stream, a
    streaming chunk is a [10, 160] window decode (128 frames of context, 32 new) and the first chunk a
    [10, DEFAULT_FIRST_CHUNK_FRAMES] one."""
    cc = backend.checkpoint.codec_config
    rng = np.random.default_rng(0)
    window = _random_codes(cc, STREAM_WINDOW, rng)
    out = {"codec_ms_per_window": median_ms(lambda: backend.decode_window(window), runs)[0],
           "codec_window_frames": STREAM_WINDOW, "frame_audio_ms": cc.frame_length / cc.sample_rate * 1e3}
    if hasattr(backend, "codec_stream"):
        first, steady = [], []
        for _ in range(runs + 1):
            stream = backend.codec_stream()
            t0 = time.perf_counter()
            stream.push(window[:, :FIRST_CHUNK])
            first.append((time.perf_counter() - t0) * 1e3)
            for i in (1, 2):
                t0 = time.perf_counter()
                stream.push(window[:, FIRST_CHUNK + (i - 1) * STREAM_CHUNK:FIRST_CHUNK + i * STREAM_CHUNK])
                steady.append((time.perf_counter() - t0) * 1e3)
        out.update(codec_first_chunk_ms=statistics.median(first[1:]), codec_ms_per_chunk=statistics.median(steady[2:]),
                   codec_streaming="incremental")
    else:
        first = _random_codes(cc, FIRST_CHUNK, rng)
        out.update(codec_first_chunk_ms=median_ms(lambda: backend.decode_window(first), runs)[0],
                   codec_ms_per_chunk=out["codec_ms_per_window"], codec_streaming="window")
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
    row["ttfa_ms"] = prefill + FIRST_CHUNK * f + codec["codec_first_chunk_ms"]
    return row


def measure_group(configs: list[BenchConfig]) -> list[dict]:
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
    rows = [with_totals({**r.result(), "cpu_use": cpu_use}, codecs[(r.cfg.codec_dtype, r.cfg.threads)])
            for r in runs]
    base = next((r for r in rows if r.get("baseline")), None)
    for r in rows:
        if base is not None:
            r["vs_baseline"] = base["ms_per_frame"] / r["ms_per_frame"]
    return rows


def measure_rss(cfg: BenchConfig) -> dict:
    """Peak RSS of one configuration alone: load, prefill, a few frames, one streaming-chunk decode."""
    r = _Run(BenchConfig(**{**asdict(cfg), "frames": 4}))
    r.backend.prefill(r.prompt)
    r._frame_loop()
    cc = r.backend.checkpoint.codec_config
    r.backend.decode_window(_random_codes(cc, STREAM_WINDOW, np.random.default_rng(0)))
    return {"label": cfg.label, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            "load_s_alone": r.load_s}


def measure(cfg: BenchConfig) -> dict:
    """Every figure for one configuration in this process (peak RSS included: it is alone here)."""
    row = measure_group([cfg])[0]
    row["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return row


# --- subprocesses -------------------------------------------------------------------------------------------


def ensure_checkpoint(path: Path, log=print) -> Path:
    """The random 0.6b checkpoint at ``path``, written (seed 0, about 2.8 GB) when the folder is absent or empty."""
    path = path.expanduser()
    if path.is_dir() and any(path.iterdir()):
        return path
    from .checkpoint import CheckpointError, make_checkpoint

    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} is a file: give a checkpoint folder, or a new folder for the random 0.6b one")

    log(f"making the random 0.6b checkpoint in {path} (about 2.8 GB, a minute or more)...")
    make_checkpoint(path, "0.6b", seed=0)
    return path


def _worker(mode: str, payload) -> list | dict:
    proc = subprocess.run([sys.executable, "-m", "audio8_coreai.bench", mode, json.dumps(payload)],
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode:
        raise RuntimeError(f"the bench worker ({mode}) failed (exit status {proc.returncode}); its error is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_configs(configs: list[BenchConfig], log=print, rss: bool = True) -> list[dict]:
    """Time ``configs`` side by side in one subprocess (:func:`measure_group`), then (``rss``) measure each
    one's peak RSS alone in its own subprocess (:func:`measure_rss`)."""
    log(f"measuring {', '.join(c.label for c in configs)} side by side...")
    rows = _worker("--group", [asdict(c) for c in configs])
    if rss:
        for c, row in zip(configs, rows):
            log(f"peak RSS of {c.label} alone...")
            row.update(_worker("--rss", asdict(c)))
    return rows


COLUMNS = [("config", "label", "{}"), ("ms/tok", "prefill_ms_per_token", "{:.1f}"),
           ("ms/frame", "ms_per_frame", "{:.1f}"), ("CPU ms/frame", "cpu_ms_per_frame", "{:.1f}"), ("slow", "slow_ms", "{:.1f}"), ("fast", "fast_ms", "{:.1f}"),
           ("sampler", "sampler_ms", "{:.1f}"), ("other", "other_ms", "{:.1f}"), ("floor", "floor_ms", "{:.1f}"),
           ("frame/floor", "frame_floor_ratio", "{:.2f}"), ("codec ms/chunk", "codec_ms_per_chunk", "{:.0f}"),
           ("RTF", "rtf", "{:.2f}"), ("RTF stream", "rtf_streaming", "{:.2f}"), ("TTFA s", "ttfa_ms", "{:.2f}"),
           ("RSS GB", "peak_rss_gb", "{:.2f}"), ("CPU use", "cpu_use", "{:.2f}"), ("vs base", "vs_baseline", "{:.1f}x")]


def format_table(rows: list[dict]) -> str:
    """A plain-text table (one line per configuration)."""
    def cell(r, key, fmt):
        v = r.get(key)
        if v is None:
            return "-"
        return fmt.format(v / 1e3 if key == "ttfa_ms" else v)

    table = [[h for h, _, _ in COLUMNS]] + [[cell(r, k, f) for _, k, f in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in table]
    if rows:
        r0 = rows[0]
        lines.insert(0, f"{r0['backend']} {r0['device']}, prompt {r0['prompt_columns']} columns, {r0['frames']} frames, "
                        f"median of {r0['runs']} runs after a warm-up; times in ms unless named")
    return "\n".join(lines)


def meta() -> dict:
    import torch

    return {"load_average": os.getloadavg(), "torch": torch.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "sentence": SENTENCE,
            "publisher_fp32": PUBLISHER}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--group":
        print(json.dumps(measure_group([BenchConfig(**c) for c in json.loads(argv[1])])))
    elif len(argv) == 2 and argv[0] == "--rss":
        print(json.dumps(measure_rss(BenchConfig(**json.loads(argv[1])))))
    elif len(argv) == 2 and argv[0] == "--worker":
        print(json.dumps(measure(BenchConfig(**json.loads(argv[1])))))
    else:
        raise SystemExit("usage: python -m audio8_coreai.bench --group|--rss|--worker JSON (use `audio8 bench`)")


if __name__ == "__main__":
    main()
