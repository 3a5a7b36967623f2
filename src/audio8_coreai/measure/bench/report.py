"""The benchmark's table (one line per configuration) and the run's context written beside its figures."""

from __future__ import annotations

import os
import platform

from .config import PUBLISHER, SENTENCE

COLUMNS = [
    ("config", "label", "{}"),
    ("ms/tok", "prefill_ms_per_token", "{:.1f}"),
    ("ms/frame", "ms_per_frame", "{:.1f}"),
    ("CPU ms/frame", "cpu_ms_per_frame", "{:.1f}"),
    ("slow", "slow_ms", "{:.1f}"),
    ("fast", "fast_ms", "{:.1f}"),
    ("sampler", "sampler_ms", "{:.1f}"),
    ("other", "other_ms", "{:.1f}"),
    ("ops/frame", "ops_per_frame", "{:.0f}"),
    ("floor", "floor_ms", "{:.1f}"),
    ("frame/floor", "frame_floor_ratio", "{:.2f}"),
    ("phys floor", "physical_floor_ms", "{:.1f}"),
    ("frame/phys", "frame_physical_ratio", "{:.2f}"),
    ("codec ms/chunk", "codec_ms_per_chunk", "{:.0f}"),
    ("RTF", "rtf", "{:.2f}"),
    ("RTF stream", "rtf_streaming", "{:.2f}"),
    ("TTFA s", "ttfa_ms", "{:.2f}"),
    ("RSS GB", "peak_rss_gb", "{:.2f}"),
    ("CPU use", "cpu_use", "{:.2f}"),
    ("vs base", "vs_baseline", "{:.1f}x"),
]


def format_table(rows: list[dict]) -> str:
    """A plain-text table (one line per configuration)."""

    def cell(r, key, fmt):
        v = r.get(key)
        if v is None:
            return "-"
        if fmt == "{:.1f}" and 0 < abs(v) < 0.95:  # a small model's ms: two figures, not 0.0
            fmt = "{:.2g}"
        return fmt.format(v / 1e3 if key == "ttfa_ms" else v) + ("*" if key == "label" and r.get("noisy") else "")

    table = [[h for h, _, _ in COLUMNS]] + [[cell(r, k, f) for _, k, f in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in table
    ]
    if rows:
        r0 = rows[0]
        lines.insert(
            0,
            f"{r0['backend']} {r0['device']}, prompt {r0['prompt_columns']} columns, {r0['frames']} frames, "
            f"median of {r0['runs']} runs after a warm-up; times in ms unless named",
        )
    if any(r.get("noisy") for r in rows):
        lines.append("* parts timed longer than the frame (other < 0): another process held the CPU; run again")
    return "\n".join(lines)


def meta() -> dict:
    import torch

    return {
        "load_average": os.getloadavg(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "sentence": SENTENCE,
        "publisher_fp32": PUBLISHER,
    }
