"""The torch backend's frame: the maths of :class:`.graphs.Frame`, arranged for eager speed.

Same modules, same weights, same sampler; what changes is only how the work is issued:

* the slow step writes one KV slot and attends slots ``[0, pos]`` with no mask (one query, at the end);
* the fast AR's rows 0 and 1 run as **one 2-row pass** (row 0 is the slow hidden, row 1 the embedding of the
  semantic code: both are known before any fast draw), so a frame reads the fast AR's weights 9 times, not 10;
* the fast AR's keys and values go to a preallocated [n_fast_layer, B, n_kv, C, head_dim] buffer written in
  place, not concatenated row by row; the fast head runs on the one row that needs it;
* nothing is built per frame (no modules, no masks) and nothing leaves the device until the frame is done.

fp32 results equal :class:`.graphs.Frame`'s to float rounding (a 2-row matmul may round differently from two
1-row ones); the oracle parity test holds either way. Batched: every input carries a leading batch axis B.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .graphs import SamplingParams
from .model.dualar import DualAR
from .sampling import greedy, greedy_semantic, sample_semantic, sample_top_k_top_p


def _block_step(layer, x: Tensor, rope: Tensor, k_cache: Tensor, v_cache: Tensor, start: int,
                causal: bool) -> Tensor:
    """``layer`` (layers.Block) on ``x`` [B, S, dim] at slots ``start .. start+S-1`` of ``k_cache``/``v_cache``
    [B, n_kv, L, D] (written in place); queries attend slots ``[0, start+S)``, causally among themselves."""
    att = layer.attention
    q, k, v = att.qkv(layer.attention_norm(x), rope)
    end = start + x.shape[1]
    k_cache[:, :, start:end] = k.to(k_cache.dtype)
    v_cache[:, :, start:end] = v.to(v_cache.dtype)
    out = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end],
                                         is_causal=causal and start == 0 and end > 1,
                                         enable_gqa=att.n_head != att.n_kv)
    b, _, s, _ = out.shape
    h = x + att.wo(out.transpose(1, 2).reshape(b, s, att.n_head * att.head_dim))
    return h + layer.feed_forward(layer.ffn_norm(h))


def _block_step_rows(layer, x: Tensor, rope: Tensor, k_cache: Tensor, v_cache: Tensor, rows: Sequence[int],
                     positions: Sequence[int], gathered: tuple[Tensor, Tensor, Tensor] | None) -> Tensor:
    """``layer`` on one column per utterance, ``x`` [n, 1, dim]: utterance j lives in row ``rows[j]`` of
    ``k_cache``/``v_cache`` [max_batch, n_kv, L, D], writes its slot ``positions[j]`` (in place) and attends its
    slots ``[0, positions[j]]``. The linears run on all n at once (the weights are read once). Attention, a small
    part of a step, runs either per utterance exactly as the batch-1 step does (``gathered`` None: the CPU way,
    no copies), or in one call on the utterances' rows gathered up to the longest and a key mask (``gathered`` =
    (rows int64 [n], positions int64 [n], mask bool [n, 1, 1, K]): the GPU way, one launch instead of n)."""
    att = layer.attention
    q, k, v = att.qkv(layer.attention_norm(x), rope)
    gqa = att.n_head != att.n_kv
    if gathered is None:
        outs = []
        for j, (r, p) in enumerate(zip(rows, positions)):
            k_cache[r, :, p] = k[j, :, 0].to(k_cache.dtype)
            v_cache[r, :, p] = v[j, :, 0].to(v_cache.dtype)
            outs.append(F.scaled_dot_product_attention(q[j:j + 1], k_cache[r:r + 1, :, :p + 1],
                                                       v_cache[r:r + 1, :, :p + 1], enable_gqa=gqa))
        out = torch.cat(outs)
    else:
        row_t, pos_t, mask = gathered
        k_cache[row_t, :, pos_t] = k[:, :, 0].to(k_cache.dtype)
        v_cache[row_t, :, pos_t] = v[:, :, 0].to(v_cache.dtype)
        end = mask.shape[-1]
        out = F.scaled_dot_product_attention(q, k_cache[row_t, :, :end], v_cache[row_t, :, :end], attn_mask=mask,
                                             enable_gqa=gqa)
    b, _, s, _ = out.shape
    h = x + att.wo(out.transpose(1, 2).reshape(b, s, att.n_head * att.head_dim))
    return h + layer.feed_forward(layer.ffn_norm(h))


class FastFrame:
    """One model's frame runner (batch ``batch``): :meth:`slow_step`, :meth:`sample` and :meth:`frame`.

    Owns the fast AR's per-frame KV buffer; the slow AR's KV state is the caller's (passed to each call).
    """

    def __init__(self, model: DualAR, batch: int = 1):
        cfg = model.cfg
        self.model, self.cfg = model, cfg
        fast = model.fast
        self.fast_dtype = fast.fast_norm.weight.dtype  # the activations (embeddings may be stored lower)
        dev = fast.fast_norm.weight.device
        shape = (cfg.n_fast_layer, batch, cfg.fast_n_local_heads, cfg.num_codebooks, cfg.fast_head_dim)
        self.fast_k = torch.zeros(shape, dtype=self.fast_dtype, device=dev)
        self.fast_v = torch.zeros(shape, dtype=self.fast_dtype, device=dev)
        # Batched steps at several positions: attention per row on the CPU, gathered in one call on a GPU
        # (where each call is a kernel launch); see _block_step_rows.
        self.gather_attention = dev.type == "cuda"

    # --- slow AR ---------------------------------------------------------------------------------------

    def slow_step(self, column: Tensor, pos: int, k_cache: Tensor, v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """The slow AR on one column int [B, 1+C, 1] at slot and RoPE position ``pos`` (batch-uniform).

        Writes KV slot ``pos`` of every layer of ``k_cache``/``v_cache`` [n_layer, B, n_kv, L, D]. Returns the
        compact logits [B, V+1] and the post-norm hidden [B, dim].
        """
        slow = self.model.slow
        x = slow.embed(column)
        rope = slow.rope[pos:pos + 1].unsqueeze(0)
        for i, layer in enumerate(slow.layers):
            x = _block_step(layer, x, rope, k_cache[i], v_cache[i], pos, causal=False)
        hidden = slow.norm(x)
        return slow.head(hidden)[:, 0], hidden[:, 0]

    def slow_step_rows(self, column: Tensor, rows: Sequence[int], positions: Sequence[int], k_cache: Tensor,
                       v_cache: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`slow_step` for n utterances at their own points: column int [n, 1+C, 1], utterance j in row
        ``rows[j]`` of ``k_cache``/``v_cache`` [n_layer, max_batch, n_kv, L, D] at slot and RoPE position
        ``positions[j]`` (see :func:`_block_step_rows`). Returns logits [n, V+1] and hidden [n, dim]; each row's
        equal to its batch-1 step's up to the rounding of the batched matmuls."""
        slow = self.model.slow
        x = slow.embed(column)
        rope = slow.rope[list(positions)].unsqueeze(1)
        gathered = None
        if self.gather_attention:
            dev = column.device
            pos_t = torch.tensor(list(positions), device=dev)
            mask = (torch.arange(max(positions) + 1, device=dev)[None, :] <= pos_t[:, None])[:, None, None]
            gathered = (torch.tensor(list(rows), device=dev), pos_t, mask)
        for i, layer in enumerate(slow.layers):
            x = _block_step_rows(layer, x, rope, k_cache[i], v_cache[i], rows, positions, gathered)
        hidden = slow.norm(x)
        return slow.head(hidden)[:, 0], hidden[:, 0]

    # --- fast AR ---------------------------------------------------------------------------------------

    def _fast_pass(self, x: Tensor, row: int) -> Tensor:
        """Fast-AR rows ``row .. row+S-1`` from ``x`` [B, S, dim]; logits of the last row [B, codebook_size]."""
        fast = self.model.fast
        rope = fast.rope[row:row + x.shape[1]].unsqueeze(0)
        for i, layer in enumerate(fast.fast_layers):
            x = _block_step(layer, x, rope, self.fast_k[i], self.fast_v[i], row, causal=True)
        return fast.fast_output(fast.fast_norm(x[:, -1:]))[:, 0]

    def fast_rows(self, hidden: Tensor, code: Tensor,
                  draw: Callable[[int, Tensor], Tensor]) -> list[Tensor]:
        """Rows 0 (``hidden`` [B, dim]) and 1 (code int [B]) in one pass, then rows 2..C-1, each fed the code
        ``draw(row, logits)`` returns for the previous row. Returns the logits of rows 1..C-1."""
        fast = self.model.fast
        x = torch.stack([hidden.to(self.fast_dtype), fast.fast_embeddings(code)], dim=1)
        logits = [self._fast_pass(x, 0)]
        for row in range(2, self.cfg.num_codebooks):
            code = draw(row - 1, logits[-1])
            logits.append(self._fast_pass(fast.fast_embeddings(code).unsqueeze(1), row))
        draw(self.cfg.num_codebooks - 1, logits[-1])
        return logits

    # --- the frame -------------------------------------------------------------------------------------

    def sample(self, params: SamplingParams, logits: Tensor, hidden: Tensor, noise_slow: Tensor, window: Tensor,
               noise_fast: Tensor, forced: Tensor, use_forced: Tensor) -> tuple[Tensor, ...]:
        """:class:`.graphs.FirstFrame` on slow ``logits`` [B, V+1] and ``hidden`` [B, dim]: same inputs, same
        outputs (semantic, codes, fast_logits, sampled_semantic, sampled_codes)."""
        cfg, p = self.cfg, params
        if p.do_sample:
            sampled_sem, _, _ = sample_semantic(
                logits, noise_slow, window, top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                ras_top_p=p.ras_top_p, ras_temperature=p.ras_temperature,
                semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id, eager=True)
        else:
            sampled_sem = greedy_semantic(logits, semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id)
        mix = use_forced.to(torch.long)
        semantic = sampled_sem + mix * (forced[:, 0] - sampled_sem)
        code = (semantic - cfg.semantic_begin_id).clamp(0, cfg.codebook_size - 1)
        sampled, kept = [code], [code]

        def draw(row: int, lg: Tensor) -> Tensor:
            if p.do_sample:
                drawn = sample_top_k_top_p(lg, noise_fast[:, row - 1], p.top_k, p.top_p, p.temperature,
                                           eager=True)
            else:
                drawn = greedy(lg)
            sampled.append(drawn)
            kept.append(drawn + mix * (forced[:, 1 + row] - drawn))
            return kept[-1]

        fast_logits = self.fast_rows(hidden, code, draw)
        return (semantic, torch.stack(kept, 1), torch.stack(fast_logits, 1), sampled_sem, torch.stack(sampled, 1))

    def frame(self, params: SamplingParams, column: Tensor, pos: int, k_cache: Tensor, v_cache: Tensor,
              noise_slow: Tensor, window: Tensor, noise_fast: Tensor, forced: Tensor,
              use_forced: Tensor) -> tuple[Tensor, ...]:
        """:class:`.graphs.Frame`: the slow step on ``column`` then :meth:`sample`; its outputs plus the slow
        logits and hidden."""
        logits, hidden = self.slow_step(column, pos, k_cache, v_cache)
        return (*self.sample(params, logits, hidden, noise_slow, window, noise_fast, forced, use_forced),
                logits, hidden)


def frame_parts(runner: FastFrame, params: SamplingParams, pos: int, k_cache: Tensor,
                v_cache: Tensor) -> dict[str, Callable[[], object]]:
    """The parts of :meth:`FastFrame.frame` as callables timed alone by the benchmark: ``slow`` (the slow step
    at slot ``pos``, writing that slot), ``fast`` (the fast AR's rows, each fed code 0: no sampling) and
    ``sampler`` (the semantic draw with RAS and the codebook draws of a frame, on fixed logits)."""
    cfg = runner.cfg
    dev = k_cache.device
    col = torch.zeros(1, cfg.num_codebooks + 1, 1, dtype=torch.long, device=dev)
    col[0, 0] = cfg.semantic_begin_id
    hidden = torch.randn(1, cfg.dim, device=dev)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    logits = torch.randn(1, cfg.num_semantic + 1, device=dev) * 3
    fast_logits = torch.randn(1, cfg.codebook_size, device=dev) * 3
    noise = torch.rand(1, 2, cfg.num_semantic + 1, device=dev).clamp(min=1e-6)
    noise_fast = torch.rand(1, cfg.num_codebooks - 1, cfg.codebook_size, device=dev).clamp(min=1e-6)
    window = torch.full((1, cfg.ras_window_size), -1, dtype=torch.long, device=dev)
    p = params

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    @torch.inference_mode()
    def slow():
        runner.slow_step(col, pos, k_cache, v_cache)
        sync()

    @torch.inference_mode()
    def fast():
        runner.fast_rows(hidden, zero, lambda row, lg: zero)
        sync()

    @torch.inference_mode()
    def sampler():
        sample_semantic(logits, noise, window, top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                        ras_top_p=p.ras_top_p, ras_temperature=p.ras_temperature,
                        semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id, eager=True)
        for row in range(cfg.num_codebooks - 1):
            sample_top_k_top_p(fast_logits, noise_fast[:, row], p.top_k, p.top_p, p.temperature, eager=True)
        sync()

    return {"slow": slow, "fast": fast, "sampler": sampler}
