"""``make_checkpoint``: random weights in the publisher's exact layout, written whole or not at all."""

from __future__ import annotations

import pytest
import torch

from audio8_coreai.checkpoint import load_checkpoint, make_checkpoint
from audio8_coreai.errors import CheckpointError
from audio8_coreai.model.codec import CodecDecoder, codec_param_shapes
from audio8_coreai.model.dualar import DualAR
from audio8_coreai.model.layers import SpanKV

PUBLISHER_FILES = ("config.json", "generation_config.json", "model.safetensors", "codec.pth")


def test_make_tiny_writes_the_publisher_layout(tmp_path, oracle_dir):
    path = make_checkpoint(tmp_path / "tiny", "tiny", seed=3)
    names = {f.name for f in path.iterdir()}
    assert names == {*PUBLISHER_FILES, "codec_spec.json", "tokenizer.json", "tokenizer_config.json"}
    for name in ("config.json", "generation_config.json", "codec_spec.json"):  # byte for byte the oracle's
        assert (path / name).read_bytes() == (oracle_dir / name).read_bytes(), name
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no temporary folder left behind

    ck = load_checkpoint(path)
    assert ck.tokenizer_dir == path
    assert all(t.dtype == torch.float32 for t in ck.model_state_dict().values())
    # The codec file is a plain dict of tensors with both weight-norm flavours, loadable weights-only.
    raw = torch.load(path / "codec.pth", weights_only=True)
    assert list(raw) == list(codec_param_shapes(ck.codec_config))
    assert any(k.endswith("parametrizations.weight.original0") for k in raw)
    assert any(k.endswith("weight_g") for k in raw)


def test_make_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a = make_checkpoint(tmp_path / "a", "tiny", seed=7)
    b = make_checkpoint(tmp_path / "b", "tiny", seed=7)
    c = make_checkpoint(tmp_path / "c", "tiny", seed=8)
    for name in ("model.safetensors", "codec.pth", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "codec.pth").read_bytes() != (c / "codec.pth").read_bytes()
    fa, fb, fc = (load_checkpoint(p).fingerprint() for p in (a, b, c))
    assert fa == fb != fc and len(fa) == 64


def test_made_weights_give_a_working_model(tiny_checkpoint):
    """Finite logits with eos among the sampling candidates; codec audio finite, in [-1, 1], not clipped."""
    ck = load_checkpoint(tiny_checkpoint)
    cfg = ck.config
    model = DualAR.from_state_dict(cfg, ck.model_state_dict())
    g = torch.Generator().manual_seed(0)
    n = 48
    codes = torch.zeros(1, 1 + cfg.num_codebooks, n, dtype=torch.long)
    codes[0, 1:] = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, n), generator=g)
    codes[0, 0] = codes[0, 1] + cfg.semantic_begin_id
    k, v = model.new_kv_cache(1, n)
    pos = torch.arange(n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        logits, hidden = model.slow(codes, pos[None], k, v, SpanKV(0, None, mask))
    assert torch.isfinite(logits).all() and torch.isfinite(hidden).all()
    # eos is reachable: somewhere it ranks among the top-50 candidates the sampler draws from.
    eos_rank = (logits[0] > logits[0, :, cfg.eos_index :]).sum(dim=-1)
    assert (eos_rank < 50).any()

    dec = CodecDecoder.from_state_dict(ck.codec_config, ck.codec_state_dict())
    frames = torch.stack(
        [torch.randint(0, ck.codec_config.semantic_codebook_size, (8,), generator=g)]
        + [
            torch.randint(0, ck.codec_config.residual_codebook_size, (8,), generator=g)
            for _ in range(ck.codec_config.residual_codebooks)
        ]
    )[None]
    with torch.no_grad():
        audio = dec(frames)
    assert audio.shape == (1, 8 * 2048)
    assert torch.isfinite(audio).all() and audio.abs().max() <= 1
    assert 0.01 < audio.std().item() and (audio.abs() > 0.99).float().mean() < 0.01


def test_make_refuses_a_non_empty_folder_and_accepts_an_empty_one(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("data")
    with pytest.raises(CheckpointError, match="full is a non-empty folder: a checkpoint goes into a new or empty"):
        make_checkpoint(full, "tiny", seed=0)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_checkpoint(empty, "tiny", seed=0) == empty
    with pytest.raises(CheckpointError, match="'tiny' or '0.6b'"):
        make_checkpoint(tmp_path / "x", "7b", seed=0)  # type: ignore[arg-type]


def test_interrupted_make_leaves_nothing(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointError, match=r"cannot write a checkpoint at .*ck: disk full; choose a folder"):
        make_checkpoint(tmp_path / "ck", "tiny", seed=0)
    assert list(tmp_path.iterdir()) == []


def test_make_in_a_place_that_cannot_hold_a_folder_is_said(tmp_path):
    (tmp_path / "a-file").write_text("x")
    for inside in ("ck", "sub/ck"):  # the file right above, or further up (mkdir said "File exists" of it)
        with pytest.raises(CheckpointError, match=f"at .*a-file/{inside}: .*a-file is a file, not a folder; choose"):
            make_checkpoint(tmp_path / "a-file" / inside, "tiny", seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
    for nothing in ("", "  "):  # Path("") is the current folder: "." was said to be a non-empty folder
        with pytest.raises(CheckpointError, match="no folder given: name the new folder"):
            make_checkpoint(nothing, "tiny", seed=0)
