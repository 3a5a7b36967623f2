"""The quality gate: its metrics, its fixtures files, the ASR and speaker machinery on espeak-ng speech (the ladder
on tiny checkpoints is in test_gate_ladder.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf

from audio8_coreai.errors import GateError
from audio8_coreai.measure.gate import (
    ESPEAK_VOICES,
    count_errors,
    espeak_clip,
    gumbel_margin,
    load_fixtures,
    log_mel,
    mel_filterbank,
    normalise_text,
)
from audio8_coreai.sampling_reference import np_processed_scores
from tests.clips import needs_espeak

# Five espeak-ng en-us sentences through pocketsphinx: measured WER 34/54 = 0.63 (silence or noise scores 1.0).
ASR_SENTENCES = [
    "The meeting has been moved to Thursday afternoon, so please update your calendars.",
    "Our train leaves from platform nine in about fifteen minutes.",
    "Please call me tomorrow morning.",
    "A small change in the recipe made the soup taste far richer than before.",
    "The library extends its opening hours during the exam period in December.",
]
ESPEAK_WER_BOUND = 0.75


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
