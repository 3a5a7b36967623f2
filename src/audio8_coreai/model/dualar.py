"""Slow AR and fast AR of the DualAR language model (SPEC.md section 4)."""

from __future__ import annotations

from ..config import ModelConfig


def dualar_param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of ``model.safetensors`` in the publisher's names, with its shape ([out, in]).

    Matches the publisher's module tree (SPEC.md section 3.1): no ``model.`` prefix, no lm_head (tied),
    no ``fast_project_in`` (identity since ``fast_dim == dim``), RoPE tables not stored.
    """
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.weight": (cfg.vocab_size, cfg.dim),
        "codebook_embeddings.weight": (cfg.codebook_size * cfg.num_codebooks, cfg.dim),
    }

    def block(prefix: str, dim: int, n_head: int, n_kv: int, head_dim: int, ffn: int,
              qkv_bias: bool, o_bias: bool, qk_norm: bool) -> None:
        qkv = (n_head + 2 * n_kv) * head_dim
        shapes[f"{prefix}.attention.wqkv.weight"] = (qkv, dim)
        if qkv_bias:
            shapes[f"{prefix}.attention.wqkv.bias"] = (qkv,)
        shapes[f"{prefix}.attention.wo.weight"] = (dim, n_head * head_dim)
        if o_bias:
            shapes[f"{prefix}.attention.wo.bias"] = (dim,)
        if qk_norm:
            shapes[f"{prefix}.attention.q_norm.weight"] = (head_dim,)
            shapes[f"{prefix}.attention.k_norm.weight"] = (head_dim,)
        shapes[f"{prefix}.feed_forward.w1.weight"] = (ffn, dim)
        shapes[f"{prefix}.feed_forward.w3.weight"] = (ffn, dim)
        shapes[f"{prefix}.feed_forward.w2.weight"] = (dim, ffn)
        shapes[f"{prefix}.attention_norm.weight"] = (dim,)
        shapes[f"{prefix}.ffn_norm.weight"] = (dim,)

    for i in range(cfg.n_layer):
        block(f"layers.{i}", cfg.dim, cfg.n_head, cfg.n_local_heads, cfg.head_dim, cfg.intermediate_size,
              cfg.attention_qkv_bias, cfg.attention_o_bias, cfg.attention_qk_norm)
    shapes["norm.weight"] = (cfg.dim,)
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.dim)
    shapes["fast_embeddings.weight"] = (cfg.codebook_size, cfg.fast_dim)
    for j in range(cfg.n_fast_layer):
        block(f"fast_layers.{j}", cfg.fast_dim, cfg.fast_n_head, cfg.fast_n_local_heads, cfg.fast_head_dim,
              cfg.fast_intermediate_size, cfg.fast_attention_qkv_bias, cfg.fast_attention_o_bias,
              cfg.fast_attention_qk_norm)
    shapes["fast_norm.weight"] = (cfg.fast_dim,)
    shapes["fast_output.weight"] = (cfg.codebook_size, cfg.fast_dim)
    return shapes
