"""The codec against the publisher's recordings (tiny fp32 oracle) and the real checkpoint's layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from audio8_coreai.config import CodecConfig
from audio8_coreai.model.codec import CodecDecoder, CodecEncoder, codec_param_shapes, normalize_codec_state_dict
from tests.oracle_files import ORACLE

SHAPES_0_6B = ORACLE / "param_shapes_0.6b.json"
DECODE_ITEMS = [("plain", 0), ("greedy", 0), ("batch", 0), ("batch", 1), ("clone", 0), ("codec_clamp", 0)]
TOL = 1e-4  # oracle README: waveform and intermediates within 1e-4 absolute at fp32


@pytest.fixture(scope="module")
def cfg(oracle_dir: Path) -> CodecConfig:
    return CodecConfig.from_spec(json.loads((oracle_dir / "codec_spec.json").read_text()))


@pytest.fixture(scope="module")
def codec_sd(oracle_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(oracle_dir / "codec.pth", weights_only=True, map_location="cpu")


@pytest.fixture(scope="module")
def decoder(cfg: CodecConfig, codec_sd) -> CodecDecoder:
    return CodecDecoder.from_state_dict(cfg, codec_sd, max_frames=256)


@pytest.fixture(scope="module")
def encoder(cfg: CodecConfig, codec_sd) -> CodecEncoder:
    return CodecEncoder.from_state_dict(cfg, codec_sd, max_frames=16)


def _max_diff(a: torch.Tensor, b: np.ndarray) -> float:
    return float((a - torch.from_numpy(b)).abs().max())


def _folded_names(shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Publisher names -> module names/shapes once weight norm is folded (the v tensor's shape)."""
    out = {}
    for name, shape in shapes.items():
        for g, v in (
            (".parametrizations.weight.original0", ".parametrizations.weight.original1"),
            (".weight_g", ".weight_v"),
        ):
            if name.endswith(g):
                break
            if name.endswith(v):
                out[name[: -len(v)] + ".weight"] = shape
                break
        else:
            out[name] = shape
    return out


# ---------------------------------------------------------------------------------------------------
# Checkpoint layout


def test_param_shapes_match_real_checkpoint():
    expected = [(n, tuple(s)) for n, s in json.loads(SHAPES_0_6B.read_text())["codec"]]
    got = codec_param_shapes(CodecConfig())
    assert list(got.items()) == expected
    assert len(got) == 535 and sum(math.prod(s) for s in got.values()) == 391_430_530


def test_param_shapes_match_tiny_checkpoint(cfg, codec_sd):
    assert list(codec_param_shapes(cfg).items()) == [(k, tuple(v.shape)) for k, v in codec_sd.items()]


def test_real_codec_modules_cover_the_checkpoint():
    """Built on the meta device (no 0.6b weights allocated): decoder + encoder hold every tensor, folded."""
    cfg = CodecConfig()
    with torch.device("meta"):
        dec, enc = CodecDecoder(cfg, max_frames=1), CodecEncoder(cfg, max_frames=1)
    folded = _folded_names(codec_param_shapes(cfg))
    got = {k: tuple(v.shape) for m in (dec, enc) for k, v in m.state_dict().items()}
    assert got == folded


def test_normalize_rules():
    t = torch.zeros(1)
    assert normalize_codec_state_dict({"a.weight": t}) == {"a.weight": t}
    assert normalize_codec_state_dict({"state_dict": {"a.weight": t}}) == {"a.weight": t}
    wrapped = {
        "state_dict": {
            "generator.a.weight": t,
            "discriminator.b.weight": t,
            "generator.q.freqs_cis": t,
            "generator.q.causal_mask": t,
        }
    }
    assert normalize_codec_state_dict(wrapped) == {"a.weight": t}


# ---------------------------------------------------------------------------------------------------
# Loading


def test_safetensors_and_pth_give_identical_modules(cfg, oracle_dir, decoder, encoder):
    st = load_file(str(oracle_dir / "codec.safetensors"))
    for built, cls in ((decoder, CodecDecoder), (encoder, CodecEncoder)):
        other = cls.from_state_dict(cfg, st, max_frames=16).state_dict()
        mine = built.state_dict()
        assert other.keys() == mine.keys()
        assert all(torch.equal(other[k], mine[k]) for k in mine if not k.endswith(("rope", "mask")))


def test_legacy_weight_norm_flavour_loads_the_same(cfg, codec_sd, decoder):
    legacy = {
        k.replace(".parametrizations.weight.original0", ".weight_g").replace(
            ".parametrizations.weight.original1", ".weight_v"
        ): v
        for k, v in codec_sd.items()
    }
    other = CodecDecoder.from_state_dict(cfg, {"state_dict": legacy}, max_frames=256).state_dict()
    assert all(torch.equal(other[k], v) for k, v in decoder.state_dict().items())


def test_loading_is_strict(cfg, codec_sd):
    missing = dict(codec_sd)
    del missing["decoder.model.6.conv.bias"]
    with pytest.raises(ValueError, match=r"missing keys \['decoder.model.6.conv.bias'\]"):
        CodecDecoder.from_state_dict(cfg, missing)
    with pytest.raises(ValueError, match="unexpected keys.*'extra.weight'"):
        CodecDecoder.from_state_dict(cfg, {**codec_sd, "extra.weight": torch.zeros(1)})
    bad = {**codec_sd, "decoder.model.5.alpha": torch.zeros(1, 3, 1)}
    with pytest.raises(ValueError, match="wrong shapes.*decoder.model.5.alpha"):
        CodecDecoder.from_state_dict(cfg, bad)
    # The decoder ignores encoder tensors, but the encoder needs them.
    no_encoder = {k: v for k, v in codec_sd.items() if not k.startswith("encoder.")}
    CodecDecoder.from_state_dict(cfg, no_encoder)
    with pytest.raises(ValueError, match="missing keys.*encoder.block.0.conv.bias"):
        CodecEncoder.from_state_dict(cfg, no_encoder)


# ---------------------------------------------------------------------------------------------------
# Decoder against the oracle


@pytest.mark.parametrize("scenario,item", DECODE_ITEMS)
def test_decoder_matches_oracle(decoder, fixture, scenario, item):
    key = "codes_in" if scenario == "codec_clamp" else "codes"
    codes = torch.from_numpy(fixture[f"{scenario}__{key}"][item : item + 1])
    frames = int((codes >= 0).all(dim=1).sum())  # the publisher decodes the all->=0 prefix
    if scenario == "batch":
        assert frames == fixture["batch__code_lengths"][item]
    with torch.no_grad():
        out = decoder.intermediates(codes[..., :frames])
    length = int(fixture[f"{scenario}__decode_lengths"][item])
    assert length == frames * 2048 and out["waveform"].shape == (1, length)
    assert out["waveform"].dtype == torch.float32
    assert _max_diff(out["waveform"][0], fixture[f"{scenario}__decode_waveform"][item, :length]) < TOL
    for name in ("post_in", "post_out", "upsample_out"):
        assert _max_diff(out[name], fixture[f"{scenario}__decode_item{item}_{name}"]) < TOL, name
    # Tighter: an fp32 (not bf16-rounded) RoPE table moves post_out by ~1.3e-5, still inside 1e-4.
    assert _max_diff(out["post_out"], fixture[f"{scenario}__decode_item{item}_post_out"]) < 5e-6
    with torch.no_grad():
        assert torch.equal(decoder(codes[..., :frames]), out["waveform"])


def test_decode_helper_matches_batch_decode(decoder, fixture):
    wave, lengths = decoder.decode(torch.from_numpy(fixture["batch__codes"]))
    assert lengths.tolist() == fixture["batch__decode_lengths"].tolist()
    assert wave.shape == fixture["batch__decode_waveform"].shape
    assert _max_diff(wave, fixture["batch__decode_waveform"]) < TOL  # zero padding included
    empty, n = decoder.decode(torch.full((1, 10, 4), -1))
    assert empty.shape == (1, 0) and n.tolist() == [0]


def test_decoder_clamps_out_of_range_codes(decoder, fixture, cfg):
    codes = torch.from_numpy(fixture["codec_clamp__codes_in"])
    assert codes[:, 1:].max() >= cfg.residual_codebook_size  # the scenario does exercise the clamp
    clamped = torch.cat(
        [codes[:, :1].clamp(0, cfg.semantic_codebook_size - 1), codes[:, 1:].clamp(0, cfg.residual_codebook_size - 1)],
        dim=1,
    )
    with torch.no_grad():
        assert torch.equal(decoder(codes), decoder(clamped))


def test_decoder_is_causal(decoder, fixture):
    codes = torch.from_numpy(fixture["clone__codes"])
    with torch.no_grad():
        full = decoder(codes)
        for k in (1, 5, 17):
            assert float((decoder(codes[..., :k]) - full[:, : k * 2048]).abs().max()) < 1e-5


def test_window_mask_limits_attention(decoder):
    """Query i sees exactly keys i-127..i (one layer in the tiny codec, so the receptive field is the window)."""
    post = decoder.quantizer.post_module
    assert len(post.layers) == 1
    x = torch.randn(1, decoder.cfg.latent_dim, 200, generator=torch.Generator().manual_seed(0))
    i = 190
    with torch.no_grad():
        base = post(x)[..., i]
        old = x.clone()
        old[..., : i - 127] += 1.0
        assert torch.equal(post(old)[..., i], base)
        edge = x.clone()
        edge[..., i - 127] += 1.0
        assert not torch.equal(post(edge)[..., i], base)


def test_decoder_rejects_too_many_frames(cfg, codec_sd):
    small = CodecDecoder.from_state_dict(cfg, codec_sd, max_frames=4)
    with pytest.raises(ValueError, match="max_frames"):
        small(torch.zeros(1, 10, 5, dtype=torch.long))


def test_decoder_exports(decoder):
    codes = torch.randint(0, 300, (1, 10, 8), generator=torch.Generator().manual_seed(0))
    ep = torch.export.export(decoder, (codes,))
    with torch.no_grad():
        assert torch.equal(ep.module()(codes), decoder(codes))


# ---------------------------------------------------------------------------------------------------
# Encoder against the oracle


def test_encoder_matches_oracle(encoder, fixture):
    audio = torch.from_numpy(fixture["clone__ref_audio"])
    assert audio.shape == (22050,)
    codes, counts = encoder.encode(audio)
    assert counts.tolist() == fixture["clone__ref_code_lengths"].tolist() == [11]
    assert codes.dtype == torch.int64
    np.testing.assert_array_equal(codes.numpy(), fixture["clone__ref_codes"])
    padded = torch.nn.functional.pad(audio, (0, 11 * 2048 - audio.numel()))[None, None]
    with torch.no_grad():
        assert _max_diff(encoder.latent(padded), fixture["clone__ref_encoder_out"]) < 1e-5
        assert torch.equal(encoder(padded), codes)


def test_encode_batch_pads_and_marks_frames(encoder, fixture):
    audio = torch.from_numpy(fixture["clone__ref_audio"])
    solo, _ = encoder.encode(audio)
    batch = torch.stack([audio, torch.cat([audio[:5000], torch.zeros(audio.numel() - 5000)])])
    codes, counts = encoder.encode(batch[:, None], lengths=torch.tensor([22050, 5000]))
    assert counts.tolist() == [11, 3]
    assert torch.equal(codes[0], solo[0])
    short, _ = encoder.encode(audio[:5000])
    assert torch.equal(codes[1, :, :3], short[0]) and bool((codes[1, :, 3:] == -1).all())
    same, _ = encoder.encode(audio[None])  # [B, N] is accepted too
    assert torch.equal(same, solo)
    with pytest.raises(ValueError, match="empty"):
        encoder.encode(torch.zeros(0))
    with pytest.raises(ValueError, match=r"\[B, 1, N\]"):
        encoder.encode(torch.zeros(1, 2, 2048))


@pytest.mark.parametrize("length", [1, 2, 4, 5])
def test_short_transposed_conv_through_a_matrix_product_equals_the_convolution(length):
    """Inputs with 16 L <= C_in take the matrix-product path (4 steps of 64 channels do, 5 do not); both give
    ConvTranspose1d's numbers, uncropped (``full``) and causally cropped (``forward``)."""
    from audio8_coreai.model.codec.layers import CausalConvTranspose

    torch.manual_seed(0)
    layer = CausalConvTranspose(64, 24, 16, 8)
    x = torch.randn(2, 64, length)
    want = torch.nn.functional.conv_transpose1d(x, layer.conv.weight, layer.conv.bias, stride=8)
    got = layer.full(x)
    assert got.shape == want.shape == (2, 24, (length + 1) * 8)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert torch.equal(layer(x), got[..., : length * 8])
