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
* ``ops_per_frame``: the PyTorch operator calls of one whole frame (``frame_ops``; each a dispatch on a CPU, a
  kernel launch on a GPU), and ``slow_ops``, ``fast_ops``, ``sampler_ops`` of its parts: counted once, not timed;
* the **weight-streaming floor** of this precision, ``floor_ms``: every linear of the slow AR once plus every
  linear of the fast AR once per fast pass (9: rows 0 and 1 share a pass, both known before any fast draw),
  each called at batch 1 with the frame's own modules (so the same kernels and weight formats), nothing else;
  ``frame_floor_ratio`` = ms/frame / floor (1.0 = the frame does nothing but stream its weights);
* codec: ``decode_window`` of a [10, 160] window (the whole-utterance cost per frame) and the streaming chunk:
  32 frames pushed into the backend's exact incremental ``codec_stream`` (first push and steady state); the
  codec is the same module whatever the precision, so it is timed once per codec dtype and thread count;
* ``rtf`` (whole utterance of ``frames`` frames: prefill + frames + one decode, per second of audio),
  ``rtf_streaming`` (steady state: 32 frames plus one 32-frame chunk decode per 32 frames of audio),
  ``ttfa_ms`` (time to first audio when streaming: prefill + the first chunk's frames
  (``DEFAULTS.speech.first_chunk_frames``) + their decode; the prefill with the prompt's head kept,
  ``prefill_head_kept_ms``, where the backend keeps heads (torch): what every request in a voice after its first waits
for); * ``peak_rss_gb`` (``ru_maxrss`` of the configuration's own subprocess: load, prefill, frames, a chunk, plus its
  codec process's peak, ``codec_process_rss_gb``, when the codec runs in one of its own) and
  ``cpu_use`` (CPU s / wall s of the side-by-side run: well under the thread count means other processes
  took the cores and every wall time is inflated).

The **publisher-style baseline** (``baseline=True``) is fp32 with the full 155,776-row head, one call per fast
row and host-side NumPy sampling, as the publisher's ``generate`` does; ``vs_baseline`` is its ms/frame over a
row's, from the same side-by-side run.

One job a module: :mod:`.config` (configurations, constants, the median timer), :mod:`.parts` (the frame's
pieces and the floor), :mod:`.baseline` (the publisher-style frame), :mod:`.run` (the side-by-side rounds, the
codec, RSS), :mod:`.workers` (the subprocesses) and :mod:`.report` (the table). This package's face re-exports
their public names.
"""

from .baseline import BaselineFrame
from .config import FAST_PASSES, PUBLISHER, SENTENCE, STREAM_CHUNK, STREAM_WINDOW, label, median_ms
from .parts import count_ops, frame_ops, frame_parts, linear_modules, weight_floor
from .report import COLUMNS, format_table, meta
from .run import measure, measure_codec, measure_group, measure_rss, with_totals
from .workers import ensure_checkpoint, main, run_configs

__all__ = [
    "COLUMNS",
    "FAST_PASSES",
    "PUBLISHER",
    "SENTENCE",
    "STREAM_CHUNK",
    "STREAM_WINDOW",
    "BaselineFrame",
    "count_ops",
    "ensure_checkpoint",
    "format_table",
    "label",
    "frame_parts",
    "frame_ops",
    "linear_modules",
    "main",
    "measure",
    "measure_codec",
    "measure_group",
    "measure_rss",
    "median_ms",
    "meta",
    "run_configs",
    "weight_floor",
    "with_totals",
]
