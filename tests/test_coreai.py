"""Core AI assets on Linux: converted from the tiny oracle checkpoint and run by the coreai.runtime CPU interpreter.

Conversions run once per session: fp32 with every part in this process; in a child process alongside, fp16
with the DualAR and the decoder, int8-fp16 with the DualAR and the encoder (its decoder recipe is fp16's), and a
greedy fp32 DualAR (``audio8 convert --greedy``). The buckets and contexts are small so the interpreter stays
quick: context 128 (fp32) / 96 (fp16, int8-fp16) / 64 (greedy), decoder pushes of 16 (and the opt-in 1-frame
``first``) / 8 frames, encoder 16 frames.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file

# coreai-core publishes wheels for macOS and Linux x86_64, where .ci/run installs the coreai extra (so the tests
# run there); without the extra, or elsewhere, they skip.
if sys.platform == "darwin" or (sys.platform == "linux" and platform.machine() == "x86_64"):
    pytest.importorskip("coreai.runtime", reason="the coreai extra is not installed (pip install -e '.[coreai]')")
else:
    pytest.importorskip("coreai.runtime", reason="coreai-core has no wheel for this platform")

from typer.testing import CliRunner

from audio8_coreai import TTS
from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.coreai import CoreAIBackend, convert, read_manifest
from audio8_coreai.backends.torch import TorchBackend
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.cli import app
from audio8_coreai.config import SamplingParams
from audio8_coreai.engine.loop import generate
from audio8_coreai.errors import AssetError, BackendError, EngineError, PrecisionError
from audio8_coreai.measure.oracle import load_fixture
from audio8_coreai.measure.parity import replay_codec, replay_encoder, replay_forced, replay_single

TEXT = "Hello there."  # 76 prompt columns with the tiny byte-level tokenizer: 52 frames fit a context of 128


@pytest.fixture(scope="session")
def oracle(oracle_dir):
    return load_checkpoint(oracle_dir)


class _ChildConversions:
    """fp16, int8-fp16 and greedy assets converted by a child process, started before the fp32 conversion so the
    two run side by side (conversion is mostly single-threaded Python; on 2 cores this saves the longer one's
    time). ``folder(name)`` waits for the child and returns the asset folder."""

    SCRIPT = (
        "import sys; from audio8_coreai.backends.coreai import convert; from audio8_coreai.cli import app; "
        "ckpt, out = sys.argv[1:]; "
        "convert(ckpt, out + '/fp16', 'fp16', context=96, decoder_frames=8, "
        "parts=('dualar', 'codec_decoder'), progress=False); "
        "convert(ckpt, out + '/int8-fp16', 'int8-fp16', context=96, encoder_frames=16, "
        "parts=('dualar', 'codec_encoder'), progress=False); "
        "app(['convert', '--model', ckpt, '--out', out + '/greedy', '--greedy', '--context', '64', "
        "'--part', 'dualar'], standalone_mode=False)"
    )

    def __init__(self, checkpoint: Path, out: Path):
        self.out = out
        self.log = out / "convert.log"
        with self.log.open("w") as log:
            self.child = subprocess.Popen(
                [sys.executable, "-c", self.SCRIPT, str(checkpoint), str(out)], stdout=log, stderr=subprocess.STDOUT
            )

    def folder(self, name: str) -> Path:
        if self.child.wait(timeout=900) != 0:
            pytest.fail(f"converting the fp16/int8-fp16/greedy assets failed:\n{self.log.read_text()[-3000:]}")
        return self.out / name

    def stop(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()


@pytest.fixture(scope="session")
def child_conversions(oracle_dir, tmp_path_factory):
    conversions = _ChildConversions(oracle_dir, tmp_path_factory.mktemp("coreai_child"))
    yield conversions
    conversions.stop()


@pytest.fixture(scope="session")
def fp32_assets(oracle, tmp_path_factory, child_conversions):
    return convert(
        oracle,
        tmp_path_factory.mktemp("coreai") / "fp32",
        "fp32",
        context=128,
        decoder_frames=16,
        decoder_first_frames=1,
        encoder_frames=16,
        progress=False,
    )


@pytest.fixture(scope="session")
def fp32_backend(oracle, fp32_assets):
    return CoreAIBackend(oracle, fp32_assets)


@pytest.fixture(scope="session")
def torch_backend(oracle):
    return TorchBackend(oracle, "cpu", "fp32")


@pytest.fixture(scope="session")
def speakable(oracle_dir, tiny_checkpoint, tmp_path_factory):
    """The oracle's weights with the tiny tokenizer beside them (the tokenizer is not part of the fingerprint,
    so the oracle's assets belong to this folder too): a checkpoint the TTS API and the CLI can speak with."""
    path = tmp_path_factory.mktemp("speakable") / "tiny"
    path.mkdir()
    for f in oracle_dir.iterdir():
        if f.name not in ("fixture.npz", "meta.json"):
            shutil.copy(f, path / f.name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_checkpoint / name, path / name)
    return path


def _params(ckpt) -> SamplingParams:
    return SamplingParams.from_configs(ckpt.config, ckpt.generation)


runner = CliRunner()


def _run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def _said(result) -> str:
    """The command's output with its line wrapping undone (rich wraps at the terminal width, so where a
    message breaks depends on the length of the paths in it)."""
    return " ".join(result.output.split())


# ---------------------------------------------------------------------------------------------------
# fp32: the oracle exactly


def test_fp32_assets_reproduce_the_oracle(fp32_assets, oracle_dir):
    """Through ``audio8 parity --backend coreai`` (which runs :func:`run_parity`): teacher-forced logits and
    every draw, free runs frame for frame with eos at the same step, the codec's waveforms, the encoder's codes."""
    result = _run(
        "parity",
        "--model",
        oracle_dir,
        "--fixture",
        oracle_dir / "fixture.npz",
        "--backend",
        "coreai",
        "--assets",
        fp32_assets,
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
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


def test_greedy_assets_replay_the_greedy_scenario(oracle_dir, fp32_assets, child_conversions, tmp_path):
    """``audio8 convert --greedy`` bakes do_sample false into the frame graphs: argmax draws, which replay the
    oracle's greedy scenario (teacher-forced and free run); the sampled scenarios are then the skipped ones."""
    assets = tmp_path / "greedy"
    shutil.copytree(child_conversions.folder("greedy"), assets)
    for part in ("codec_decoder", "codec_encoder"):  # the same checkpoint's fp32 codec: only the DualAR differs
        shutil.copytree(fp32_assets / f"{part}.aimodel", assets / f"{part}.aimodel")
    assert read_manifest(assets / "dualar.aimodel")["sampling"]["do_sample"] is False
    result = _run(
        "parity",
        "--model",
        oracle_dir,
        "--fixture",
        oracle_dir / "fixture.npz",
        "--backend",
        "coreai",
        "--assets",
        assets,
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
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


# ---------------------------------------------------------------------------------------------------
# Backends, state, codec


def test_torch_and_coreai_agree_on_the_same_seed(fp32_backend, torch_backend, oracle, fixture):
    prompt = fixture["plain__prompt_input_ids"][0]
    for seed in (3, 4):
        a = generate(torch_backend, prompt, _params(oracle), seed=seed, max_frames=24)
        b = generate(fp32_backend, prompt, _params(oracle), seed=seed, max_frames=24)
        assert np.array_equal(a.codes, b.codes) and a.reached_eos == b.reached_eos
    wave_torch, wave_coreai = torch_backend.decode_window(a.codes), fp32_backend.decode_window(b.codes)
    assert wave_coreai.shape == wave_torch.shape and np.abs(wave_coreai - wave_torch).max() < 1e-4


def test_back_to_back_recordings_replay_exactly(fp32_backend, oracle_dir):
    """The plain recording (24 prompt columns + 18 steps) replays exactly, teacher-forced and free-running on its
    recorded noise, right after the clone recording (57 + 24 steps) left state up to position 81 past it; the
    parity run (test_fp32_assets_reproduce_the_oracle) covers the other order."""
    fx, meta = load_fixture(oracle_dir / "fixture.npz")
    clone = replay_forced(fp32_backend, fx, meta, "clone")
    assert clone.steps == 24 and clone.semantic_draws == (24, 24) and not clone.misses
    plain = replay_single(fp32_backend, fx, meta, "plain")
    assert plain.steps == 18 and plain.slow_logits_max_diff < 1e-4 and plain.fast_logits_max_diff < 1e-4
    assert plain.semantic_draws == (18, 18) and plain.codebook_draws == (9 * 18, 9 * 18) and not plain.misses
    assert plain.free_run_identical and plain.free_run_eos


def test_calls_from_inside_a_running_event_loop(fp32_backend, oracle, fp32_assets, fixture):
    """An async caller (a web handler, a notebook) can use the backend directly: its runtime calls run on a
    loop of its own thread, so a running loop in the caller's thread is no obstacle."""
    prompt = fixture["plain__prompt_input_ids"][0]
    want = generate(fp32_backend, prompt, _params(oracle), seed=8, max_frames=10).codes

    async def speak() -> tuple[np.ndarray, np.ndarray]:
        fresh = CoreAIBackend(oracle, fp32_assets)  # loaded inside the running loop too
        try:
            return (
                generate(fp32_backend, prompt, _params(oracle), seed=8, max_frames=10).codes,
                generate(fresh, prompt, _params(oracle), seed=8, max_frames=10).codes,
            )
        finally:
            fresh.close()

    got, fresh_codes = asyncio.run(speak())
    assert want.shape[1] > 0 and np.array_equal(got, want) and np.array_equal(fresh_codes, want)


LONG = 320  # frames of the long stream (20 pushes): the codec transformer's 128-frame window passed twice over
PUSH_INPUTS = {"codes": (1, 10, 16), "start": (1,), "count": (1,)}  # a decoder call's input shapes: main
FIRST_INPUTS = {**PUSH_INPUTS, "codes": (1, 10, 1)}  # and first (a push of 1 frame)


@pytest.fixture
def decoder_calls(fp32_backend, monkeypatch) -> list[dict[str, tuple[int, ...]]]:
    """The input shapes of every runtime call ``fp32_backend`` makes during the test, in order."""
    shapes: list[dict[str, tuple[int, ...]]] = []
    call = fp32_backend._call

    def recorded(fn, inputs, state=None):
        shapes.append({k: v.shape for k, v in inputs.items()})
        return call(fn, inputs, state)

    monkeypatch.setattr(fp32_backend, "_call", recorded)
    return shapes


def test_codec_stream_decodes_every_frame_once_exactly(fp32_backend, torch_backend, decoder_calls):
    """The stateful decoder asset streams a 320-frame utterance in 16-frame pushes: each push is one runtime
    call of the same shapes (a late push costs what an early one does), and its audio equals the torch
    incremental decoder's and the whole-utterance decode's for those frames within 1e-4."""
    codes = np.random.default_rng(0).integers(0, 256, size=(10, LONG))
    with torch.no_grad():
        whole = torch_backend.decoder(torch.as_tensor(codes)[None])[0].numpy()
    stream, torch_stream = fp32_backend.codec_stream(), torch_backend.codec_stream()
    for first in range(0, LONG, 16):
        got = stream.push(codes[:, first : first + 16])
        assert len(decoder_calls) == first // 16 + 1 and got.shape == (16 * 2048,)
        assert np.abs(got - torch_stream.push(codes[:, first : first + 16])).max() < 1e-4
        assert np.abs(got - whole[first * 2048 : (first + 16) * 2048]).max() < 1e-4
    assert decoder_calls == [PUSH_INPUTS] * (LONG // 16)
    assert (stream.frames, stream.decoded) == (LONG, LONG)  # every frame decoded once: 1.0 per frame of audio


def test_codec_stream_pads_short_pushes_and_splits_long_ones(fp32_backend, torch_backend, decoder_calls):
    """A push of 1 frame (a stream's first chunk) is one call of the asset's 1-frame function ``first``; pushes of
    2, 4, 8 frames and a last partial one are padded inside the fixed 16-frame shape (one call each), a 20-frame
    push is two calls; the two functions carry one state, and each push's audio is exact (1e-4). An utterance
    past the asset's 512 frames is refused; nothing to decode is no call."""
    codes = np.random.default_rng(1).integers(0, 256, size=(10, 40))
    with torch.no_grad():
        whole = torch_backend.decoder(torch.as_tensor(codes)[None])[0].numpy()
    stream, torch_stream = fp32_backend.codec_stream(), torch_backend.codec_stream()
    first = 0
    for n, runtime_calls in ((1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (20, 2), (3, 1), (1, 1)):
        calls = len(decoder_calls)
        got = stream.push(codes[:, first : first + n])
        assert len(decoder_calls) - calls == runtime_calls and got.shape == (n * 2048,)
        assert np.abs(got - torch_stream.push(codes[:, first : first + n])).max() < 1e-4
        assert np.abs(got - whole[first * 2048 : (first + n) * 2048]).max() < 1e-4
        first += n
    assert decoder_calls == [FIRST_INPUTS] * 2 + [PUSH_INPUTS] * 6 + [FIRST_INPUTS]
    assert (stream.frames, stream.decoded) == (40, 1 + 1 + 16 * 6 + 1)  # the padding of 2-, 4-, 8-, 3-frame pushes
    with pytest.raises(BackendError, match="up to 512 frames per utterance"):
        fp32_backend.codec_stream().push(np.zeros((10, 513), np.int64))
    assert fp32_backend.decode_window(np.zeros((10, 0), np.int64)).shape == (0,) and len(decoder_calls) == 9


def test_transposed_convolutions_on_the_cpu_runtime(tmp_path):
    """ConvTranspose1d at the codec decoder's (kernel 16, stride 8) and its other strides is numerically wrong
    on Apple's cpu_only delegate (PORT-NOTES section 7); on this runtime it must equal torch."""
    import coreai.runtime as rt
    import coreai_torch
    from coreai.authoring import AIModelAsset

    from audio8_coreai.backends.coreai.export import export_program

    torch.manual_seed(0)
    layers = {f"k{2 * s}s{s}": torch.nn.ConvTranspose1d(48, 24, 2 * s, stride=s).eval() for s in (8, 4, 2)}
    x = torch.randn(1, 48, 40)
    converter = coreai_torch.TorchConverter()
    for name, layer in layers.items():
        converter.add_exported_program(
            export_program(layer, (x,)), input_names=["x"], output_names=["y"], entrypoint_name=name
        )
    asset = converter.to_coreai().save_asset(tmp_path / "convt.aimodel")

    async def run() -> dict[str, np.ndarray]:
        async with AIModelAsset.load(asset.path).executable() as model:
            return {
                name: (await model.load_function(name)(inputs={"x": rt.NDArray(x.numpy())}))["y"].numpy().copy()
                for name in layers
            }

    got = asyncio.run(run())
    for name, layer in layers.items():
        with torch.no_grad():
            want = layer(x).numpy()
        assert got[name].shape == want.shape
        assert np.abs(got[name] - want).max() < 1e-5, name


# ---------------------------------------------------------------------------------------------------
# Bad input


def test_missing_or_incomplete_asset_folder(oracle, fp32_assets, tmp_path):
    with pytest.raises(AssetError, match="no Core AI asset folder .*audio8 convert"):
        CoreAIBackend(oracle, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssetError, match="no dualar.aimodel"):
        CoreAIBackend(oracle, tmp_path / "empty")
    with pytest.raises(AssetError, match="no dualar.aimodel.*--out NEW_DIR, then --assets NEW_DIR"):
        CoreAIBackend(oracle, oracle.path)  # a checkpoint folder given as the assets
    partial = tmp_path / "partial"
    shutil.copytree(fp32_assets, partial)
    shutil.rmtree(partial / "codec_encoder.aimodel")
    backend = CoreAIBackend(oracle, partial)  # frames and the decoder still work
    try:
        with pytest.raises(AssetError, match="no codec_encoder.aimodel"):
            backend.encode(np.zeros(4096, np.float32))
    finally:
        backend.close()


def test_stale_asset_is_refused(oracle, fp32_assets, tmp_path):
    from coreai.authoring import AIModelAsset

    stale = tmp_path / "stale"
    shutil.copytree(fp32_assets, stale)

    def older(meta):  # format 1: the stateless decoder, whose manifest had no push size or state layout
        manifest = json.loads(meta.creator_defined_metadata["audio8"])
        kept = {k: v for k, v in manifest.items() if k not in ("push", "max_frames", "state")}
        meta.set_custom("audio8", json.dumps({**kept, "format": 1}))

    AIModelAsset.load(stale / "codec_decoder.aimodel").update_metadata(older)
    backend = CoreAIBackend(oracle, stale)
    try:  # refused when the codec is first used, naming the command that rebuilds the folder
        with pytest.raises(AssetError, match="codec_decoder.aimodel: stale asset") as refused:
            backend.codec_stream()
        assert f"audio8 convert --model DIR --out {stale}" in str(refused.value)
    finally:
        backend.close()
    AIModelAsset.load(stale / "dualar.aimodel").update_metadata(older)
    with pytest.raises(AssetError, match="stale asset .*format 1.*convert the checkpoint again"):
        CoreAIBackend(oracle, stale)


def test_assets_of_another_checkpoint_are_refused(tiny_checkpoint, oracle_dir, fp32_assets, tmp_path):
    with pytest.raises(AssetError, match="converted from another checkpoint"):
        CoreAIBackend(load_checkpoint(tiny_checkpoint), fp32_assets)
    # Same config, sizes and names, other weights (a re-seeded or fine-tuned checkpoint).
    retrained = tmp_path / "retrained"
    shutil.copytree(oracle_dir, retrained)
    weights = load_file(retrained / "model.safetensors")
    save_file(
        {k: v + 0.01 if v.is_floating_point() else v for k, v in weights.items()}, retrained / "model.safetensors"
    )
    with pytest.raises(AssetError, match="converted from another checkpoint"):
        CoreAIBackend(load_checkpoint(retrained), fp32_assets)


def test_prompt_longer_than_the_context(fp32_backend, oracle, speakable, fp32_assets):
    with pytest.raises(BackendError, match="context of 128"):
        fp32_backend.prefill(np.zeros((11, 130), dtype=np.int64))
    tts = TTS.load(speakable, backend="coreai", assets=fp32_assets)
    assert tts.config.max_seq_len == 128
    with pytest.raises(EngineError, match="context is 128"):
        tts.generate("word " * 60, seed=0)


def test_sampling_other_than_the_baked_one_is_refused(fp32_backend, oracle, fixture):
    fp32_backend.prefill(fixture["plain__prompt_input_ids"][0])
    other = SamplingParams(temperature=0.9)
    with pytest.raises(BackendError, match="baked into the frame graphs"):
        fp32_backend.frame(
            other, StepInputs(None, 0, np.full((2, 257), 0.5, np.float32), np.full(10, -1), np.full((9, 256), 0.5))
        )


def test_convert_refuses_bad_arguments(oracle, fp32_assets, tmp_path):
    with pytest.raises(AssetError, match="not an empty folder"):
        convert(oracle, fp32_assets, progress=False)
    with pytest.raises(PrecisionError, match="unknown dtype or precision 'int4'"):
        convert(oracle, tmp_path / "a", "int4", progress=False)
    with pytest.raises(
        PrecisionError, match="precision int16 does not run on coreai: use one of fp32, fp16, int8-fp16"
    ):
        convert(oracle, tmp_path / "a", "int16", progress=False)
    with pytest.raises(AssetError, match="multiple of 32"):
        convert(oracle, tmp_path / "a", context=100, progress=False)
    with pytest.raises(AssetError, match=r"decoder first push -1 \(>= 0; 0: none\)"):
        convert(oracle, tmp_path / "a", decoder_first_frames=-1, progress=False)
    with pytest.raises(AssetError, match="unknown or no parts"):
        convert(oracle, tmp_path / "a", parts=("vocoder",), progress=False)
    assert not (tmp_path / "a").exists()


# ---------------------------------------------------------------------------------------------------
# API and command line


def test_tts_api_on_the_coreai_backend_matches_torch(speakable, fp32_assets):
    coreai_tts = TTS.load(speakable, backend="coreai", assets=fp32_assets)
    torch_tts = TTS.load(speakable, device="cpu")
    a = coreai_tts.generate(TEXT, seed=5, max_frames=20)
    b = torch_tts.generate(TEXT, seed=5, max_frames=20)
    assert np.array_equal(a.codes, b.codes) and a.frames > 0
    assert np.abs(a.audio - b.audio).max() < 1e-4
    with pytest.raises(BackendError, match="give assets=DIR"):
        TTS.load(speakable, backend="coreai")


def test_cli_say_with_coreai(speakable, fp32_assets, tmp_path):
    out = tmp_path / "speech.wav"
    result = _run(
        "say",
        TEXT,
        "-o",
        out,
        "--model",
        speakable,
        "--seed",
        5,
        "--max-frames",
        20,
        "--backend",
        "coreai",
        "--assets",
        fp32_assets,
    )
    assert result.exit_code == 0, result.output
    from audio8_coreai.engine.stream import PAUSE_S

    said = _said(result)
    frames = int(re.search(r"(\d+)\s+frames", said).group(1))
    pieces = re.search(r"in (\d+) piece", said)  # the assets' short context may split TEXT into sentences
    pauses = (int(pieces.group(1)) - 1) * round(PAUSE_S * 44100) if pieces else 0
    assert sf.read(out)[0].shape == (frames * 2048 + pauses,) and "coreai fp32" in said
    result = _run("say", TEXT, "-o", out, "--model", speakable, "--backend", "coreai", "--assets", tmp_path / "no")
    assert result.exit_code == 2 and "no Core AI asset folder" in _said(result)


def test_cli_convert_one_part(oracle_dir, tmp_path):
    result = _run(
        "convert",
        "--model",
        oracle_dir,
        "--out",
        tmp_path / "dec",
        "--precision",
        "fp16",
        "--decoder-frames",
        4,
        "--part",
        "codec_decoder",
    )
    assert result.exit_code == 0, result.output
    assert "codec_decoder.aimodel" in _said(result)
    assert [p.name for p in (tmp_path / "dec").iterdir()] == ["codec_decoder.aimodel"]
    decoder = read_manifest(tmp_path / "dec" / "codec_decoder.aimodel")
    assert decoder["precision"] == "fp16" and decoder["pushes"] == {"main": 4} and list(decoder["contract"]) == ["main"]
    result = _run("convert", "--model", oracle_dir, "--out", tmp_path / "dec")
    assert result.exit_code == 2 and "not an empty folder" in _said(result)
