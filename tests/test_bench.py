"""The benchmark harness runs end to end on the tiny checkpoint (structure only: no timing is asserted)."""

from __future__ import annotations

import math

from audio8_coreai.measure.bench import BenchConfig, format_table, measure, measure_group, measure_rss

KEYS = ("prefill_ms_per_token", "prefill_head_kept_ms", "ms_per_frame", "slow_ms", "fast_ms", "sampler_ms", "floor_ms",
        "frame_floor_ratio", "codec_ms_per_chunk", "rtf", "rtf_streaming", "ttfa_ms", "peak_rss_gb")


def test_measure_reports_every_figure(tiny_checkpoint):
    row = measure(BenchConfig(str(tiny_checkpoint), frames=2, runs=1))
    for key in KEYS:
        assert math.isfinite(row[key]) and row[key] > 0, key
    assert row["fast_passes"] == 9
    base = measure(BenchConfig(str(tiny_checkpoint), frames=2, runs=1, baseline=True))
    assert base["ms_per_frame"] > 0 and "floor_ms" not in base
    text = format_table([base, row])
    assert "frame/floor" in text and "baseline autot" in text and "fp32 autot" in text


def test_side_by_side_group_and_rss(tiny_checkpoint):
    cfgs = [BenchConfig(str(tiny_checkpoint), frames=2, runs=1, baseline=True),
            BenchConfig(str(tiny_checkpoint), frames=2, runs=1, precision="int16")]
    base, row = measure_group(cfgs)
    assert base["vs_baseline"] == 1.0 and row["vs_baseline"] > 0
    assert row["description"].endswith("int16") and row["frame_floor_ratio"] > 0
    assert row["codec_ms_per_chunk"] == base["codec_ms_per_chunk"]  # measured once, shared
    assert measure_rss(cfgs[1])["peak_rss_gb"] > 0


def test_bench_command_without_rss_writes_the_json(tiny_checkpoint, tmp_path):
    """--no-rss skips the per-configuration RSS subprocesses (one load each: device time on a GPU)."""
    import json

    from typer.testing import CliRunner

    from audio8_coreai.cli import app

    out = tmp_path / "b.json"
    result = CliRunner().invoke(app, ["bench", "--model", str(tiny_checkpoint), "--frames", "2", "--runs", "1",
                                      "--no-rss", "--json", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["results"]
    assert row["ms_per_frame"] > 0 and "peak_rss_gb" not in row and row["label"] == "fp32 autot"
