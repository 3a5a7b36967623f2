"""The Core AI backend refusing bad input: asset folders missing, incomplete, damaged, stale or of another
checkpoint; prompts and sampling the assets cannot run; conversion arguments.

The assets (converted from the tiny oracle checkpoint, run by the coreai.runtime CPU interpreter) and how they
are made: coreai_support.py; the fixtures: conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

from tests.backends.coreai.coreai_support import coreai_missing

pytest.importorskip("coreai.runtime", reason=coreai_missing())

from audio8_coreai import TTS
from audio8_coreai.backends.base import StepInputs
from audio8_coreai.backends.coreai import PARTS, CoreAIBackend, convert
from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.config import SamplingParams
from audio8_coreai.errors import AssetError, BackendError, CheckpointError, EngineError, PrecisionError
from audio8_coreai.request import check_request


def test_missing_or_incomplete_asset_folder(oracle, fp32_assets, tmp_path):
    with pytest.raises(AssetError, match="no Core AI asset folder .*audio8 convert"):
        CoreAIBackend(oracle, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AssetError, match="no dualar.aimodel"):
        CoreAIBackend(oracle, tmp_path / "empty")
    with pytest.raises(AssetError, match="no dualar.aimodel.*--out NEW, then --assets NEW"):
        CoreAIBackend(oracle, oracle.path)  # a checkpoint folder given as the assets
    one_part = re.escape(
        f"dualar.aimodel is one asset, not an asset folder: give the folder that holds it, --assets {fp32_assets}"
    )
    with pytest.raises(AssetError, match=one_part):
        CoreAIBackend(oracle, fp32_assets / "dualar.aimodel")
    (tmp_path / "voice.aimodel").symlink_to(fp32_assets)  # an asset folder may be named so too
    CoreAIBackend(oracle, tmp_path / "voice.aimodel").close()
    partial = tmp_path / "partial"
    shutil.copytree(fp32_assets, partial)
    shutil.rmtree(partial / "codec_encoder.aimodel")
    backend = CoreAIBackend(oracle, partial)  # frames and the decoder still work
    try:
        complete = f"no codec_encoder.aimodel; .* convert that part into it, .*--out {partial} --part codec_encoder"
        with pytest.raises(AssetError, match=complete):
            backend.encode(np.zeros(4096, np.float32))
    finally:
        backend.close()


@pytest.mark.parametrize("fault", ["no decoder", "cut decoder", "cut encoder", "no encoder"])
def test_a_speaker_is_refused_at_load_when_its_codec_cannot_run(speakable, fp32_assets, tmp_path, fault):
    """TTS.load (say, serve, wyoming) checks the codec parts at load: without a working decoder a folder was taken,
    the frames made, then the audio refused (a server's /health said ok). A folder without the encoder speaks."""
    folder = tmp_path / "a"
    shutil.copytree(fp32_assets, folder)
    part = folder / ("codec_decoder.aimodel" if "decoder" in fault else "codec_encoder.aimodel")
    if fault.startswith("no"):
        shutil.rmtree(part)
    else:
        os.truncate(part / "main.mlirb", 1000)
    if fault == "no encoder":
        with TTS.load(speakable, backend="coreai", assets=folder) as tts:
            assert tts.generate("Hi.", seed=0, max_frames=2).audio.size > 0
        return
    said = "no codec_decoder.aimodel" if fault == "no decoder" else f"{part / 'main.mlirb'} is damaged"
    with pytest.raises(AssetError, match=re.escape(said)):
        TTS.load(speakable, backend="coreai", assets=folder)


def test_a_damaged_or_cut_program_is_refused_before_the_runtime_reads_it(oracle, fp32_assets, tmp_path):
    """A program cut short (a half-done copy) made the runtime abort the whole process: its main.hash is checked
    first. A file given as the folder is said to be one."""
    cut = tmp_path / "cut"
    shutil.copytree(fp32_assets, cut)
    program = cut / "dualar.aimodel" / "main.mlirb"
    with program.open("r+b") as f:
        f.truncate(program.stat().st_size // 2)
    with pytest.raises(AssetError, match=r"dualar.aimodel/main.mlirb is damaged .*--out NEW, then --assets NEW"):
        CoreAIBackend(oracle, cut)
    program.unlink()
    with pytest.raises(AssetError, match=r"dualar.aimodel: no main.mlirb"):
        CoreAIBackend(oracle, cut)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(AssetError, match=r"a_file is a file, not a Core AI asset folder"):
        CoreAIBackend(oracle, tmp_path / "a_file")


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
        assert "again into a new folder: audio8 convert --model DIR --out NEW, then --assets NEW" in str(refused.value)
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
    baked = rf"temperature {fp32_backend.sampling.temperature:g}, top-k {fp32_backend.sampling.top_k}, top-p"
    said = rf"when converted \({baked} [0-9.]+\); temperature 0.9, top-k 50, top-p 0.9 was asked for: drop"
    with pytest.raises(BackendError, match=said):
        fp32_backend.frame(
            other, StepInputs(None, 0, np.full((2, 257), 0.5, np.float32), np.full(10, -1), np.full((9, 256), 0.5))
        )


def test_a_request_that_sets_no_sampling_draws_with_the_assets_own(speakable, fp32_assets, tmp_path):
    """The checkpoint's generation_config.json changed since the conversion (or the assets were converted with
    other sampling): a request that sets none speaks with what the frame graphs bake in (it was refused, told to
    drop options it never gave); one that asks for other values is still refused."""
    changed = tmp_path / "ck"
    shutil.copytree(speakable, changed)
    config = json.loads((changed / "generation_config.json").read_text())
    (changed / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.55}))
    with TTS.load(changed, backend="coreai", assets=fp32_assets) as tts:
        baked = tts.backend.sampling
        assert baked.temperature != 0.55 and tts.checkpoint.generation.temperature == 0.55
        plan = tts.plan(check_request("Hi."))
        assert (plan.params.temperature, plan.params.top_k, plan.params.top_p) == (
            baked.temperature,
            baked.top_k,
            baked.top_p,
        )
        assert tts.generate("Hi.", seed=0, max_frames=2).audio.size > 0
        with pytest.raises(BackendError, match="temperature 0.55, top-k .* was asked for"):
            tts.generate("Hi.", seed=0, max_frames=2, temperature=0.55)


def test_convert_refuses_bad_arguments(oracle, fp32_assets, tmp_path):
    whole = "already holds dualar.aimodel, codec_decoder.aimodel, codec_encoder.aimodel: remove it to convert it again"
    with pytest.raises(AssetError, match=whole + ", or choose a new folder$"):
        convert(oracle, fp32_assets, progress=False)
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(AssetError, match="a-file is a file: the assets go into a new or empty folder"):
        convert(oracle, tmp_path / "a-file", progress=False)
    with pytest.raises(PrecisionError, match="unknown precision 'int4'"):
        convert(oracle, tmp_path / "a", "int4", progress=False)
    with pytest.raises(
        PrecisionError, match="precision int16 does not run on coreai: use one of fp32, fp16, int8-fp16"
    ):
        convert(oracle, tmp_path / "a", "int16", progress=False)
    with pytest.raises(AssetError, match="multiple of 32"):
        convert(oracle, tmp_path / "a", context=100, progress=False)
    with pytest.raises(AssetError, match=r"decoder first push -1 \(>= 0; 0: none\)"):
        convert(oracle, tmp_path / "a", decoder_first_frames=-1, progress=False)
    with pytest.raises(AssetError, match=r"^the decoder's first push 16 must be below its push 16 \(0: none"):
        convert(oracle, tmp_path / "a", decoder_first_frames=16, progress=False)  # wrote no `first`, unsaid
    with pytest.raises(AssetError, match=r"decoder push 4096 must be at most the \d+ frames an utterance may hold"):
        convert(oracle, tmp_path / "a", decoder_frames=4096, progress=False)  # every push padded to 4096
    with pytest.raises(AssetError, match="unknown or no parts"):
        convert(oracle, tmp_path / "a", parts=("vocoder",), progress=False)
    with pytest.raises(AssetError, match=r"encoder bucket 10000000 frames is over the longest clip a voice takes"):
        convert(oracle, tmp_path / "a", encoder_frames=10_000_000, progress=False)  # it grew until the OOM killer
    assert not (tmp_path / "a").exists()
    with pytest.raises(BackendError, match="the device cuda is a torch-backend choice: drop --device"):
        TTS.load(oracle.path, backend="coreai", assets=fp32_assets, device="cuda")


def test_convert_completes_an_asset_folder_of_one_checkpoint_and_precision(
    tiny_checkpoint, oracle, fp32_assets, tmp_path
):
    """``convert --part`` into an asset folder adds the parts it lacks (a second --part was refused: the folder was
    not empty); a folder of other files, a part it holds, or parts of another precision or checkpoint are refused
    before anything is converted (a backend refuses a folder that mixes two conversions)."""
    folder = tmp_path / "a"
    shutil.copytree(fp32_assets, folder)
    shutil.rmtree(folder / "codec_encoder.aimodel")
    with pytest.raises(AssetError, match=r"holds codec_decoder.aimodel: .*only what it lacks: --part codec_encoder$"):
        convert(oracle, folder, parts=("codec_decoder", "codec_encoder"), progress=False)
    with pytest.raises(AssetError, match=r"a/dualar.aimodel is fp32, not fp16: .*convert with --precision fp32"):
        convert(oracle, folder, "fp16", parts=("codec_encoder",), progress=False)
    with pytest.raises(
        AssetError,
        match=r"a/dualar.aimodel was converted from another checkpoint \(tiny\), not from .*tiny: a folder.s parts",
    ):
        convert(load_checkpoint(tiny_checkpoint), folder, parts=("codec_encoder",), progress=False)
    (folder / "notes.txt").write_text("x")
    with pytest.raises(AssetError, match=r"a is a non-empty folder that is not an asset folder \(it holds notes.txt\)"):
        convert(oracle, folder, parts=("codec_encoder",), progress=False)
    (folder / "notes.txt").unlink()
    (folder / ".DS_Store").write_text("x")  # a Mac's Finder leaves one: not a part, not refused
    convert(oracle, folder, parts=("codec_encoder",), encoder_frames=16, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no staging folder left beside it
    assert sorted(p.name for p in folder.iterdir()) == [".DS_Store", *sorted(f"{p}.aimodel" for p in PARTS)]
    backend = CoreAIBackend(oracle, folder)
    try:
        assert backend.encode(np.zeros(4096, np.float32)).shape == (oracle.config.num_codebooks, 2)
    finally:
        backend.close()


def test_convert_into_a_place_that_cannot_hold_a_folder_is_said(oracle, tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(AssetError, match="cannot write the assets at .*a-file/assets: .*a-file is a file, not a fold"):
        convert(oracle, tmp_path / "a-file" / "assets", progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # refused before converting, not after
    with pytest.raises(AssetError, match=r"dangling is a link to .*nowhere, not a folder"):
        convert(oracle, tmp_path / "dangling", progress=False)
    (tmp_path / "dangling").unlink()
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")  # a link to an empty folder: the folder filled, the link kept
    convert(oracle, tmp_path / "link", "fp16", parts=("codec_decoder",), decoder_frames=4, progress=False)
    assert (tmp_path / "link").is_symlink() and [p.name for p in (tmp_path / "link").iterdir()] == [
        "codec_decoder.aimodel"
    ]


@pytest.mark.parametrize("part", ["dualar", "codec_decoder"])
def test_a_damaged_checkpoint_is_refused_before_converting(tiny_checkpoint, tmp_path, part):
    """NaN weights (a bad download) made assets that drew from NaN on the device: refused, naming the file."""
    import torch

    bad = tmp_path / "bad"
    shutil.copytree(tiny_checkpoint, bad)
    if part == "dualar":
        weights = load_file(bad / "model.safetensors")
        weights["fast_layers.0.feed_forward.w2.weight"][0, 0] = float("nan")
        save_file(weights, bad / "model.safetensors")
    else:
        state = torch.load(bad / "codec.pth", weights_only=True)
        weights = state.get("state_dict", state)
        name = next(k for k in weights if k.startswith("decoder.") and weights[k].is_floating_point())
        weights[name].view(-1)[0] = float("inf")
        torch.save(state, bad / "codec.pth")
    file = "model.safetensors" if part == "dualar" else "codec.pth"
    with pytest.raises(CheckpointError, match=f"^{file} holds NaN or infinite weights: it is damaged"):
        convert(bad, tmp_path / "out", context=64, parts=(part,), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]


def test_a_weight_beyond_float16s_range_is_refused_by_a_float16_conversion(tiny_checkpoint, tmp_path):
    """fp16 and int8-fp16 assets stored a weight over 65504 as inf: refused, fp32 named."""
    big = tmp_path / "big"
    shutil.copytree(tiny_checkpoint, big)
    weights = load_file(big / "model.safetensors")
    weights["norm.weight"][0] = 1e5
    save_file(weights, big / "model.safetensors")
    said = "a weight of magnitude 100000 is beyond float16's range (65504), so fp16 would make it infinite: convert "
    with pytest.raises(AssetError, match=re.escape(said + "with --precision fp32")):
        convert(big, tmp_path / "out", "fp16", context=64, parts=("dualar",), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big"]


def test_a_closed_backend_a_renamed_part_and_a_conversion_that_lost_the_race_are_said(
    speakable, oracle, fp32_assets, tmp_path, monkeypatch
):
    """A TTS used after close() raised KeyError 'prefill'; a part under another part's name was called stale; a
    conversion that another one beat to the folder was told to choose a folder it can write."""
    import importlib

    convert_module = importlib.import_module("audio8_coreai.backends.coreai.convert")  # the package's is the function

    with TTS.load(speakable, backend="coreai", assets=fp32_assets) as tts:
        pass
    with pytest.raises(BackendError, match=r"this model was closed .*: load it again"):
        tts.synthesize("Hi.", seed=0, max_frames=2)
    with pytest.raises(BackendError, match=r"these Core AI assets were closed .*: load the model again"):
        tts.backend.prefill(tts.prompts.plain("Hi."))  # the backend itself, used directly
    renamed = tmp_path / "renamed"
    shutil.copytree(fp32_assets, renamed)
    shutil.rmtree(renamed / "codec_decoder.aimodel")
    (renamed / "codec_encoder.aimodel").rename(renamed / "codec_decoder.aimodel")
    with pytest.raises(AssetError, match=r"holds the codec_encoder part, not codec_decoder \(a part renamed or moved"):
        TTS.load(speakable, backend="coreai", assets=renamed)
    raced = tmp_path / "raced"
    shutil.copytree(fp32_assets, raced)
    monkeypatch.setattr(convert_module, "_check_completion", lambda *args: None)  # its checks passed before the other
    with pytest.raises(AssetError, match=r"another conversion wrote .*raced while this one ran"):
        convert(oracle, raced, parts=("codec_encoder",), encoder_frames=16, progress=False)


def test_a_program_of_another_conversion_under_a_manifest_is_an_asset_error(
    oracle, fp32_assets, child_conversions, tmp_path
):
    """A sync cut short left another conversion's program (context 96, fp16) beside this manifest: the runtime's
    RuntimeError ("k_cache has an invalid shape") came out as a traceback."""
    mixed = tmp_path / "mixed"
    shutil.copytree(fp32_assets, mixed)
    other = child_conversions.folder("fp16") / "dualar.aimodel"
    for name in ("main.mlirb", "main.hash"):
        shutil.copyfile(other / name, mixed / "dualar.aimodel" / name)
    backend = CoreAIBackend(oracle, mixed)
    try:
        with pytest.raises(AssetError, match=r"mixed: a program does not take what its manifest describes \(.*\): the"):
            backend.prefill(np.zeros((11, 40), dtype=np.int64))
    finally:
        backend.close()
