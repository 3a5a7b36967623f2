"""Hostile or mistaken sizes in a checkpoint's configs: a CheckpointError naming the field, found from the files'
headers before anything is allocated (fast, little memory), never a traceback or gigabytes of allocation."""

from __future__ import annotations

import json
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest

from audio8_coreai.checkpoint import load_checkpoint
from audio8_coreai.errors import CheckpointError


def _edit_json(folder: Path, name: str, **changes) -> None:
    data = json.loads((folder / name).read_text())
    for key, value in changes.items():
        if "." in key:  # one nested level: "quantizer_transformer.n_layer"
            outer, inner = key.split(".")
            data[outer][inner] = value
        else:
            data[key] = value
    (folder / name).write_text(json.dumps(data))


def _config(**changes):
    return lambda folder: _edit_json(folder, "config.json", **changes)


def _codec_spec(**changes):
    return lambda folder: _edit_json(folder, "codec_spec.json", **changes)


def _raw_config_value(key: str, literal: str):
    """Write ``literal`` as the JSON text of ``key`` (numbers json.dumps would not write)."""

    def edit(folder: Path) -> None:
        text = (folder / "config.json").read_text()
        start = text.index(f'"{key}": ') + len(f'"{key}": ')
        end = min(i for i in (text.find(",", start), text.find("}", start)) if i >= 0)
        (folder / "config.json").write_text(text[:start] + literal + text[end:])

    return edit


def _deep_json(folder: Path) -> None:
    data = json.loads((folder / "config.json").read_text())
    text = json.dumps(data)[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    (folder / "config.json").write_text(text)


# case -> (damage, words the message must hold: the file and the field)
HOSTILE = {
    "n_layer huge": (_config(n_layer=10**9), ("config.json", "n_layer")),
    "n_layer off the tensors": (_config(n_layer=3), ("n_layer: 3", "model.safetensors holds 2")),
    "n_fast_layer huge": (_config(n_fast_layer=10**8), ("config.json", "n_fast_layer")),
    "n_fast_layer off the tensors": (_config(n_fast_layer=2), ("n_fast_layer", "model.safetensors holds 1")),
    "max_seq_len huge": (_config(max_seq_len=10**7), ("config.json", "max_seq_len")),
    "ras_window_size huge": (_config(ras_window_size=10**8), ("config.json", "ras_window_size")),
    "codec_frame_size huge": (_config(codec_frame_size=10**12), ("config.json", "codec_frame_size")),
    "codec_frame_size off the codec": (_config(codec_frame_size=4096), ("codec_frame_size", "2048")),
    "codec_sample_rate 1": (_config(codec_sample_rate=1), ("config.json", "codec_sample_rate")),
    "codec_sample_rate off the codec": (_config(codec_sample_rate=48000), ("codec_sample_rate", "44100")),
    "rope_base inf": (_config(rope_base=float("inf")), ("config.json", "rope_base")),
    "rope_base nan": (_config(rope_base=float("nan")), ("config.json", "rope_base")),
    "rope_base 0": (_config(rope_base=0), ("config.json", "rope_base")),
    "norm_eps nan": (_config(norm_eps=float("nan")), ("config.json", "norm_eps")),
    "ras_top_p inf": (_config(ras_top_p=float("inf")), ("config.json", "ras_top_p")),
    "dim off the tensors": (_config(dim=128, fast_dim=128), ("dim", "embeddings.weight")),
    "dim huge": (_config(dim=10**9, fast_dim=10**9), ("config.json", "dim")),
    "vocab_size off the tensors": (_config(vocab_size=600), ("vocab_size", "embeddings.weight")),
    "vocab_size huge": (_config(vocab_size=10**12), ("config.json", "vocab_size")),
    "heads off the tensors": (_config(n_head=8, n_local_heads=4), ("n_head", "n_local_heads", "head_dim")),
    "head_dim huge": (_config(head_dim=10**9), ("config.json", "head_dim")),
    "intermediate_size off": (_config(intermediate_size=256), ("intermediate_size", "feed_forward.w1.weight")),
    "fast_intermediate_size off": (
        _config(fast_intermediate_size=256),
        ("fast_intermediate_size", "feed_forward.w1.weight"),
    ),
    "num_codebooks huge": (_config(num_codebooks=10**6), ("config.json", "num_codebooks")),
    "5000-digit n_layer": (_raw_config_value("n_layer", "9" * 5000), ("config.json", "n_layer", "5000-digit")),
    "deeply nested json": (_deep_json, ("config.json", "nested")),
    "codec_filename absolute": (_config(codec_filename="/etc/passwd"), ("config.json", "codec_filename")),
    "codec_filename outside": (_config(codec_filename="../codec.pth"), ("config.json", "codec_filename")),
    "codec_filename in a folder": (_config(codec_filename="sub/codec.pth"), ("config.json", "codec_filename")),
    "codec quantizer layers huge": (
        _codec_spec(**{"quantizer_transformer.n_layer": 10**7}),
        ("codec_spec.json", "quantizer_transformer.n_layer"),
    ),
    "codec quantizer layers off": (
        _codec_spec(**{"quantizer_transformer.n_layer": 3}),
        ("codec_spec.json", "quantizer_transformer.n_layer", "codec.pth holds 1"),
    ),
    "codec quantizer layers not a number": (
        _codec_spec(**{"quantizer_transformer.n_layer": "many"}),
        ("codec_spec.json", "quantizer_transformer.n_layer"),
    ),
    "codec encoder layers huge": (
        _codec_spec(encoder_transformer_layers=[0, 0, 0, 10**8]),
        ("codec_spec.json", "encoder_transformer_layers"),
    ),
    "codec decoder channels huge": (_codec_spec(decoder_channels=10**9), ("codec_spec.json", "decoder_channels")),
    "codec sample_rate 1": (_codec_spec(sample_rate=1), ("codec_spec.json", "sample_rate")),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_config_sizes_are_refused_before_any_allocation(case, tiny_checkpoint, tmp_path):
    damage, words = HOSTILE[case]
    folder = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, folder)
    damage(folder)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(CheckpointError) as err:
            load_checkpoint(folder)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(err.value)
    assert all(word in message for word in words), message
    assert "Traceback" not in message and len(message) < 1000, message
    assert elapsed < 5.0, f"{elapsed:.2f} s"  # the unchecked sizes ran for minutes
    assert peak < 16 * 2**20, f"{peak / 2**20:.1f} MiB allocated before the refusal"


def test_the_tiny_and_oracle_checkpoints_still_load(tiny_checkpoint, oracle_dir):
    """The bounds and cross-checks pass both tiny checkpoints (the real 0.6b sizes: test_checkpoint.py)."""
    assert load_checkpoint(tiny_checkpoint).config.n_layer == 2
    assert load_checkpoint(oracle_dir).codec_config.quantizer_transformer.n_layer == 1


def test_a_long_number_in_a_key_the_port_does_not_read_is_harmless(tiny_checkpoint, tmp_path):
    folder = tmp_path / "ck"
    shutil.copytree(tiny_checkpoint, folder)
    _raw_config_value("initializer_range", "9" * 5000)(folder)
    assert load_checkpoint(folder).config.n_layer == 2


def test_the_real_sizes_are_within_the_bounds():
    from importlib import resources

    from audio8_coreai.config import ModelConfig

    preset = resources.files("audio8_coreai.checkpoint").joinpath("presets", "0.6b", "config.json")
    cfg = ModelConfig.from_dict(json.loads(preset.read_text()))
    assert (cfg.n_layer, cfg.max_seq_len, cfg.codec_sample_rate, cfg.rope_base) == (24, 2048, 44100, 1e6)
