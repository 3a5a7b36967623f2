"""The gate's pictures (PNG, matplotlib's Agg canvas without pyplot): waveform and log-mel per fixture, and a
summary chart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .errors import _GATE_EXTRA, GateError
from .mel import N_MELS, log_mel
from .report import GateReport


def _matplotlib():
    """(Figure, FigureCanvasAgg) from matplotlib; raises GateError when it is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise GateError(f"the gate's pictures need matplotlib: {_GATE_EXTRA}") from e
    return Figure, FigureCanvasAgg


def _figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas, without pyplot (no global backend switch, no GUI)."""
    figure, canvas = _matplotlib()
    fig = figure(figsize=(width, height), dpi=100, layout="constrained")
    canvas(fig)
    return fig


def plot_fixture(path: Path, title: str, signals: Sequence[tuple[str, np.ndarray]], sample_rate: int) -> Path:
    """Waveform (top) and log-mel spectrogram (bottom) of each labelled signal, side by side, as a PNG."""
    fig = _figure(6.0 * len(signals), 6.0)
    axes = fig.subplots(2, len(signals), squeeze=False)
    mels = [log_mel(x, sample_rate) if len(x) else np.zeros((N_MELS, 1), np.float32) for _, x in signals]
    lo, hi = min(float(m.min()) for m in mels), max(float(m.max()) for m in mels)
    for i, ((label, x), mel) in enumerate(zip(signals, mels)):
        t = np.arange(len(x)) / sample_rate
        axes[0, i].plot(t, x, linewidth=0.4)
        axes[0, i].set(title=f"{label}: {len(x) / sample_rate:.2f} s", xlabel="s", ylim=(-1, 1))
        axes[1, i].imshow(
            mel,
            origin="lower",
            aspect="auto",
            vmin=lo,
            vmax=hi,
            cmap="magma",
            extent=(0, len(x) / sample_rate, 0, N_MELS),
        )
        axes[1, i].set(title=f"{label}: log-mel", xlabel="s", ylabel="mel bin")
    fig.suptitle(title)
    fig.savefig(path)
    return path


def plot_summary(path: Path, report: GateReport) -> Path:
    """Four panels: teacher-forced agreement, free-run frames, ASR error and speaker similarity per fixture
    (reference vs port), as a PNG."""
    fig = _figure(14.0, 9.0)
    (agree, frames), (asr, spk) = fig.subplots(2, 2)
    names = [f.name for f in report.fixtures]
    x = np.arange(len(names))

    def pct(pair):
        return 100.0 * pair[0] / pair[1] if pair[1] else 100.0

    def bars(ax, a, b, labels, title, ylabel, xs=x, ticks=names):
        ax.bar(xs - 0.2, a, 0.4, label=labels[0])
        ax.bar(xs + 0.2, b, 0.4, label=labels[1])
        ax.set_xticks(xs, ticks, rotation=60, ha="right", fontsize=8)
        ax.set_title(title, loc="left")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, ncols=2, loc="lower right", bbox_to_anchor=(1.0, 1.0))  # above the bars

    tf = [f.teacher_forced for f in report.fixtures]
    bars(
        agree,
        [pct(t["semantic_draws"]) for t in tf],
        [pct(t["codebook_draws"]) for t in tf],
        ("semantic", "codebook"),
        "teacher-forced draws equal to the reference",
        "%",
    )
    agree.set_ylim(min([90.0] + [pct(t["codebook_draws"]) - 2 for t in tf]), 100.5)
    bars(
        frames,
        [t["free_run_expected_frames"] or 0 for t in tf],
        [t["free_run_frames"] or 0 for t in tf],
        ("reference", "port"),
        "free-run frames",
        "frames",
    )
    rows = [f for f in report.fixtures if f.asr and "port" in f.asr]
    if rows:
        bars(
            asr,
            [100 * (f.asr["reference"]["rate"] or 0) for f in rows],
            [100 * (f.asr["port"]["rate"] or 0) for f in rows],
            ("reference", "port"),
            "ASR error (WER en, CER others)",
            "%",
            np.arange(len(rows)),
            [f.name for f in rows],
        )
    else:
        asr.set_axis_off()
        asr.text(0.5, 0.5, "ASR round trip skipped", ha="center", va="center")
    rows = [f for f in report.fixtures if f.speaker and "port" in f.speaker]
    if rows:
        bars(
            spk,
            [f.speaker["reference"] for f in rows],
            [f.speaker["port"] for f in rows],
            ("reference", "port"),
            "speaker similarity to the reference clip",
            "cosine",
            np.arange(len(rows)),
            [f.name for f in rows],
        )
    else:
        spk.set_axis_off()
        spk.text(0.5, 0.5, "speaker similarity skipped", ha="center", va="center")
    fig.suptitle(f"{report.port} against {report.reference}")
    fig.savefig(path)
    return path
