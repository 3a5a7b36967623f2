"""Model, codec and generation settings read from the publisher's json files.

Everything size- or id-related comes from the checkpoint's ``config.json`` (SPEC.md section 1) so the
same code runs the tiny oracle checkpoint (vocab 560, semantic ids 300..555, eos 2) and the real 0.6b one
(vocab 155776, semantic ids 151678..155773, eos 151645). Nothing here knows about files beyond parsing
dicts; :mod:`audio8_coreai.checkpoint` finds and reads them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from .bounds import CODEC_SIZE_LIMITS, MAX_CODEC_STRIDES, MODEL_NUMBER_RULES, MODEL_SIZE_LIMITS, LongNumber
from .errors import ConfigError

MODEL_TYPE = "arktts"


def _req(d: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in d:
        raise ConfigError(f"{where}: missing key '{key}'")
    value = d[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        got = repr(value) if isinstance(value, LongNumber) else f"{type(value).__name__} {value!r}"
        raise ConfigError(f"{where}: '{key}' should be {kind.__name__}, got {got}", key)
    return value


@dataclass(frozen=True)
class BlockShape:
    """One transformer block's sizes: width ``dim``, ``n_head`` query and ``n_kv`` KV heads of ``head_dim``, the
    feed-forward's ``ffn`` width, which projections carry biases, whether q/k are normed, RMSNorm's ``eps``."""

    dim: int
    n_head: int
    n_kv: int
    head_dim: int
    ffn: int
    eps: float
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool


@dataclass(frozen=True)
class ModelConfig:
    """The DualAR language model's sizes and special ids (the publisher's ``ArkttsConfig``).

    Slow AR: ``n_layer`` blocks of width ``dim`` with ``n_head`` query / ``n_local_heads`` KV heads of
    ``head_dim``; fast AR: ``n_fast_layer`` blocks of ``fast_dim``. Semantic code ``c`` is token id
    ``semantic_begin_id + c``; ``codebook_size`` is the width of codebook 0, of the fast head and of the
    fast embedding. ``max_seq_len`` bounds prompt + frames (the slow KV cache and RoPE table length).
    """

    vocab_size: int
    dim: int
    n_layer: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    max_seq_len: int
    rope_base: float
    norm_eps: float
    codebook_size: int
    num_codebooks: int
    semantic_begin_id: int
    semantic_end_id: int
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_n_local_heads: int
    fast_head_dim: int
    fast_intermediate_size: int
    eos_token_id: int
    pad_token_id: int
    attention_qkv_bias: bool = True
    attention_o_bias: bool = False
    attention_qk_norm: bool = False
    tie_word_embeddings: bool = True
    fast_attention_qkv_bias: bool = False
    fast_attention_o_bias: bool = False
    fast_attention_qk_norm: bool = False
    norm_fastlayer_input: bool = True
    ras_window_size: int = 10
    ras_temperature: float = 1.0
    ras_top_p: float = 0.9
    codec_sample_rate: int = 44100
    codec_frame_size: int = 2048
    codec_filename: str = "codec.pth"

    @property
    def slow_block(self) -> BlockShape:
        """The slow AR's block sizes."""
        return self._block("")

    @property
    def fast_block(self) -> BlockShape:
        """The fast AR's block sizes."""
        return self._block("fast_")

    def _block(self, prefix: str) -> BlockShape:
        """The block sizes of the fields named with ``prefix`` (the publisher's convention: ``fast_`` for the
        fast AR's)."""
        names = ("dim", "n_head", "n_local_heads", "head_dim", "intermediate_size")
        dim, n_head, n_kv, head_dim, ffn = (getattr(self, prefix + name) for name in names)
        flags = (getattr(self, f"{prefix}attention_{name}") for name in ("qkv_bias", "o_bias", "qk_norm"))
        return BlockShape(dim, n_head, n_kv, head_dim, ffn, self.norm_eps, *flags)

    @property
    def num_semantic(self) -> int:
        """Number of semantic ids (4096 for 0.6b); the compact head has ``num_semantic + 1`` rows."""
        return self.semantic_end_id - self.semantic_begin_id + 1

    @property
    def eos_index(self) -> int:
        """Index of eos in the compact head (semantic ids first, then eos)."""
        return self.num_semantic

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config.json") -> ModelConfig:
        """Parse ``config.json``; raise :class:`ConfigError` naming the first bad key.

        Also checks the model type (``arktts``) and the internal consistency the model relies on
        (semantic range inside the vocabulary, ``codebook_size`` equal to the semantic count,
        ``n_head`` divisible by ``n_local_heads``).
        """
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        model_type = d.get("model_type")
        if model_type != MODEL_TYPE:
            raise ConfigError(
                f"{where}: model_type is {model_type!r}, expected '{MODEL_TYPE}' "
                "(Audio8-TTS-Preview-0.6b, the publisher's ArkttsModel)"
            )
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            kind = {"int": int, "float": float, "bool": bool, "str": str}[kinds[f.name]]
            if f.default is not dataclasses.MISSING and f.name not in d:
                values[f.name] = f.default
                continue
            values[f.name] = _req(d, f.name, kind, where)
        cfg = cls(**values)
        cfg._check(where)
        return cfg

    def _check(self, where: str) -> None:
        for name, (low, high) in MODEL_SIZE_LIMITS.items():
            value = getattr(self, name)
            if value < low:
                raise ConfigError(f"{where}: {name} must be >= {low}, got {value}", name)
            if value > high:
                raise ConfigError(f"{where}: {name} is {value}, over the most this port runs ({high})", name)
        if self.ras_window_size > self.max_seq_len:
            raise ConfigError(
                f"{where}: ras_window_size {self.ras_window_size} is longer than the context (max_seq_len "
                f"{self.max_seq_len}): a window that can never fill",
                "ras_window_size",
            )
        for name, (rule, ok) in MODEL_NUMBER_RULES.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and ok(value)):
                raise ConfigError(f"{where}: {name} must be a finite number {rule}, got {value!r}", name)
        name = self.codec_filename
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name or PurePath(name).is_absolute():
            raise ConfigError(
                f"{where}: codec_filename {name!r} is not a file name: the codec file must lie in the checkpoint "
                "folder itself (as codec.pth does)",
                "codec_filename",
            )
        if not 0 <= self.semantic_begin_id <= self.semantic_end_id < self.vocab_size:
            raise ConfigError(
                f"{where}: semantic ids {self.semantic_begin_id}..{self.semantic_end_id} "
                f"do not fit vocab_size {self.vocab_size}"
            )
        if self.codebook_size != self.num_semantic:
            raise ConfigError(
                f"{where}: codebook_size {self.codebook_size} != number of semantic ids {self.num_semantic}"
            )
        for n, kv in ((self.n_head, self.n_local_heads), (self.fast_n_head, self.fast_n_local_heads)):
            if kv <= 0 or n % kv:
                raise ConfigError(f"{where}: {n} query heads cannot share {kv} KV heads")
        if self.fast_dim != self.dim:
            raise ConfigError(
                f"{where}: fast_dim {self.fast_dim} != dim {self.dim} is not supported "
                "(the publisher's fast_project_in would be a Linear)"
            )
        if not (0 <= self.eos_token_id < self.vocab_size and 0 <= self.pad_token_id < self.vocab_size):
            raise ConfigError(f"{where}: eos/pad ids outside the vocabulary")
        if self.num_codebooks < 2:
            raise ConfigError(f"{where}: num_codebooks {self.num_codebooks} < 2")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling defaults (``generation_config.json``); the publisher's fallbacks when the file is absent.

    Matches the publisher's generate: sampling on, temperature 0.7, top-k 50, top-p 0.9, 512 frames.
    """

    do_sample: bool = True
    temperature: float = 0.7
    top_k: int = 50
    top_p: float = 0.9
    max_new_tokens: int = 512

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, where: str = "generation_config.json") -> GenerationConfig:
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        out = cls()
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in d:
                kind = {"int": int, "float": float, "bool": bool}[f.type]
                values[f.name] = _req(d, f.name, kind, where)
            else:
                values[f.name] = getattr(out, f.name)
        cfg = cls(**values)
        cfg.check(where)
        return cfg

    def check(self, where: str = "sampling settings") -> None:
        """Raise :class:`ConfigError` (its ``field`` the setting) for a temperature <= 0, top-k < 1, top-p
        outside (0, 1] or frames < 1."""
        if not self.temperature > 0:
            raise ConfigError(f"{where}: temperature must be > 0, got {self.temperature}", "temperature")
        if self.top_k < 1:
            raise ConfigError(f"{where}: top_k must be >= 1, got {self.top_k}", "top_k")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"{where}: top_p must be in (0, 1], got {self.top_p}", "top_p")
        if self.max_new_tokens < 1:
            raise ConfigError(f"{where}: max_new_tokens must be >= 1, got {self.max_new_tokens}", "max_new_tokens")


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one utterance (the publisher's generate arguments); baked into a Core AI frame graph.

    ``do_sample`` False is the publisher's greedy path: argmax everywhere, no RAS, noise ignored.
    RAS uses ``ras_temperature``/``ras_top_p`` from config.json and the same ``top_k``.
    """

    temperature: float = 0.7
    top_k: int = 50
    top_p: float = 0.9
    do_sample: bool = True
    ras_temperature: float = 1.0
    ras_top_p: float = 0.9

    @classmethod
    def from_configs(cls, cfg: ModelConfig, gen: GenerationConfig) -> SamplingParams:
        return cls(
            temperature=gen.temperature,
            top_k=gen.top_k,
            top_p=gen.top_p,
            do_sample=gen.do_sample,
            ras_temperature=cfg.ras_temperature,
            ras_top_p=cfg.ras_top_p,
        )


@dataclass(frozen=True)
class QuantizerTransformerConfig:
    """Window transformer of the codec's quantizer (pre_module / post_module)."""

    n_layer: int = 8
    n_head: int = 16
    intermediate_size: int = 3072
    window_size: int = 128


def _spec_int(value: Any, name: str, where: str) -> int:
    """``value`` of codec_spec.json's ``name`` as an int within :data:`CODEC_SIZE_LIMITS`; else ConfigError."""
    low, high = CODEC_SIZE_LIMITS[name]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{where}: {name} must be a whole number from {low} to {high}, got {value!r}", name)
    return value


@dataclass(frozen=True)
class CodecConfig:
    """Sizes of the DAC-style codec (SPEC.md section 8); defaults are the real 0.6b codec.

    ``hop_length`` is the encoder stride product (512 samples); a code frame is ``frame_length`` =
    ``hop_length * 4`` = 2048 samples at ``sample_rate`` 44100 Hz. The tiny oracle codec keeps the
    same blocks with fewer channels (``codec_spec.json``).
    """

    encoder_base_channels: int = 64
    encoder_strides: tuple[int, ...] = (2, 4, 8, 8)
    encoder_transformer_layers: tuple[int, ...] = (0, 0, 0, 4)
    encoder_transformer_window: int = 512
    encoder_transformer_intermediate_size: int = 3072
    latent_dim: int = 1024
    semantic_codebook_size: int = 4096
    residual_codebooks: int = 9
    residual_codebook_size: int = 1024
    codebook_dim: int = 8
    quantizer_transformer: QuantizerTransformerConfig = field(default_factory=QuantizerTransformerConfig)
    decoder_channels: int = 1536
    decoder_strides: tuple[int, ...] = (8, 8, 4, 2)
    sample_rate: int = 44100
    head_dim: int = 64

    @property
    def hop_length(self) -> int:
        """Encoder stride product in samples (512 for the real codec)."""
        n = 1
        for s in self.encoder_strides:
            n *= s
        return n

    @property
    def frame_length(self) -> int:
        """Samples per code frame: the encoder hop times the quantizer's 4x downsample (2048)."""
        return self.hop_length * 4

    @property
    def num_codebooks(self) -> int:
        return 1 + self.residual_codebooks

    @classmethod
    def from_spec(cls, d: dict[str, Any], where: str = "codec_spec.json") -> CodecConfig:
        """Parse a ``codec_spec.json`` (the oracle's format); missing keys take the 0.6b defaults.

        Raises :class:`ConfigError` naming the key (``quantizer_transformer.n_layer`` for a nested one) that is not
        a whole number within :data:`CODEC_SIZE_LIMITS`, a list of over :data:`MAX_CODEC_STRIDES` entries, or
        encoder strides and transformer depths of different lengths."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        base = cls()
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name == "quantizer_transformer":
                if not isinstance(v, dict):
                    raise ConfigError(f"{where}: quantizer_transformer should be an object", f.name)
                qt = dataclasses.asdict(base.quantizer_transformer)
                unknown = set(v) - set(qt)
                if unknown:
                    raise ConfigError(f"{where}: unknown quantizer_transformer keys {sorted(unknown)}", f.name)
                qt.update({k: _spec_int(x, f"{f.name}.{k}", where) for k, x in v.items()})
                v = QuantizerTransformerConfig(**qt)
            elif isinstance(getattr(base, f.name), tuple):
                if not isinstance(v, list) or not 1 <= len(v) <= MAX_CODEC_STRIDES:
                    raise ConfigError(f"{where}: '{f.name}' should be a list of 1 to {MAX_CODEC_STRIDES} integers")
                v = tuple(_spec_int(x, f.name, where) for x in v)
            else:
                v = _spec_int(v, f.name, where)
            values[f.name] = v
        # The encoder transformer (window 512) shares the quantizer transformer's FFN width unless given.
        if "encoder_transformer_intermediate_size" not in values and "quantizer_transformer" in values:
            values["encoder_transformer_intermediate_size"] = values["quantizer_transformer"].intermediate_size
        cfg = cls(**{**dataclasses.asdict(base), "quantizer_transformer": base.quantizer_transformer, **values})
        if len(cfg.encoder_strides) != len(cfg.encoder_transformer_layers):
            raise ConfigError(
                f"{where}: {len(cfg.encoder_strides)} encoder_strides but {len(cfg.encoder_transformer_layers)} "
                "encoder_transformer_layers: give one depth per encoder block",
                "encoder_transformer_layers",
            )
        return cfg
