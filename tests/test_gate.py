"""The quality gate: its metrics, the ASR and speaker machinery on espeak-ng speech, and the ladder on tiny
checkpoints (random weights make no speech, so there only the tensor rungs are checked for values)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.cli import app
from audio8_coreai.errors import GateError
from audio8_coreai.measure.gate import (
    DEFAULT_FIXTURES,
    ESPEAK_VOICES,
    count_errors,
    espeak_clip,
    gumbel_margin,
    load_fixtures,
    log_mel,
    mel_filterbank,
    miss_margins,
    normalise_text,
    run_gate,
)
from audio8_coreai.measure.oracle import _params, load_fixture
from audio8_coreai.measure.parity import replay_forced
from audio8_coreai.sampling import np_processed_scores
from clips import ESPEAK

needs_espeak = pytest.mark.skipif(ESPEAK is None, reason="espeak-ng is not installed (apt-get install espeak-ng)")

# Five espeak-ng en-us sentences through pocketsphinx: measured WER 34/54 = 0.63 (silence or noise scores 1.0).
ASR_SENTENCES = [
    "The meeting has been moved to Thursday afternoon, so please update your calendars.",
    "Our train leaves from platform nine in about fifteen minutes.",
    "Please call me tomorrow morning.",
    "A small change in the recipe made the soup taste far richer than before.",
    "The library extends its opening hours during the exam period in December.",
]
ESPEAK_WER_BOUND = 0.75


def _read_png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        return np.asarray(im)


# --- metrics ---------------------------------------------------------------------------------------------------


def test_normaliser_nfkc_lowercase_punctuation():
    assert normalise_text("  Hello,   WORLD!  ") == "hello world"
    assert normalise_text("Ｆｕｌｌ－ｗｉｄｔｈ。") == "full width"  # NFKC folds full-width forms first
    assert normalise_text("明日の午後、駅前で。") == "明日の午後 駅前で"


def test_error_counts_by_language():
    pytest.importorskip("jiwer")
    wer = count_errors("en", "The cat sat on the mat.", "the cat sat on a mat")
    assert (wer.edits, wer.units) == (1, 6)
    # ja/zh: characters, recogniser spaces ignored; punctuation never counts.
    cer = count_errors("ja", "明日の午後、駅前で。", "明日 の 午前 駅前で")
    assert (cer.edits, cer.units) == (1, 8)
    de = count_errors("de", "Guten Tag", "guten tag")
    assert (de.edits, de.units, de.rate) == (0, 9, 0.0)
    assert count_errors("en", "Hello there", "").rate == 1.0


def test_gumbel_margin():
    assert gumbel_margin(np.array([0.0, 0.0]), np.array([0.5, 0.5])) == pytest.approx(0.0)
    assert gumbel_margin(np.array([0.0, -np.inf, -np.inf])) == pytest.approx(1.0)
    # softmax (0.8, 0.2): greedy margin (0.8 - 0.2) / 0.8; with noise the race divides by -log(u).
    scores = np.log(np.array([0.8, 0.2]))
    assert gumbel_margin(scores) == pytest.approx(0.75)
    u = np.exp(-np.array([2.0, 0.25]))  # race 0.4 vs 0.8: the runner-up by probability wins
    assert gumbel_margin(scores, u) == pytest.approx(0.5)


def test_margins_from_logits_match_the_recorded_scores(fixture):
    """The gate rebuilds each draw's processed scores from the logits (an fp32 reference records no scores);
    on the oracle they are the publisher's own, for the semantic and every codebook draw."""
    extra = json.loads(str(fixture["meta_json"]))["scenarios"]["plain"]["extra"]
    top_k, top_p, temperature = extra["top_k"], extra["top_p"], extra["temperature"]
    for s in range(int(fixture["plain__num_steps"])):
        ours = np_processed_scores(fixture["plain__slow_logits_compact"][s, 0], top_k, top_p, temperature)
        u = fixture["plain__sem_regular_uniform_compact"][s, 0]
        assert gumbel_margin(ours, u) == pytest.approx(
            gumbel_margin(fixture["plain__sem_regular_scores_compact"][s, 0], u), rel=1e-5
        )
        for c in range(9):
            ours = np_processed_scores(fixture["plain__fast_logits"][s, c, 0], top_k, top_p, temperature)
            u = fixture["plain__fast_uniform"][s, c, 0]
            assert gumbel_margin(ours, u) == pytest.approx(
                gumbel_margin(fixture["plain__fast_scores"][s, c, 0], u), rel=1e-5
            )


def test_mel_filterbank_and_log_mel_shapes():
    fb = mel_filterbank(44100)
    assert fb.shape == (128, 1025) and (fb >= 0).all() and (fb.sum(axis=1) > 0).all()
    tone = np.sin(2 * np.pi * 1000 * np.arange(44100) / 44100).astype(np.float32)
    mel = log_mel(tone, 44100)
    assert mel.shape == (128, 1 + 44100 // 512) and mel.dtype == np.float32
    peak_hz = np.argmax(fb[int(np.argmax(mel[:, 40]))]) * 44100 / 2048
    assert abs(peak_hz - 1000) < 100
    assert np.allclose(log_mel(np.zeros(4096), 44100), np.log(1e-5))


def test_log_mel_matches_librosa():
    librosa = pytest.importorskip("librosa")
    x = np.random.default_rng(0).standard_normal(20000).astype(np.float32) * 0.1
    want = np.log(
        librosa.feature.melspectrogram(y=x, sr=44100, n_fft=2048, hop_length=512, n_mels=128, pad_mode="constant")
        + 1e-5
    )
    assert np.allclose(mel_filterbank(44100), librosa.filters.mel(sr=44100, n_fft=2048, n_mels=128), atol=1e-6)
    assert np.abs(log_mel(x, 44100) - want).max() < 1e-3


# --- fixtures --------------------------------------------------------------------------------------------------


def test_default_fixtures():
    fixtures = load_fixtures()
    plain = [f for f in fixtures if not f.clone]
    clones = [f for f in fixtures if f.clone]
    assert len(plain) >= 12 and len(clones) >= 2
    assert {"en", "ja", "zh", "de", "fr", "es", "ko"} <= {f.language for f in plain}
    assert all(f.ref_audio is None and f.language in ESPEAK_VOICES for f in clones)  # spoken by espeak-ng
    assert len({f.seed for f in fixtures}) == len(fixtures)


@pytest.mark.parametrize(
    "entries, message",
    [
        ("not json", "cannot read fixtures"),
        ([], "non-empty JSON list"),
        ([{"name": "a", "language": "en", "text": "hi"}], "missing seed"),
        ([{"name": "a/b", "language": "en", "text": "hi", "seed": 1}], "name must be"),
        ([{"name": "a", "language": "en", "text": "hi", "seed": -1}], "seed must be"),
        ([{"name": "a", "language": "en", "text": "hi", "seed": 1}] * 2, "used twice"),
        ([{"name": "a", "language": "en", "text": "hi", "seed": 1, "reference": "clip.wav"}], "reference must be"),
    ],
)
def test_bad_fixtures_files(tmp_path, entries, message):
    path = tmp_path / "fixtures.json"
    path.write_text(entries if isinstance(entries, str) else json.dumps(entries))
    with pytest.raises(GateError, match=message):
        load_fixtures(path)


def test_clip_paths_are_relative_to_the_file(tmp_path):
    path = tmp_path / "sub" / "fixtures.json"
    path.parent.mkdir()
    path.write_text(
        json.dumps(
            [
                {
                    "name": "c",
                    "language": "en",
                    "text": "hi",
                    "seed": 1,
                    "reference": {"audio": "clips/me.wav", "text": "hello"},
                }
            ]
        )
    )
    (f,) = load_fixtures(path)
    assert f.clone and f.ref_audio == tmp_path / "sub" / "clips" / "me.wav" and f.ref_text == "hello"


def test_missing_espeak_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(GateError, match="espeak-ng is not installed"):
        espeak_clip("hello", "en-us", tmp_path / "x.wav")


# --- ASR and speaker machinery on real (espeak-ng) speech ------------------------------------------------------


@needs_espeak
def test_pocketsphinx_wer_on_espeak_english(tmp_path):
    pytest.importorskip("pocketsphinx")
    pytest.importorskip("jiwer")
    from audio8_coreai.measure.gate import ErrorCount, PocketSphinxRecognizer

    recognizer = PocketSphinxRecognizer()
    total = ErrorCount()
    for i, text in enumerate(ASR_SENTENCES):
        audio, rate = sf.read(espeak_clip(text, "en-us", tmp_path / f"{i}.wav"), dtype="float32")
        total = total + count_errors("en", text, recognizer.transcribe(audio, rate))
    assert total.units == 54
    assert total.rate <= ESPEAK_WER_BOUND, f"pocketsphinx WER {total.edits}/{total.units} on espeak-ng English"
    silence = count_errors("en", ASR_SENTENCES[2], recognizer.transcribe(np.zeros(16000, np.float32), 16000))
    assert silence.rate == 1.0


@needs_espeak
def test_speaker_similarity_prefers_the_same_voice(tmp_path):
    pytest.importorskip("resemblyzer")
    from audio8_coreai.measure.gate import ResemblyzerEncoder

    encoder = ResemblyzerEncoder()

    def embed(text, voice, name):
        audio, rate = sf.read(espeak_clip(text, voice, tmp_path / f"{name}.wav"), dtype="float32")
        return encoder.embed(audio, rate)

    clip = embed(ASR_SENTENCES[0], "en-us+m3", "clip")
    same = float(clip @ embed(ASR_SENTENCES[1], "en-us+m3", "same"))
    other = float(clip @ embed(ASR_SENTENCES[1], "en-us+f3", "other"))
    assert same > other + 0.1, (same, other)  # measured 0.85 vs 0.52


# --- the ladder ------------------------------------------------------------------------------------------------


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


def test_gate_against_the_oracle_cli(oracle_dir, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "gate",
            "--model",
            str(oracle_dir),
            "--against",
            str(oracle_dir / "fixture.npz"),
            "--device",
            "cpu",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "gate PASS" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and report["verdicts"]["tensor"] == "pass"
    t = report["totals"]
    assert t["semantic_draws"][0] == t["semantic_draws"][1] > 0 and t["codebook_draws"][0] == t["codebook_draws"][1]
    assert t["misses"] == 0 and t["slow_logits_min_cos"] > 0.99999
    assert report["parity"]["passed"]
    for f in report["fixtures"]:
        if f["codec"]:
            assert f["codec"]["logmel_cos"] > 0.99999 and f["codec"]["waveform_max_diff"] < 1e-4
    assert any("ASR round trip" in s for s in report["skipped"])
    md = (out / "report.md").read_text()
    assert "**PASS**" in md and "![summary](summary.png)" in md
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


def test_gate_with_a_plugged_recognizer(tiny_checkpoint, tmp_path, monkeypatch):
    """``audio8 gate --recognizer MODULE:CALLABLE``: a module file in the current folder, called with float32
    audio, the rate and each fixture's language; its text is scored like pocketsphinx's (WER en, CER ja)."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("jiwer")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "audio8_fake_asr.py").write_text(FAKE_RECOGNIZER)
    fixtures = tmp_path / "fixtures.json"
    fixtures.write_text(
        json.dumps(
            [
                {"name": "en_a", "language": "en", "seed": 3, "text": "Please call me tomorrow.", "reference": None},
                {"name": "ja_a", "language": "ja", "seed": 4, "text": "今日はいい天気です。", "reference": None},
            ]
        )
    )
    result = CliRunner().invoke(
        app,
        [
            "gate",
            "--model",
            str(tiny_checkpoint),
            "--fixtures",
            str(fixtures),
            "--max-frames",
            "4",
            "--device",
            "cpu",
            "--out",
            "report",
            "--recognizer",
            "audio8_fake_asr:hear",
        ],
    )
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


def test_gate_cli_bad_input(oracle_dir, tmp_path):
    """One clear line each (rich wraps it at the terminal width: the checks join the wrapped lines)."""
    pytest.importorskip("matplotlib")  # checked first: a missing extra is reported before anything else
    runner = CliRunner()
    result = runner.invoke(
        app, ["gate", "--model", str(oracle_dir), "--against", str(tmp_path / "nope.npz"), "--out", str(tmp_path / "r")]
    )
    assert result.exit_code == 2 and "must be fp32 or an oracle fixture.npz" in " ".join(result.output.split())
    result = runner.invoke(
        app,
        [
            "gate",
            "--model",
            str(oracle_dir),
            "--against",
            str(oracle_dir / "fixture.npz"),
            "--fixtures",
            str(DEFAULT_FIXTURES),
            "--out",
            str(tmp_path / "r"),
        ],
    )
    assert result.exit_code == 2 and "fixtures apply to --against fp32" in " ".join(result.output.split())
    (tmp_path / "file").write_text("x")
    result = runner.invoke(app, ["gate", "--model", str(oracle_dir), "--out", str(tmp_path / "file")])
    assert result.exit_code == 2 and "is a file" in " ".join(result.output.split())
