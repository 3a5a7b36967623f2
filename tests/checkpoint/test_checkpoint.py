"""Finding, validating and loading checkpoints; writing random ones in the publisher's layout."""

from __future__ import annotations

import fractions
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from audio8_coreai.checkpoint import derive_codec_config, load_checkpoint, resolve_checkpoint
from audio8_coreai.config import CodecConfig
from audio8_coreai.errors import CheckpointError
from audio8_coreai.model.codec import codec_param_shapes
from audio8_coreai.model.dualar import dualar_param_shapes


def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    """A writable copy of a checkpoint folder, leaving out ``skip``."""
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file() and f.name not in skip:
            shutil.copyfile(f, dst / f.name)
    return dst


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


# ----------------------------------------------------------------------------------------------------
# The oracle's checkpoint (the publisher's own files)


def test_oracle_checkpoint_loads_and_matches_the_layout(oracle_dir):
    ck = load_checkpoint(oracle_dir)
    spec = json.loads((oracle_dir / "codec_spec.json").read_text())
    assert ck.config.vocab_size == 560 and ck.config.eos_token_id == 2
    assert ck.generation.temperature == 0.7 and ck.generation.max_new_tokens == 512
    assert ck.codec_config == CodecConfig.from_spec(spec)
    assert ck.tokenizer_dir is None  # the oracle carries no tokenizer
    assert ck.codec_file.name == "codec.safetensors"  # preferred over the pickle

    sd = ck.model_state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == dualar_param_shapes(ck.config)
    assert all(v.dtype == torch.float32 for v in sd.values())
    assert all(v.dtype == torch.bfloat16 for v in ck.model_state_dict(torch.bfloat16).values())
    codec = ck.codec_state_dict()
    assert {k: tuple(v.shape) for k, v in codec.items()} == codec_param_shapes(ck.codec_config)


def test_codec_pth_and_safetensors_hold_the_same_tensors(oracle_dir, tmp_path):
    from_st = load_checkpoint(oracle_dir).codec_state_dict()
    folder = _copy(oracle_dir, tmp_path / "pth_only", skip=("codec.safetensors", "fixture.npz"))
    ck = load_checkpoint(folder)
    assert ck.codec_file.name == "codec.pth"
    from_pth = ck.codec_state_dict()
    assert from_pth.keys() == from_st.keys()
    assert all(torch.equal(from_pth[k], from_st[k]) for k in from_st)


def test_codec_sizes_are_derived_from_tensor_shapes_without_a_spec(oracle_dir, tmp_path):
    """A tiny codec without codec_spec.json still loads: its sizes come from the tensors."""
    folder = _copy(oracle_dir, tmp_path / "no_spec", skip=("codec_spec.json", "codec.safetensors", "fixture.npz"))
    expected = CodecConfig.from_spec(json.loads((oracle_dir / "codec_spec.json").read_text()))
    assert load_checkpoint(folder).codec_config == expected
    # codec=False does not read the codec: defaults first, derived once the codec is read.
    lazy = load_checkpoint(folder, codec=False)
    assert lazy.codec_config == CodecConfig()
    lazy.codec_state_dict()
    assert lazy.codec_config == expected


def test_derived_codec_sizes_of_the_real_layout_are_the_defaults():
    assert derive_codec_config(codec_param_shapes(CodecConfig())) == CodecConfig()


# ----------------------------------------------------------------------------------------------------
# Bad input: every failure is a CheckpointError naming the file


def _drop_tensor(folder: Path) -> None:
    sd = _tensors(folder / "model.safetensors")
    del sd["layers.1.attention.wqkv.bias"]
    save_file(sd, str(folder / "model.safetensors"))


def _reshape_tensor(folder: Path) -> None:
    sd = _tensors(folder / "model.safetensors")
    sd["norm.weight"] = torch.ones(63)
    save_file(sd, str(folder / "model.safetensors"))


def _extra_tensor(folder: Path) -> None:
    sd = _tensors(folder / "model.safetensors")
    sd["lm_head.weight"] = torch.zeros(4, 64)
    save_file(sd, str(folder / "model.safetensors"))


def _int_tensor(folder: Path) -> None:
    sd = _tensors(folder / "model.safetensors")
    sd["norm.weight"] = torch.ones(64, dtype=torch.int32)
    save_file(sd, str(folder / "model.safetensors"))


def _truncate(folder: Path, name: str) -> None:
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])


def _codec_needing_unpickle(folder: Path) -> None:
    sd = torch.load(folder / "codec.pth", weights_only=True)
    sd["note"] = fractions.Fraction(1, 3)  # any object beyond tensors and plain containers
    torch.save(sd, folder / "codec.pth")


def _codec_missing_tensor(folder: Path) -> None:
    sd = torch.load(folder / "codec.pth", weights_only=True)
    del sd["decoder.model.0.conv.bias"]
    torch.save(sd, folder / "codec.pth")


def _codec_spec_disagrees(folder: Path) -> None:
    spec = json.loads((folder / "codec_spec.json").read_text())
    spec["decoder_channels"] = 256
    (folder / "codec_spec.json").write_text(json.dumps(spec))


def _config(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


BAD = {
    "missing config": (lambda f: (f / "config.json").unlink(), "config.json", "must hold"),
    "config not json": (lambda f: (f / "config.json").write_text("{not json"), "config.json", "not valid JSON"),
    "wrong model_type": (lambda f: _config(f, model_type="qwen2"), "config.json", "not an Audio8/arktts"),
    "inconsistent config": (lambda f: _config(f, semantic_end_id=9999), "config.json", "vocab_size"),
    "negative size": (lambda f: _config(f, max_seq_len=-5), "config.json", "max_seq_len must be >= 1, got -5"),
    "bad generation config": (
        lambda f: (f / "generation_config.json").write_text('{"temperature": 0}'),
        "generation_config.json",
        "temperature",
    ),
    "missing model": (lambda f: (f / "model.safetensors").unlink(), "model.safetensors", "must hold"),
    "missing tensor": (_drop_tensor, "model.safetensors", "missing: layers.1.attention.wqkv.bias [128]"),
    "wrong shape": (_reshape_tensor, "model.safetensors", "norm.weight has shape [63], expected [64]"),
    "extra tensor": (_extra_tensor, "model.safetensors", "unexpected: lm_head.weight"),
    "integer tensor": (_int_tensor, "model.safetensors", "dtype int32"),
    "truncated model": (lambda f: _truncate(f, "model.safetensors"), "model.safetensors", "truncated or corrupt"),
    "missing codec": (lambda f: (f / "codec.pth").unlink(), "codec.pth", "must hold"),
    "corrupt codec": (lambda f: (f / "codec.pth").write_bytes(os.urandom(4096)), "codec.pth", "corrupt"),
    "truncated codec": (lambda f: _truncate(f, "codec.pth"), "codec.pth", "corrupt or truncated"),
    "codec needs unpickling": (_codec_needing_unpickle, "codec.pth", "objects a weights file must not hold"),
    "codec missing tensor": (_codec_missing_tensor, "codec.pth", "missing: decoder.model.0.conv.bias"),
    "codec spec disagrees": (_codec_spec_disagrees, "codec.pth", "decoder_channels is 256 but"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoint_is_a_clear_error(case, tiny_checkpoint, tmp_path):
    damage, file, needle = BAD[case]
    folder = _copy(tiny_checkpoint, tmp_path / "ck")
    damage(folder)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    message = str(err.value)
    assert file in message and needle in message, message


class _RunsCode:
    """Unpickling this makes a folder: proof that loading ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _zip_pickle_with_code(file: Path, marker: Path) -> None:
    sd = torch.load(file, weights_only=True)
    torch.save({**sd, "hook": _RunsCode(marker)}, file)


def _legacy_pickle_with_code(file: Path, marker: Path) -> None:
    sd = torch.load(file, weights_only=True)
    torch.save({**sd, "hook": _RunsCode(marker)}, file, _use_new_zipfile_serialization=False)


def _plain_pickle_with_code(file: Path, marker: Path) -> None:  # pickle.dump, not torch.save: protocol 4 opcodes
    file.write_bytes(pickle.dumps({"hook": _RunsCode(marker)}, protocol=4))


def _hand_written_pickle(file: Path, marker: Path) -> None:  # GLOBAL os.mkdir, REDUCE: no torch involved
    file.write_bytes(b"cos\nmkdir\n(S'" + str(marker).encode() + b"'\ntR.")


@pytest.mark.parametrize(
    "variant", [_zip_pickle_with_code, _legacy_pickle_with_code, _plain_pickle_with_code, _hand_written_pickle]
)
def test_code_carrying_codec_is_refused_unrun_without_torchs_advice(variant, tiny_checkpoint, tmp_path):
    """A codec.pth holding objects beyond tensors and plain containers: refused as such, nothing in it run, and torch's
    advice to reload with weights_only=False never passed on."""
    folder = _copy(tiny_checkpoint, tmp_path / "ck")
    marker = tmp_path / "code_ran"
    variant(folder / "codec.pth", marker)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    message = str(err.value)
    assert "codec.pth: holds objects a weights file must not hold" in message, message
    assert "codec.safetensors" in message, message
    assert "weights_only" not in message and "corrupt" not in message and "pytorch.org" not in message, message
    assert not marker.exists()


def test_many_mismatches_are_counted_and_the_first_five_named(tiny_checkpoint, tmp_path):
    folder = _copy(tiny_checkpoint, tmp_path / "ck")
    sd = _tensors(folder / "model.safetensors")
    save_file({k: v for k, v in sd.items() if not k.startswith("layers.")}, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(folder)
    missing = sum(k.startswith("layers.") for k in sd)
    assert f"{missing} missing, 0 unexpected" in str(err.value)
    assert f"(+{missing - 5} more)" in str(err.value)


def test_paths_that_are_not_checkpoints(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint folder at .*not a hub id"):
        resolve_checkpoint(tmp_path / "nowhere")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_checkpoint(tmp_path / "file.bin")
    latin1 = Path(os.fsdecode(os.fsencode(tmp_path) + b"/ck-\xe9t\xe9"))  # a Latin-1 archive's folder name
    latin1.mkdir()
    with pytest.raises(CheckpointError, match=r"ck-\\xe9t\\xe9 is not UTF-8.*rename the folder, or link it"):
        resolve_checkpoint(latin1)
    (tmp_path / "linked").symlink_to(latin1)
    assert resolve_checkpoint(tmp_path / "linked") == tmp_path / "linked"


@pytest.mark.parametrize(("model", "said"), [(None, "NoneType"), ("", "''"), ("  ", "'  '"), (5, "int")])
def test_a_model_that_is_no_path_or_id_is_said_so(model, said, tmp_path, monkeypatch):
    """None, an empty name (it read as the current folder) or a number: what model takes, not a path's error."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError) as refused:
        resolve_checkpoint(model)
    assert str(refused.value) == (
        f"model must be a checkpoint folder's path or a hub id such as Audio8/Audio8-TTS-Preview-0.6b, got {said}"
    )


def test_hub_id_while_offline_says_what_a_local_folder_needs(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint("audio8-tests/not-a-cached-repo")
    message = str(err.value)
    assert "HF_HUB_OFFLINE" in message and "--model DIR" in message
    assert all(name in message for name in ("config.json", "model.safetensors", "codec.pth", "tokenizer.json"))


# ----------------------------------------------------------------------------------------------------
# Partial loads and the fingerprint


def test_config_and_tokenizer_only(tiny_checkpoint, tmp_path):
    """The prompt command needs no weights: weights=False, codec=False read neither file."""
    folder = _copy(tiny_checkpoint, tmp_path / "light", skip=("model.safetensors", "codec.pth"))
    ck = load_checkpoint(folder, weights=False, codec=False)
    assert ck.tokenizer_dir == folder and ck.config.vocab_size == 560
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        ck.model_state_dict()
    with pytest.raises(CheckpointError, match="no codec.pth"):
        ck.codec_state_dict()


def test_fingerprint_follows_config_and_weights(tiny_checkpoint, tmp_path):
    base = load_checkpoint(tiny_checkpoint).fingerprint()
    assert load_checkpoint(tiny_checkpoint).fingerprint() == base
    copy = _copy(tiny_checkpoint, tmp_path / "copy")
    assert load_checkpoint(copy).fingerprint() == base  # content, not location
    _config(copy, ras_top_p=0.8)
    assert load_checkpoint(copy).fingerprint() != base


@pytest.mark.parametrize("part", ["model", "codec"])
def test_nan_weights_are_named_not_spoken(part, tiny_checkpoint, tmp_path):
    """Weights that pass every load check but hold NaN (a damaged download): the synthesis stops with the file to
    fetch again, never a 'try another seed' or a WAV of NaN."""
    from audio8_coreai import TTS
    from audio8_coreai.errors import CheckpointError

    bad = tmp_path / "nan"
    shutil.copytree(tiny_checkpoint, bad)
    if part == "model":
        with safe_open(str(bad / "model.safetensors"), "pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}
        state["embeddings.weight"][:] = float("nan")
        save_file(state, str(bad / "model.safetensors"))
        needle = "model produced NaN or infinite values: model.safetensors is damaged"
    else:
        state = torch.load(bad / "codec.pth", weights_only=True)
        weights = state.get("state_dict", state)
        name = next(k for k in weights if k.startswith("decoder.") and weights[k].is_floating_point())
        weights[name][:] = float("nan")
        torch.save(state, bad / "codec.pth")
        needle = "codec produced NaN or infinite values: the codec file (codec.pth or codec.safetensors) is damaged"
    tts = TTS.load(bad, device="cpu", precision="fp32")
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        tts.generate("Hello there.", seed=1, max_frames=4)
    with pytest.raises(CheckpointError, match=re.escape(needle)):
        list(tts.stream("Hello there.", seed=1, max_frames=4, chunk_frames=2))


def test_name_is_the_hub_id_in_the_hub_cache_else_the_folder(tiny_checkpoint, tmp_path, monkeypatch):
    """What the Wyoming ``info`` and the Core AI manifests call the checkpoint (never its path)."""
    snapshot = tmp_path / "models--Audio8--Audio8-TTS-Preview-0.6b" / "snapshots" / "0123abcd"
    snapshot.parent.mkdir(parents=True)
    _copy(tiny_checkpoint, snapshot)
    assert load_checkpoint(snapshot).name == "Audio8/Audio8-TTS-Preview-0.6b"
    assert load_checkpoint(_copy(tiny_checkpoint, tmp_path / "my-voice-ck")).name == "my-voice-ck"
    monkeypatch.chdir(tmp_path / "my-voice-ck")
    assert load_checkpoint(".").name == "my-voice-ck"  # a relative path has its folder's name


@pytest.mark.parametrize(
    "name, value, precision",
    [
        ("layers.0.feed_forward.w2.weight", float("nan"), "fp16w"),  # FBGEMM's packing saturated it: noise spoken
        ("fast_output.weight", float("-inf"), "fp16w"),  # a head
        ("fast_layers.0.attention.wqkv.weight", float("nan"), "int16"),  # the int8 pieces' scales made it finite
        ("layers.1.feed_forward.w1.weight", float("inf"), "int8"),
    ],
)
def test_nan_or_inf_in_a_packed_weight_is_refused_at_load(tiny_checkpoint, tmp_path, name, value, precision):
    """A precision that packs the linears turned one NaN or inf weight finite, so the damaged file spoke (noise)
    where fp32 stops it at the first frame: the load refuses it, naming the file to fetch again."""
    from audio8_coreai import TTS
    from audio8_coreai.errors import CheckpointError

    bad = _copy(tiny_checkpoint, tmp_path / "bad")
    with safe_open(str(bad / "model.safetensors"), "pt") as f:
        state = {k: f.get_tensor(k) for k in f.keys()}
    state[name][1, 2] = value
    save_file(state, str(bad / "model.safetensors"))
    said = "model.safetensors holds NaN or infinite weights: it is damaged (a bad download or disk); download the "
    with pytest.raises(CheckpointError, match=re.escape(said + "checkpoint again")):
        TTS.load(bad, device="cpu", precision=precision)


def test_a_weight_beyond_float16s_range_is_refused_by_fp16w(tiny_checkpoint, tmp_path):
    """FBGEMM's float16 packing saturated a weight over 65504 (other products, silently, at the default precision):
    refused with the precisions that hold it; int16 loads it."""
    from audio8_coreai import TTS
    from audio8_coreai.errors import BackendError

    big = _copy(tiny_checkpoint, tmp_path / "big")
    state = load_file(big / "model.safetensors")
    state["layers.1.attention.wo.weight"][3, 4] = -70000.0
    save_file(state, str(big / "model.safetensors"))
    said = "a weight of magnitude 70000 is beyond float16's range (65504), so fp16w would change it: load with "
    with pytest.raises(BackendError, match=re.escape(said + "precision int16 or fp32")):
        TTS.load(big, device="cpu", precision="fp16w")
    TTS.load(big, device="cpu", precision="int16").close()
