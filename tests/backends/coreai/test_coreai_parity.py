"""Core AI assets against the oracle recordings: fp32 exactly, fp16 and int8-fp16 agreement floors.

The assets (converted from the tiny oracle checkpoint, run by the coreai.runtime CPU interpreter) and how they
are made: coreai_support.py; the fixtures: conftest.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil

import numpy as np
import pytest
import torch

from tests.backends.coreai.coreai_support import TEXT, _params, coreai_missing

pytest.importorskip("coreai.runtime", reason=coreai_missing())

from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.coreai import CoreAIBackend, read_manifest
from audio8_coreai.config import SamplingParams
from audio8_coreai.engine.loop import generate
from audio8_coreai.errors import BackendError
from audio8_coreai.measure.oracle import load_fixture
from audio8_coreai.measure.parity import replay_codec, replay_encoder, replay_forced, replay_single
from tests.cli.cli_support import run as _run


def _parity_report(oracle_dir, assets) -> dict:
    """``audio8 parity --backend coreai --json`` of ``assets`` against the oracle's fixture; exits 0."""
    result = _run(
        "parity", "--model", oracle_dir, "--fixture", oracle_dir / "fixture.npz", "--backend", "coreai",
        "--assets", assets, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------------------------------
# fp32: the oracle exactly


def test_fp32_assets_reproduce_the_oracle(fp32_assets, oracle_dir):
    """Through ``audio8 parity --backend coreai`` (which runs :func:`run_parity`): teacher-forced logits and
    every draw, free runs frame for frame with eos at the same step, the codec's waveforms, the encoder's codes."""
    report = _parity_report(oracle_dir, fp32_assets)
    assert report["passed"] and report["backend"].startswith("coreai fp32")
    # The batch's items alone, each up to its eos: item 0 runs to the 24-frame cap, item 1 stops after 3 frames.
    assert [(s["name"], s["steps"]) for s in report["scenarios"]] == [
        ("plain", 18),
        ("clone", 24),
        ("batch[0]", 24),
        ("batch[1]", 4),
    ]
    for s in report["scenarios"]:
        assert s["slow_logits_max_diff"] < 1e-4 and s["fast_logits_max_diff"] < 1e-4
        assert s["semantic_draws"] == [s["steps"]] * 2 and s["codebook_draws"] == [9 * s["steps"]] * 2
        assert s["free_run_identical"]
    assert [s["free_run_eos"] for s in report["scenarios"]] == [True, False, False, True]
    assert [c["name"] for c in report["codec"]] == [
        "plain[0]",
        "greedy[0]",
        "batch[0]",
        "batch[1]",
        "clone[0]",
        "codec_clamp[0]",
    ]
    assert all(c["waveform_max_diff"] < 1e-4 for c in report["codec"])
    assert [(e["codes_equal"], e["latent_max_diff"]) for e in report["encoder"]] == [([110, 110], None)]
    # greedy is not the baked sampling: it replays on greedy assets (test_greedy_assets_replay_the_greedy_scenario).
    (skipped,) = report["skipped"]
    assert skipped.startswith("greedy: it draws greedy (argmax); the backend's graphs bake in T 0.7 top-k 50")
    assert skipped.endswith("audio8 convert --greedy)")


def test_greedy_assets_replay_the_greedy_scenario(
    oracle, oracle_dir, fixture, fp32_assets, child_conversions, tmp_path
):
    """``audio8 convert --greedy`` bakes do_sample false into the frame graphs: argmax draws, which replay the
    oracle's greedy scenario (teacher-forced and free run); the sampled scenarios are then the skipped ones."""
    assets = tmp_path / "greedy"
    shutil.copytree(child_conversions.folder("greedy"), assets)
    for part in ("codec_decoder", "codec_encoder"):  # the same checkpoint's fp32 codec: only the DualAR differs
        shutil.copytree(fp32_assets / f"{part}.aimodel", assets / f"{part}.aimodel")
    assert read_manifest(assets / "dualar.aimodel")["sampling"]["do_sample"] is False
    backend = CoreAIBackend(oracle, assets)
    try:  # speech samples: greedy assets are parity's alone, and said so
        backend.prefill(fixture["plain__prompt_input_ids"][0])
        step = StepInputs(None, 0, np.full((2, 257), 0.5, np.float32), np.full(10, -1), np.full((9, 256), 0.5))
        with pytest.raises(BackendError, match="converted with --greedy .*convert without --greedy"):
            backend.frame(SamplingParams(), step)
    finally:
        backend.close()
    report = _parity_report(oracle_dir, assets)
    assert report["passed"]
    (greedy,) = report["scenarios"]
    assert greedy["name"] == "greedy" and greedy["steps"] == 7
    assert greedy["slow_logits_max_diff"] < 1e-4 and greedy["fast_logits_max_diff"] < 1e-4
    assert greedy["semantic_draws"] == [7, 7] and greedy["codebook_draws"] == [63, 63]
    assert greedy["free_run_identical"] and greedy["free_run_frames"] == 6 and greedy["free_run_eos"]
    assert [r.split(":")[0] for r in report["skipped"]] == ["plain", "clone", "batch"]
    assert all("it draws T 0.7" in r and "bake in greedy (argmax)" in r for r in report["skipped"])


def test_batch_items_replay_alone_on_torch_too(torch_backend, oracle_dir):
    """The per-item batch replay the Core AI backend uses is exact on the torch backend as well: each item's
    unpadded prompt at batch 1 gives the batch's logits and draws (the pads were hidden from every query)."""
    fx, meta = load_fixture(oracle_dir / "fixture.npz")
    for item, steps, frames in ((0, 24, 24), (1, 4, 3)):
        rep = replay_single(torch_backend, fx, meta, "batch", item)
        assert (rep.name, rep.key, rep.steps) == (f"batch[{item}]", "batch", steps)
        assert rep.slow_logits_max_diff < 1e-4 and rep.fast_logits_max_diff < 1e-4
        assert rep.semantic_draws == (steps, steps) and rep.codebook_draws == (9 * steps, 9 * steps)
        assert rep.free_run_identical and rep.free_run_frames == frames and not rep.misses


def test_gate_on_the_coreai_backend(oracle_dir, speakable, fp32_assets, tmp_path):
    """``audio8 gate --backend coreai``: against the fp32 torch run of a fixtures file (the reference draws with
    the assets' baked sampling), and against the oracle, the tensor rungs over every scenario the assets
    replay (the batch's items one by one); exact for fp32."""
    pytest.importorskip("matplotlib")
    fixtures = tmp_path / "fixtures.json"
    fixtures.write_text(json.dumps([{"name": "en_a", "language": "en", "seed": 3, "text": TEXT, "reference": None}]))
    result = _run(
        "gate",
        "--model",
        speakable,
        "--backend",
        "coreai",
        "--assets",
        fp32_assets,
        "--fixtures",
        fixtures,
        "--max-frames",
        6,
        "--out",
        tmp_path / "fp32",
    )
    assert result.exit_code == 0, result.output
    (en,) = json.loads((tmp_path / "fp32" / "report.json").read_text())["fixtures"]
    assert en["teacher_forced"]["semantic_draws"] == [6, 6] and en["teacher_forced"]["free_run_prefix"] == 6
    assert en["codec"]["waveform_max_diff"] < 1e-4
    out = tmp_path / "report"
    result = _run(
        "gate",
        "--model",
        oracle_dir,
        "--against",
        oracle_dir / "fixture.npz",
        "--backend",
        "coreai",
        "--assets",
        fp32_assets,
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and report["verdicts"]["tensor"] == "pass" and report["verdicts"]["eos"] == "pass"
    assert [f["name"] for f in report["fixtures"]] == ["plain", "clone", "batch[0]", "batch[1]"]
    assert report["totals"]["semantic_draws"] == [70, 70] and report["totals"]["codebook_draws"] == [630, 630]
    assert report["totals"]["free_run_identical"] == [4, 4]
    assert [s.split(":")[0] for s in report["skipped"][:1]] == ["greedy"]
    assert sorted(p.name for p in (out / "pictures").iterdir()) == ["clone.png", "plain.png"]


def test_one_runtime_call_per_frame(fp32_backend, oracle, fixture):
    prompt = fixture["clone__prompt_input_ids"][0]  # 57 columns: two prefill windows
    before = fp32_backend.calls
    gen = generate(fp32_backend, prompt, _params(oracle), seed=11, max_frames=20)
    steps = gen.frames + gen.reached_eos  # the eos step is a call that emits no frame
    assert fp32_backend.calls - before == 2 + steps


def test_manifest_holds_contract_sampling_and_source(fp32_assets, oracle):
    cfg = oracle.config
    dualar = read_manifest(fp32_assets / "dualar.aimodel")
    assert dualar["precision"] == "fp32" and dualar["context"] == 128
    assert dualar["sampling"] == {
        "temperature": 0.7,
        "top_k": 50,
        "top_p": 0.9,
        "do_sample": True,
        "ras_temperature": 1.0,
        "ras_top_p": 0.9,
    }
    frame = dualar["contract"]["frame"]
    v = cfg.num_semantic + 1
    assert frame["inputs"] == {
        "codes": {"shape": [1, 11, 1], "dtype": "int32"},
        "pos": {"shape": [1], "dtype": "int32"},
        "noise_slow": {"shape": [2, v], "dtype": "float32"},
        "window": {"shape": [10], "dtype": "int32"},
        "noise_fast": {"shape": [9, cfg.codebook_size], "dtype": "float32"},
        "forced": {"shape": [11], "dtype": "int32"},
        "use_forced": {"shape": [1], "dtype": "float32"},
    }
    assert {k: s["shape"] for k, s in frame["outputs"].items()} == {
        "semantic": [1],
        "codes": [10],
        "logits": [v],
        "hidden": [cfg.dim],
        "fast_logits": [9, cfg.codebook_size],
        "sampled_semantic": [1],
        "sampled_codes": [10],
    }
    state = [cfg.n_layer, 1, cfg.n_local_heads, 128, cfg.head_dim]
    for fn in ("prefill", "frame"):
        assert dualar["contract"][fn]["states"] == {
            n: {"shape": state, "dtype": "float32"} for n in ("k_cache", "v_cache")
        }
    assert dualar["contract"]["first_frame"]["states"] == {}
    assert dualar["contract"]["prefill"]["outputs"]["logits"]["shape"] == [32, v]
    sha = hashlib.sha256(oracle.model_file.read_bytes()).hexdigest()
    assert dualar["source"]["sha256"]["model.safetensors"] == sha
    assert dualar["source"]["fingerprint"] == oracle.fingerprint()
    assert dualar["source"]["name"] == oracle.path.name and str(oracle.path.parent) not in json.dumps(dualar)
    decoder = read_manifest(fp32_assets / "codec_decoder.aimodel")
    assert decoder["push"] == 16 and decoder["max_frames"] == 512  # the checkpoint's max_seq_len
    assert decoder["pushes"] == {"main": 16, "first": 1} and list(decoder["contract"]) == ["main", "first"]
    first = decoder["contract"]["first"]
    assert first["inputs"]["codes"] == {"shape": [1, 10, 1], "dtype": "int32"}
    assert first["outputs"] == {"wav": {"shape": [1, 2048], "dtype": "float32"}}
    assert first["states"] == decoder["contract"]["main"]["states"]
    main = decoder["contract"]["main"]
    assert main["inputs"] == {
        "codes": {"shape": [1, 10, 16], "dtype": "int32"},
        "start": {"shape": [1], "dtype": "int32"},
        "count": {"shape": [1], "dtype": "int32"},
    }
    assert main["outputs"] == {"wav": {"shape": [1, 16 * 2048], "dtype": "float32"}}
    states = main["states"]
    # The tiny codec: 1 post_module layer (2 heads of 64), 2 ConvNeXt and 4 SEANet blocks of causal convolutions.
    assert list(states)[:3] == ["post_module_0_keys", "post_module_0_values", "quantizer_upsample_0_1_dwconv"]
    assert len(states) == 22 and list(decoder["state"]) == list(states)
    assert states["post_module_0_keys"] == {"shape": [1, 2, 127, 64], "dtype": "float32"}
    assert states["decoder_model_1_block_1"] == {"shape": [1, 128, 1], "dtype": "float32"}  # ConvTranspose s8
    assert states["decoder_model_4_block_4_block_1"] == {"shape": [1, 8, 54], "dtype": "float32"}  # k7 d9
    encoder = read_manifest(fp32_assets / "codec_encoder.aimodel")
    assert encoder["contract"]["main"]["inputs"]["audio"] == {"shape": [1, 1, 16 * 2048], "dtype": "float32"}


# ---------------------------------------------------------------------------------------------------
# fp16 and int8-fp16: agreement counts against stated floors


def _agreement(oracle, assets, fixture_path, codec: bool):
    """(semantic draws, codebook draws, min slow-logits cos, min fast-logits cos, codec cos) over the plain and
    clone scenarios, teacher-forced on the oracle's columns (42 steps), and the two 6-frame codec recordings."""
    backend = CoreAIBackend(oracle, assets)
    fx, meta = load_fixture(fixture_path)
    reports = [replay_forced(backend, fx, meta, sc) for sc in ("plain", "clone")]
    codec_cos = (
        min(c.waveform_cos for sc in ("greedy", "codec_clamp") for c in replay_codec(backend, fx, sc))
        if codec
        else None
    )
    return (
        sum(r.semantic_draws[0] for r in reports),
        sum(r.codebook_draws[0] for r in reports),
        min(r.slow_logits_min_cos for r in reports),
        min(r.fast_logits_min_cos for r in reports),
        codec_cos,
    )


def test_fp16_agreement_floors(oracle, oracle_dir, child_conversions):
    """Measured: 42/42 semantic, 377/378 codebook draws, logits cos >= 0.99999, codec cos 0.9999994."""
    assets = child_conversions.folder("fp16")
    assert read_manifest(assets / "dualar.aimodel")["precision"] == "fp16"
    sem, cb, slow_cos, fast_cos, codec_cos = _agreement(oracle, assets, oracle_dir / "fixture.npz", codec=True)
    assert sem >= 41 and cb >= 374  # of 42 and 378
    assert slow_cos > 0.9999 and fast_cos > 0.9999
    assert codec_cos > 0.99999


def test_int8_fp16_agreement_floors(oracle, oracle_dir, child_conversions):
    """int8 slow-AR linears. Measured: 41/42 semantic, 378/378 codebook draws, slow logits cos 0.99994, fast
    0.99997. The decoder is fp16's recipe (see the fp16 test). The encoder, weights stored fp16 but for the
    vector quantizers' and computed fp32, gives every code of the oracle's clip."""
    assets = child_conversions.folder("int8-fp16")
    assert read_manifest(assets / "dualar.aimodel")["precision"] == "int8-fp16"
    said = child_conversions.log.read_text()  # torchao's warnings of CUDA libraries, torch's deprecation: quiet
    assert "Failed to load" not in said and "register_constant" not in said, said[-2000:]
    sem, cb, slow_cos, fast_cos, _ = _agreement(oracle, assets, oracle_dir / "fixture.npz", codec=False)
    assert sem >= 40 and cb >= 372  # of 42 and 378
    assert slow_cos > 0.9995 and fast_cos > 0.9995
    encoder = CoreAIBackend(oracle, assets)
    try:
        assert replay_encoder(encoder, load_fixture(oracle_dir / "fixture.npz")[0]).codes_equal == (110, 110)
    finally:
        encoder.close()


def test_fp16_stored_weights_compute_in_fp32(tmp_path):
    """The int8-fp16/fp16 encoder's recipe (``store_fp16``): the asset holds float16 weights and every op computes
    in float32, so the output is torch's float32 result on the float16-rounded weights (within 1e-5; float16
    arithmetic is off by ~1e-3 here). coreai-torch folds the cast of constants under about 250,000 elements
    back into float32 ones (measured), so the conv here is a 0.6b-sized one (458,752 weights)."""
    import coreai.runtime as rt
    import coreai_torch
    from coreai.authoring import AIModelAsset

    from audio8_coreai.backends.coreai.export import export_program
    from audio8_coreai.backends.coreai.weights import store_fp16

    torch.manual_seed(0)
    conv = torch.nn.Conv1d(256, 256, 7, padding=3).eval()
    x = torch.randn(1, 256, 40)
    with torch.no_grad():
        want = torch.nn.functional.conv1d(x, conv.weight.half().float(), conv.bias.half().float(), padding=3)
    store_fp16(conv)
    assert {p.dtype for p in conv.parameters()} == {torch.float16} and conv.weight.dtype == torch.float32
    converter = coreai_torch.TorchConverter(mode=coreai_torch.TorchConverter.Mode.RELEASE)
    converter.add_exported_program(
        export_program(conv, (x,)), input_names=["x"], output_names=["y"], entrypoint_name="main"
    )
    asset = converter.to_coreai().save_asset(tmp_path / "conv.aimodel")
    stored = sum(f.stat().st_size for f in asset.path.rglob("*") if f.is_file())
    assert 2 * 256 * 256 * 7 < stored < 1.1 * 2 * 256 * 256 * 7  # float16: 0.92 MB (float32 would be 1.84 MB)

    async def run() -> np.ndarray:
        async with AIModelAsset.load(asset.path).executable() as model:
            return (await model.load_function("main")(inputs={"x": rt.NDArray(x.numpy())}))["y"].numpy().copy()

    assert np.abs(asyncio.run(run()) - want.numpy()).max() < 1e-5
