"""The quality gate's ladder on tiny checkpoints (random weights make no speech, so there only the tensor rungs are
checked for values): reference margins of misses, the gate command, a plugged recognizer, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.errors import GateError
from audio8_coreai.measure.gate import DEFAULT_FIXTURES, miss_margins, run_gate
from audio8_coreai.measure.oracle import _params, load_fixture
from audio8_coreai.measure.parity import replay_forced
from tests.cli.cli_support import run
from tests.clips import needs_espeak


def _read_png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return np.asarray(im)


def test_misses_carry_the_reference_margin(oracle_dir, fixture):
    """bf16 against the fp32 oracle: each teacher-forced miss is listed with the publisher's margin, and the
    misses are near-ties (bf16 rounding flips only close races)."""
    backend = TorchBackend(load_checkpoint(oracle_dir), "cpu", "bf16")
    fx, meta = load_fixture(oracle_dir / "fixture.npz")
    rep = replay_forced(backend, fx, meta, "plain")
    misses = miss_margins(rep, fx, "plain", _params(meta, "plain", backend), backend.cfg)
    assert (
        len(misses)
        == len(rep.misses)
        == (rep.semantic_draws[1] - rep.semantic_draws[0] + rep.codebook_draws[1] - rep.codebook_draws[0])
        > 0
    )
    assert all(0.0 <= m["margin"] < 0.2 and m["want"] != m["got"] for m in misses)


def gate_oracle(oracle_dir: Path, *args):
    """``audio8 gate --model ORACLE --against ORACLE/fixture.npz ARGS`` through the shared CLI runner."""
    return run("gate", "--model", oracle_dir, "--against", oracle_dir / "fixture.npz", *args)


def test_gate_against_the_oracle_cli(oracle_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    result = gate_oracle(oracle_dir, "--device", "cpu", "--out", out)
    assert result.exit_code == 0, result.output
    assert "gate PASS" in result.output and result.output.count("PASS") == 1  # said once (the log said it too)
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and report["verdicts"]["tensor"] == "pass"
    t = report["totals"]
    assert t["semantic_draws"][0] == t["semantic_draws"][1] > 0 and t["codebook_draws"][0] == t["codebook_draws"][1]
    assert t["misses"] == 0 and t["slow_logits_min_cos"] > 0.99999
    # Free runs counted where a scenario has one: plain, greedy, clone; not the batch (it said 3/4)
    assert [f["name"] for f in report["fixtures"]] == ["plain", "greedy", "clone", "batch"]
    assert t["free_run_identical"] == [3, 3]
    assert report["parity"]["passed"]
    for f in report["fixtures"]:
        if f["codec"]:
            assert f["codec"]["logmel_cos"] > 0.99999 and f["codec"]["waveform_max_diff"] < 1e-4
    assert any("ASR round trip" in s for s in report["skipped"])
    md = (out / "report.md").read_text()
    assert "**PASS**" in md and "![summary](summary.png)" in md
    (out / "audio" / "stale.port.wav").write_bytes(b"a former run's")  # a report is replaced whole
    assert gate_oracle(oracle_dir, "--device", "cpu", "--out", out).exit_code == 0
    assert not (out / "audio" / "stale.port.wav").exists() and (out / "report.json").is_file()
    assert [p.name for p in out.parent.iterdir()] == ["report"]  # no staging folder left beside it
    pictures = [out / "summary.png"] + [out / f["picture"] for f in report["fixtures"] if f["picture"]]
    assert len(pictures) == 4  # summary + plain, greedy, clone
    for p in pictures:
        assert _read_png(p).shape[0] > 100


@needs_espeak
def test_gate_against_fp32_on_a_tiny_checkpoint(tiny_checkpoint, tmp_path):
    """The fp32 ladder end to end on a random-weight checkpoint: an fp32 port agrees exactly with the reference
    run (draws, frames, codec, encoder), and the ASR and speaker rungs run on its (speechless) audio."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("pocketsphinx")
    pytest.importorskip("jiwer")
    fixtures = tmp_path / "fixtures.json"
    fixtures.write_text(
        json.dumps(
            [
                {"name": "en_a", "language": "en", "seed": 3, "text": "Please call me tomorrow.", "reference": None},
                {"name": "ja_a", "language": "ja", "seed": 4, "text": "今日はいい天気です。", "reference": None},
                {
                    "name": "clone_a",
                    "language": "en",
                    "seed": 5,
                    "text": "It is going to rain.",
                    "reference": {"audio": None, "text": "The quick brown fox jumps over the lazy dog."},
                },
            ]
        )
    )
    out = tmp_path / "report"
    report = run_gate(tiny_checkpoint, out, fixtures=fixtures, max_frames=10)
    t = report.totals()
    assert t["semantic_draws"][0] == t["semantic_draws"][1] > 0 and t["codebook_draws"][0] == t["codebook_draws"][1]
    assert t["misses"] == 0 and t["free_run_identical"] == [3, 3]
    assert report.verdicts["tensor"] == "pass" and report.verdicts["eos"] == "pass"
    by_name = {f.name: f for f in report.fixtures}
    for f in report.fixtures:
        assert f.teacher_forced["free_run_prefix"] == f.teacher_forced["free_run_frames"]
        assert f.codec["waveform_max_diff"] == 0.0 and f.codec["logmel_cos"] == pytest.approx(1.0)
        assert (out / f.picture).is_file() and (out / f.audio["port"]).is_file()
    assert by_name["clone_a"].encoder["codes_equal"][0] == by_name["clone_a"].encoder["codes_equal"][1] > 0
    assert (out / "clips" / "clone_a.wav").is_file()  # spoken by espeak-ng at gate time
    assert by_name["en_a"].asr["metric"] == "WER" and "text" in by_name["en_a"].asr["port"]
    assert report.asr["en"]["fixtures"] == 2 and "skipped" in report.asr["ja"]
    assert report.verdicts["asr"] == {"en": "pass", "ja": "skipped"}
    if "skipped" not in report.speaker:  # resemblyzer present
        spk = by_name["clone_a"].speaker
        assert spk["port"] == pytest.approx(spk["reference"]) and report.verdicts["speaker"] == "pass"
    saved = json.loads((out / "report.json").read_text())
    assert saved["passed"] and saved["fixtures"][0]["teacher_forced"]["misses"] == []
    for p in [out / "summary.png"] + [out / f.picture for f in report.fixtures]:
        assert _read_png(p).ndim == 3


FAKE_RECOGNIZER = """
import numpy as np

CALLS = []


def hear(audio, sample_rate, language):
    CALLS.append((audio.dtype, audio.ndim, len(audio), sample_rate, language))
    return {"en": "please call me today", "ja": "今日はいい天気"}[language]


def japanese(audio, sample_rate, language):
    return "今日は"


japanese.languages = ["ja"]
not_callable = 3


def no_text(audio, sample_rate, language):
    return None
"""


def _gate_with(tiny_checkpoint, tmp_path, monkeypatch, module: str, recognizer: str, fixtures: list[dict]):
    """``audio8 gate`` on ``fixtures`` (4 frames each) with FAKE_RECOGNIZER written as ``module`` in the current
    folder and plugged as ``module:recognizer``; the CLI's result."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("jiwer")
    monkeypatch.chdir(tmp_path)
    (tmp_path / f"{module}.py").write_text(FAKE_RECOGNIZER)
    path = tmp_path / "fixtures.json"
    path.write_text(json.dumps([{**f, "reference": None} for f in fixtures]))
    return run(
        "gate", "--model", tiny_checkpoint, "--fixtures", path, "--max-frames", 4, "--device", "cpu",
        "--out", "report", "--recognizer", f"{module}:{recognizer}",
    )  # fmt: skip


def test_gate_with_a_plugged_recognizer(tiny_checkpoint, tmp_path, monkeypatch):
    """``audio8 gate --recognizer MODULE:CALLABLE``: a module file in the current folder, called with float32
    audio, the rate and each fixture's language; its text is scored like pocketsphinx's (WER en, CER ja)."""
    fixtures = [
        {"name": "en_a", "language": "en", "seed": 3, "text": "Please call me tomorrow."},
        {"name": "ja_a", "language": "ja", "seed": 4, "text": "今日はいい天気です。"},
    ]
    result = _gate_with(tiny_checkpoint, tmp_path, monkeypatch, "audio8_fake_asr", "hear", fixtures)
    assert result.exit_code == 0, result.output
    import audio8_fake_asr

    # Reference and port audio of each fixture, in fixture order: 4 frames of 2048 samples at 44.1 kHz.
    assert audio8_fake_asr.CALLS == [(np.float32, 1, 4 * 2048, 44100, lang) for lang in ("en", "en", "ja", "ja")]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["asr"]["en"]["recognizer"] == "audio8_fake_asr:hear"
    # "please call me tomorrow" heard as "please call me today": 1 of 4 words; "今日はいい天気です" (9) loses 2.
    for label in ("reference", "port"):
        assert report["asr"]["en"][label] == {"edits": 1, "units": 4, "rate": 0.25}
        assert report["asr"]["ja"][label] == {"edits": 2, "units": 9, "rate": pytest.approx(2 / 9)}
    assert report["verdicts"]["asr"] == {"en": "pass", "ja": "pass"}
    assert report["verdicts"]["speaker"] == "skipped" and report["speaker"] == {}  # no clone fixtures


def test_a_language_no_recogniser_covers_is_skipped_and_said_why(tiny_checkpoint, tmp_path, monkeypatch):
    """A skipped rung passes the gate: the console says why it was not judged (it was in report.md alone)."""
    fixtures = [{"name": "de_a", "language": "de", "seed": 3, "text": "Guten Tag."}]
    result = _gate_with(tiny_checkpoint, tmp_path, monkeypatch, "audio8_fake_asr3", "japanese", fixtures)
    assert result.exit_code == 0, result.output
    assert "asr: de skipped" in result.output
    assert "skipped asr de: no recogniser for 'de' (recognisers here cover: " in result.output


def test_load_recognizer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "audio8_fake_asr2.py").write_text(FAKE_RECOGNIZER)
    from audio8_coreai.measure.gate import covers, load_recognizer

    japanese = load_recognizer("audio8_fake_asr2:japanese")
    assert japanese.languages == frozenset({"ja"}) and covers(japanese, "ja") and not covers(japanese, "en")
    assert japanese.transcribe(np.zeros(10, np.float64), 16000.0, "ja") == "今日は"
    assert load_recognizer("audio8_fake_asr2:hear").languages is None
    with pytest.raises(GateError, match="returned NoneType, not the text heard"):
        load_recognizer("audio8_fake_asr2:no_text").transcribe(np.zeros(10), 16000, "en")
    for spec, message in (
        ("audio8_fake_asr2", "expected MODULE:CALLABLE"),
        ("no_such_module_here:fn", "cannot import no_such_module_here"),
        ("audio8_fake_asr2:missing", "audio8_fake_asr2 has no missing"),
        ("audio8_fake_asr2:not_callable", "not_callable is a int, not a callable"),
    ):
        with pytest.raises(GateError, match=message):
            load_recognizer(spec)


def test_gate_cli_bad_input(oracle_dir, tmp_path, monkeypatch):
    """One clear line each (rich wraps it at the terminal width: the checks join the wrapped lines)."""
    pytest.importorskip("matplotlib")  # checked first: a missing extra is reported before anything else
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "audio8_fake_asr3.py").write_text(FAKE_RECOGNIZER)
    result = gate_oracle(oracle_dir, "--recognizer", "audio8_fake_asr3:hear", "--out", tmp_path / "r")
    assert result.exit_code == 2 and "serves the ASR rung of --against fp32" in " ".join(result.output.split())
    result = run("gate", "--model", oracle_dir, "--against", tmp_path / "nope.npz", "--out", tmp_path / "r")
    assert result.exit_code == 2 and "oracle fixture.npz; " in " ".join(result.output.split())
    assert "nope.npz does not exist" in " ".join(result.output.split())
    result = gate_oracle(oracle_dir, "--fixtures", DEFAULT_FIXTURES, "--out", tmp_path / "r")
    assert result.exit_code == 2 and "fixtures apply to --against fp32" in " ".join(result.output.split())
    (tmp_path / "file").write_text("x")
    result = run("gate", "--model", oracle_dir, "--out", tmp_path / "file")
    assert result.exit_code == 2 and "is a file" in " ".join(result.output.split())
    result = run("gate", "--model", oracle_dir, "--out", tmp_path)  # the user's own files are never replaced
    assert result.exit_code == 2 and "holds files that are no gate report" in " ".join(result.output.split())
    assert not (tmp_path / "r").exists()  # nothing made by a refused run


def test_a_fixture_of_another_checkpoint_fails_with_the_cause_said(oracle_dir, tiny_checkpoint, tmp_path):
    """The replay fails on weights the fixture was not recorded from: the note says so (as parity's does), rather
    than leave the failed verdicts to blame the port."""
    pytest.importorskip("matplotlib")
    args = ("--model", tiny_checkpoint, "--against", oracle_dir / "fixture.npz", "--out", tmp_path / "r")
    result = run("gate", *args)
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "gate FAIL" in said
    assert f"was recorded from the checkpoint in {oracle_dir}, whose weights differ from" in said
    assert f"run with --model {oracle_dir}" in said
