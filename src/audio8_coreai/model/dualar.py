"""Slow AR and fast AR of the DualAR language model (SPEC.md section 4)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import BlockShape, ModelConfig
from ..sampling import Draws, draws
from .layers import Block, Embedding, KVStep, RMSNorm, SpanKV, rope_rotation, rope_table


def dualar_param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of ``model.safetensors`` in the publisher's names, with its shape ([out, in]).

    Matches the publisher's module tree (SPEC.md section 3.1): no ``model.`` prefix, no lm_head (tied),
    no ``fast_project_in`` (identity since ``fast_dim == dim``), RoPE tables not stored.
    """
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.weight": (cfg.vocab_size, cfg.dim),
        "codebook_embeddings.weight": (cfg.codebook_size * cfg.num_codebooks, cfg.dim),
    }

    def block(prefix: str, s: BlockShape) -> None:
        qkv = (s.n_head + 2 * s.n_kv) * s.head_dim
        shapes[f"{prefix}.attention.wqkv.weight"] = (qkv, s.dim)
        if s.qkv_bias:
            shapes[f"{prefix}.attention.wqkv.bias"] = (qkv,)
        shapes[f"{prefix}.attention.wo.weight"] = (s.dim, s.n_head * s.head_dim)
        if s.o_bias:
            shapes[f"{prefix}.attention.wo.bias"] = (s.dim,)
        if s.qk_norm:
            shapes[f"{prefix}.attention.q_norm.weight"] = (s.head_dim,)
            shapes[f"{prefix}.attention.k_norm.weight"] = (s.head_dim,)
        shapes[f"{prefix}.feed_forward.w1.weight"] = (s.ffn, s.dim)
        shapes[f"{prefix}.feed_forward.w3.weight"] = (s.ffn, s.dim)
        shapes[f"{prefix}.feed_forward.w2.weight"] = (s.dim, s.ffn)
        shapes[f"{prefix}.attention_norm.weight"] = (s.dim,)
        shapes[f"{prefix}.ffn_norm.weight"] = (s.dim,)

    for i in range(cfg.n_layer):
        block(f"layers.{i}", cfg.slow_block)
    shapes["norm.weight"] = (cfg.dim,)
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.dim)
    shapes["fast_embeddings.weight"] = (cfg.codebook_size, cfg.fast_dim)
    for j in range(cfg.n_fast_layer):
        block(f"fast_layers.{j}", cfg.fast_block)
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
        self.embeddings = Embedding(cfg.vocab_size, cfg.dim)
        self.codebook_embeddings = Embedding(cfg.codebook_size * cfg.num_codebooks, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg.slow_block) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.num_semantic + 1, bias=False)
        self.register_buffer("rope", rope_table(cfg.max_seq_len, cfg.head_dim, cfg.rope_base), persistent=False)
        self.register_buffer(
            "codebook_offsets",
            torch.arange(cfg.num_codebooks, dtype=torch.long, device="cpu") * cfg.codebook_size,  # CPU as rope_table
            persistent=False,
        )

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

    def forward(
        self, codes: Tensor, rope_pos: Tensor | int, k_cache: Tensor, v_cache: Tensor, kv: KVStep
    ) -> tuple[Tensor, Tensor]:
        """Run S columns through the slow AR, writing the KV cache in place.

        Args:
            codes: int [B, 1 + num_codebooks, S] code columns.
            rope_pos: int64 [B, S] RoPE positions (the publisher's position ids), or an int: the first of S
                consecutive positions shared by the batch.
            k_cache, v_cache: [n_layer, B, n_kv, L, head_dim] state, written as ``kv`` says.
            kv: where the columns' keys and values go and what they attend (see :class:`.layers.KVStep`).
        Returns:
            compact logits [B, S, num_semantic + 1] and post-norm hidden [B, S, dim], model dtype.
        """
        x = self.embed(codes)
        if isinstance(rope_pos, Tensor):
            rotation = rope_rotation(self.rope[rope_pos])
        else:
            rotation = rope_rotation(self.rope[rope_pos : rope_pos + codes.shape[-1]].unsqueeze(0))
        delta = None
        for i, layer in enumerate(self.layers):
            # A slice i:i+1, not an index: an in-place write through an indexed view exports as a masked
            # copy of the whole state.
            x, delta = layer(x, delta, rotation, k_cache[i : i + 1], v_cache[i : i + 1], kv)
        hidden = self.norm.add(x, delta)[1]
        return self.head(hidden), hidden


class FastAR(nn.Module):
    """The fast AR: ``n_fast_layer`` blocks over the frame's rows, a per-frame KV buffer, nothing kept between
    frames (fish-speech's ``forward_generate_fast`` form).

    Row 0 is the slow AR's post-norm hidden (its logits are discarded by the publisher); row p >= 1 is
    ``fast_embeddings[c_{p-1}]`` and its output predicts codebook p. One embedding table and one head
    serve every codebook.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.fast_embeddings = Embedding(cfg.codebook_size, cfg.fast_dim)
        self.fast_layers = nn.ModuleList(Block(cfg.fast_block) for _ in range(cfg.n_fast_layer))
        self.fast_norm = RMSNorm(cfg.fast_dim, cfg.norm_eps)
        self.fast_output = nn.Linear(cfg.fast_dim, cfg.codebook_size, bias=False)
        self.register_buffer("rope", rope_table(cfg.num_codebooks, cfg.fast_head_dim, cfg.rope_base), persistent=False)

    def forward(self, x: Tensor, row: int, k_buf: Tensor, v_buf: Tensor) -> Tensor:
        """Rows ``row .. row+S-1`` of the frame from ``x`` [B, S, fast_dim] (row 0: the slow hidden; row p >= 1:
        the embedding of code p-1), keys and values written into the per-frame buffer ``k_buf``/``v_buf``
        [n_fast_layer, B, n_kv, num_codebooks, D] at those rows; each row attends rows ``[0, its own]``.
        Returns the logits of the last row [B, codebook_size] (it predicts codebook ``row + S - 1``)."""
        s = x.shape[1]
        rotation = rope_rotation(self.rope[row : row + s].unsqueeze(0))
        kv = SpanKV(row, row + s, causal=s > 1)
        if s > 1 and row != 0:
            raise ValueError(f"several fast-AR rows in one pass must start at row 0, not {row}")
        delta = None
        for i, layer in enumerate(self.fast_layers):
            x, delta = layer(x, delta, rotation, k_buf[i : i + 1], v_buf[i : i + 1], kv)
        last = self.fast_norm.add(x[:, -1:], None if delta is None else delta[:, -1:])[1]
        return self.fast_output(last)[:, 0]

    def new_kv_buffer(self, batch: int = 1) -> tuple[Tensor, Tensor]:
        """A zeroed per-frame KV buffer (k, v), each [n_fast_layer, batch, n_kv, num_codebooks, D], activation
        dtype (the embeddings may be stored lower)."""
        cfg = self.cfg
        p = self.fast_norm.weight
        shape = (cfg.n_fast_layer, batch, cfg.fast_n_local_heads, cfg.num_codebooks, cfg.fast_head_dim)
        return torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device)


class DualAR(nn.Module):
    """Slow AR + fast AR with weights in the publisher's names (see :func:`dualar_param_shapes`), and ``draws``: how
    the frame's sampler draws over its candidates (:func:`..sampling.draws`, or a fused kernel of the same maths)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.slow = SlowAR(cfg)
        self.fast = FastAR(cfg)
        # the sampler's draws over its candidates (sampling.draws; a fused kernel where one is installed)
        self.draws: Draws = draws

    @classmethod
    def from_state_dict(
        cls,
        cfg: ModelConfig,
        state: dict[str, Tensor],
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> DualAR:
        """Build from a validated ``model.safetensors`` dict (publisher names) in ``dtype`` on ``device``; a tensor
        already in ``dtype`` on ``device`` is used as it is (not copied), so a mapped checkpoint stays mapped.

        The compact head is ``embeddings.weight`` rows ``semantic_begin_id..semantic_end_id`` then
        ``eos_token_id`` (or ``output.weight`` rows when embeddings are not tied).
        Raises ValueError naming missing or unexpected tensors.
        """
        expected = dualar_param_shapes(cfg)
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        if missing or unexpected:
            raise ValueError(
                f"model tensors do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
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
                t = state[src]
                if t.dtype == dtype and t.device == params[dst].device:
                    # the stored tensor itself (a view of the mapped file): no second copy of the weights; the
                    # empty allocation it replaces was never touched, so it never became resident
                    params[dst].data = t
                else:
                    params[dst].copy_(t.to(dtype))
            head_src = state["embeddings.weight" if cfg.tie_word_embeddings else "output.weight"]
            rows = torch.cat(
                [
                    head_src[cfg.semantic_begin_id : cfg.semantic_end_id + 1],
                    head_src[cfg.eos_token_id : cfg.eos_token_id + 1],
                ]
            )
            params["slow.head.weight"].copy_(rows.to(dtype))
            # Buffers were allocated on meta; rebuild them (RoPE tables stay fp32, bf16-rounded).
            model.slow.rope = rope_table(cfg.max_seq_len, cfg.head_dim, cfg.rope_base).to(device)
            model.slow.codebook_offsets = (
                torch.arange(cfg.num_codebooks, dtype=torch.long, device=device) * cfg.codebook_size
            )
            model.fast.rope = rope_table(cfg.num_codebooks, cfg.fast_head_dim, cfg.rope_base).to(device)
        for p in model.parameters():
            p.data = p.data.to(dtype)
        return model.eval().requires_grad_(False)

    def new_kv_cache(self, batch: int = 1, length: int | None = None) -> tuple[Tensor, Tensor]:
        """Zeroed KV state (k, v), each [n_layer, batch, n_kv, length or max_seq_len, head_dim], model dtype."""
        cfg = self.cfg
        p = self.slow.norm.weight  # the head and embeddings may be quantized modules (backends/torch/quantize.py)
        shape = (cfg.n_layer, batch, cfg.n_local_heads, length or cfg.max_seq_len, cfg.head_dim)
        return torch.zeros(shape, dtype=p.dtype, device=p.device), torch.zeros(shape, dtype=p.dtype, device=p.device)
