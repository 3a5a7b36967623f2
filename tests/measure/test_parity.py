"""The port against the publisher's recordings (tests/oracle): logits, draws, free runs, codec."""

from __future__ import annotations

import json

import pytest

from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.errors import ParityError
from audio8_coreai.measure.parity import run_parity

# Steps the publisher ran per scenario, and the frames it emitted (oracle meta.json).
EXPECTED = {"plain": (18, 17, True), "greedy": (7, 6, True), "clone": (24, 24, False)}


@pytest.fixture(scope="module")
def fp32_report(oracle_dir):
    backend = TorchBackend(load_checkpoint(oracle_dir), "cpu", "fp32")
    return run_parity(backend, oracle_dir / "fixture.npz")


def test_fp32_parity_passes(fp32_report):
    assert fp32_report.passed
    assert [s.name for s in fp32_report.scenarios] == ["plain", "greedy", "clone", "batch"]


@pytest.mark.parametrize("name", ["plain", "greedy", "clone", "batch"])
def test_teacher_forced_logits_and_draws(fp32_report, name):
    s = next(s for s in fp32_report.scenarios if s.name == name)
    assert s.slow_logits_max_diff < 1e-4
    assert s.fast_logits_max_diff < 1e-4
    items = 2 if name == "batch" else 1
    assert s.slow_argmax == (s.steps * items, s.steps * items)
    assert s.semantic_draws == (s.steps * items, s.steps * items)
    assert s.codebook_draws == (9 * s.steps * items, 9 * s.steps * items)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_free_run_reproduces_codes_and_eos(fp32_report, name):
    steps, frames, eos = EXPECTED[name]
    s = next(s for s in fp32_report.scenarios if s.name == name)
    assert s.steps == steps
    assert s.free_run_identical
    assert (s.free_run_frames, s.free_run_eos) == (frames, eos)


def test_codec_waveform_and_intermediates(fp32_report):
    names = [c.name for c in fp32_report.codec]
    assert names == ["plain[0]", "greedy[0]", "batch[0]", "batch[1]", "clone[0]", "codec_clamp[0]"]
    for c in fp32_report.codec:
        assert c.waveform_max_diff < 1e-4, c.name
        assert set(c.intermediates_max_diff) == {"post_in", "post_out", "upsample_out"}
        assert max(c.intermediates_max_diff.values()) < 1e-4, c.name


def test_bf16_agreement_floor(oracle_bf16_dir):
    """bf16 runs differ in rounding, so agreement is counted: measured 47/47 semantic, 420/423 codebook."""
    backend = TorchBackend(load_checkpoint(oracle_bf16_dir), "cpu", "bf16")
    report = run_parity(backend, oracle_bf16_dir / "fixture.npz", tolerance=0.25)
    totals = report.totals()
    sem_ok, sem_n = totals["semantic_draws"]
    cb_ok, cb_n = totals["codebook_draws"]
    assert sem_n == 47 and cb_n == 423
    assert sem_ok / sem_n >= 0.985
    assert cb_ok / cb_n >= 0.975
    assert all(s.slow_logits_max_diff < 0.25 for s in report.scenarios)


def test_fixture_of_another_checkpoint_is_refused(oracle_dir, tmp_path):
    from audio8_coreai.checkpoint import make_checkpoint

    other = make_checkpoint(tmp_path / "ck", "tiny", seed=5)
    backend = TorchBackend(load_checkpoint(other), "cpu", "fp32")
    # Same sizes as the oracle but other weights: parity runs and fails, it does not crash.
    assert not run_parity(backend, oracle_dir / "fixture.npz").passed
    with pytest.raises(ParityError, match="fixture not found"):
        run_parity(backend, tmp_path / "missing.npz")


def test_codec_encoder_reproduces_the_reference_codes(fp32_report):
    [enc] = fp32_report.encoder
    assert enc.name == "clone[0]"
    assert enc.codes_equal == (110, 110)  # 10 codebooks x 11 frames
    assert enc.latent_max_diff < 1e-5
    said = json.loads(fp32_report.to_json())
    assert said["encoder"][0]["name"] == "clone[0]" and said["passed"] is True
    assert [s["scenario"] for s in said["scenarios"]] == [s.key for s in fp32_report.scenarios]  # none null
    assert None not in [s["scenario"] for s in said["scenarios"]]


def test_a_bf16_recording_replayed_at_fp32_says_how_it_was_recorded(oracle_bf16_dir):
    """fp32 parity against a bf16 recording fails; the note says why and what to run instead."""
    from tests.cli.cli_support import run

    result = run("parity", "--model", oracle_bf16_dir, "--fixture", oracle_bf16_dir / "fixture.npz")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "fp32 parity (tolerance 0.0001): FAIL" in said
    assert "recorded with the publisher's code running in bfloat16 (its meta's run_dtype)" in said
    assert "replay it with --precision bf16" in said
