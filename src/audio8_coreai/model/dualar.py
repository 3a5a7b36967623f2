"""Slow AR and fast AR of the DualAR language model (SPEC.md section 4)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import ModelConfig
from .layers import Block, RMSNorm, rope_table


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


class SlowAR(nn.Module):
    """The slow AR: code-column embedding, ``n_layer`` blocks over a static KV cache, the compact head.

    The head has ``num_semantic + 1`` rows (semantic ids in order, then eos) copied from the tied
    embedding: exact, because the publisher masks every other id before sampling (DESIGN.md principle 3).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.codebook_embeddings = nn.Embedding(cfg.codebook_size * cfg.num_codebooks, cfg.dim)
        self.layers = nn.ModuleList(
            Block(cfg.dim, cfg.n_head, cfg.n_local_heads, cfg.head_dim, cfg.intermediate_size, cfg.norm_eps,
                  cfg.attention_qkv_bias, cfg.attention_o_bias)
            for _ in range(cfg.n_layer)
        )
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.num_semantic + 1, bias=False)
        self.register_buffer("rope", rope_table(cfg.max_seq_len, cfg.head_dim, cfg.rope_base), persistent=False)
        self.register_buffer("codebook_offsets",
                             torch.arange(cfg.num_codebooks, dtype=torch.long) * cfg.codebook_size,
                             persistent=False)

    def embed(self, codes: Tensor) -> Tensor:
        """Code columns int [B, 1 + num_codebooks, S] -> embeddings [B, S, dim] (model dtype).

        Matches the publisher's ``_embed``: ``E[row0]`` plus, only where row 0 is a semantic id, the sum
        of the codebook embeddings ``CB[c_i + codebook_size * i]`` of rows 1..num_codebooks.
        """
        cfg = self.cfg
        ids = codes[:, 0].long()
        x = self.embeddings(ids)
        cb = self.codebook_embeddings(codes[:, 1:].long().transpose(1, 2) + self.codebook_offsets)
        is_sem = ((ids >= cfg.semantic_begin_id) & (ids <= cfg.semantic_end_id)).to(x.dtype)
        return x + cb.sum(dim=2) * is_sem.unsqueeze(-1)

    def forward(self, codes: Tensor, rope_pos: Tensor, slots: Tensor, mask: Tensor, k_cache: Tensor,
                v_cache: Tensor, kv_len: int | None = None, index_write: bool = False) -> tuple[Tensor, Tensor]:
        """Run S columns through the slow AR, writing the KV cache in place.

        Args:
            codes: int [B, 1 + num_codebooks, S] code columns.
            rope_pos: int64 [B, S] RoPE positions (the publisher's position ids).
            slots: int64 [S] cache slots the columns are written to; consecutive when ``kv_len`` is None.
            mask: bool [B or 1, 1, S, L], True where a query may attend a cache slot.
            k_cache, v_cache: [n_layer, B, n_kv, L, head_dim] state, written at ``slots``.
            kv_len: attend only slots [0, kv_len) (eager speed-up); None = all L (static graph).
            index_write: write ``slots`` with ``index_copy_`` even when ``kv_len`` is None, instead of one slice
                from ``slots[0]`` read on the host (which torch.export needs): a CUDA graph captures no host
                read, and its slot must stay an input.
        Returns:
            compact logits [B, S, num_semantic + 1] and post-norm hidden [B, S, dim], model dtype.
        """
        x = self.embed(codes)
        rope = self.rope[rope_pos]
        write: Tensor | int = slots
        if kv_len is None and not index_write:
            # The static graph writes one slice from the first slot (see write_kv); the checks bound the
            # traced start so torch.export accepts the slice.
            write = slots[0].item()
            torch._check(write >= 0)
            torch._check(write + codes.shape[-1] <= k_cache.shape[3])
        for i, layer in enumerate(self.layers):
            # A slice i:i+1, not an index: an in-place write through an indexed view exports as a masked
            # copy of the whole state.
            x = layer.forward_cached(x, rope, k_cache[i:i + 1], v_cache[i:i + 1], write, mask, kv_len)
        hidden = self.norm(x)
        return self.head(hidden), hidden


class FastAR(nn.Module):
    """The fast AR: ``n_fast_layer`` blocks over the frame's rows, no state kept between frames.

    Row 0 is the slow AR's post-norm hidden (its logits are discarded by the publisher); row p >= 1 is
    ``fast_embeddings[c_{p-1}]`` and its output predicts codebook p. One embedding table and one head
    serve every codebook.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.fast_embeddings = nn.Embedding(cfg.codebook_size, cfg.fast_dim)
        self.fast_layers = nn.ModuleList(
            Block(cfg.fast_dim, cfg.fast_n_head, cfg.fast_n_local_heads, cfg.fast_head_dim,
                  cfg.fast_intermediate_size, cfg.norm_eps, cfg.fast_attention_qkv_bias,
                  cfg.fast_attention_o_bias)
            for _ in range(cfg.n_fast_layer)
        )
        self.fast_norm = RMSNorm(cfg.fast_dim, cfg.norm_eps)
        self.fast_output = nn.Linear(cfg.fast_dim, cfg.codebook_size, bias=False)
        self.register_buffer("rope", rope_table(cfg.num_codebooks, cfg.fast_head_dim, cfg.rope_base),
                             persistent=False)

    def start(self, hidden: Tensor) -> list[list[Tensor]]:
        """Prime the per-frame rows with row 0 = ``hidden`` [B, dim]; returns the rows' k/v per layer."""
        past: list[list[Tensor]] = [[] for _ in self.fast_layers]
        self._row(hidden.unsqueeze(1), 0, past)
        return past

    def step(self, code: Tensor, row: int, past: list[list[Tensor]]) -> Tensor:
        """Row ``row`` (1..num_codebooks-1) fed code int [B]; returns logits [B, codebook_size]."""
        x = self._row(self.fast_embeddings(code.long()).unsqueeze(1), row, past)
        return self.fast_output(self.fast_norm(x))[:, 0]

    def _row(self, x: Tensor, row: int, past: list[list[Tensor]]) -> Tensor:
        rope = self.rope[row:row + 1].unsqueeze(0)
        for layer, kv in zip(self.fast_layers, past):
            x = layer.forward_concat(x, rope, kv)
        return x


class DualAR(nn.Module):
    """Slow AR + fast AR with weights in the publisher's names (see :func:`dualar_param_shapes`)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.slow = SlowAR(cfg)
        self.fast = FastAR(cfg)

    @classmethod
    def from_state_dict(cls, cfg: ModelConfig, state: dict[str, Tensor], dtype: torch.dtype = torch.float32,
                        device: torch.device | str = "cpu") -> "DualAR":
        """Build from a validated ``model.safetensors`` dict (publisher names) in ``dtype`` on ``device``.

        The compact head is ``embeddings.weight`` rows ``semantic_begin_id..semantic_end_id`` then
        ``eos_token_id`` (or ``output.weight`` rows when embeddings are not tied).
        Raises ValueError naming missing or unexpected tensors.
        """
        expected = dualar_param_shapes(cfg)
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(f"model tensors do not match the config: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
        with torch.device("meta"):
            model = cls(cfg).to(dtype)  # allocated in ``dtype``: a bf16 build never holds fp32 weights
        model = model.to_empty(device=device)
        mapping = {}
        for name in expected:
            if name.startswith(("fast_",)):
                mapping[name] = "fast." + name
            elif name != "output.weight":
                mapping[name] = "slow." + name
        params = dict(model.named_parameters())
        with torch.no_grad():
            for src, dst in mapping.items():
                params[dst].copy_(state[src].to(dtype))
            head_src = state["embeddings.weight" if cfg.tie_word_embeddings else "output.weight"]
            rows = torch.cat([head_src[cfg.semantic_begin_id:cfg.semantic_end_id + 1],
                              head_src[cfg.eos_token_id:cfg.eos_token_id + 1]])
            params["slow.head.weight"].copy_(rows.to(dtype))
            # Buffers were allocated on meta; rebuild them (RoPE tables stay fp32, bf16-rounded).
            model.slow.rope = rope_table(cfg.max_seq_len, cfg.head_dim, cfg.rope_base).to(device)
            model.slow.codebook_offsets = (torch.arange(cfg.num_codebooks, dtype=torch.long, device=device)
                                           * cfg.codebook_size)
            model.fast.rope = rope_table(cfg.num_codebooks, cfg.fast_head_dim, cfg.rope_base).to(device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.eval().requires_grad_(False)

    def new_kv_cache(self, batch: int = 1, length: int | None = None) -> tuple[Tensor, Tensor]:
        """Zeroed KV state (k, v), each [n_layer, batch, n_kv, length or max_seq_len, head_dim], model dtype."""
        cfg = self.cfg
        p = self.slow.norm.weight  # the head and embeddings may be quantized modules (model/quant.py)
        shape = (cfg.n_layer, batch, cfg.n_local_heads, length or cfg.max_seq_len, cfg.head_dim)
        return torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device)
