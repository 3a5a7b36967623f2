"""The exported functions of the DualAR: prefill, first_frame and frame (DESIGN.md, PORT-NOTES.md section 2).

Each is a plain ``nn.Module`` with static shapes and no Python control flow on tensor values, so the
same code runs eagerly in PyTorch and converts to Core AI. Randomness is an input (uniform noise), the
RAS window is an input owned by the host, and teacher forcing (``forced``/``use_forced``) lets one
pass measure both the logits and the sampler against a recording.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .config import GenerationConfig, ModelConfig
from .model.dualar import DualAR
from .model.layers import causal_cache_mask
from .sampling import greedy, greedy_semantic, sample_semantic, sample_top_k_top_p

PREFILL_WIDTH = 32


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings baked into a frame graph (the publisher's generate arguments).

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
    def from_configs(cls, cfg: ModelConfig, gen: GenerationConfig) -> "SamplingParams":
        return cls(temperature=gen.temperature, top_k=gen.top_k, top_p=gen.top_p, do_sample=gen.do_sample,
                   ras_temperature=cfg.ras_temperature, ras_top_p=cfg.ras_top_p)


class Prefill(nn.Module):
    """``prefill(codes [B, 11, W] int, pos [1] int) -> (logits [B, W, V+1], hidden [B, W, dim])``.

    Writes the KV state at slots ``pos .. pos+W-1``; RoPE positions equal the slots (single stream).
    Padding columns past the prompt's end are harmless: later frames overwrite their slots before any
    query at or above them attends there. ``index_write``: see ``SlowAR.forward`` (True for a CUDA graph).
    """

    def __init__(self, model: DualAR, index_write: bool = False):
        super().__init__()
        self.model = model
        self.index_write = index_write

    def forward(self, codes: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor,
                kv_len: int | None = None) -> tuple[Tensor, Tensor]:
        width = codes.shape[-1]
        slots = pos.long() + torch.arange(width, device=codes.device)
        mask = causal_cache_mask(pos, width, k_cache.shape[3])
        return self.model.slow(codes, slots.expand(codes.shape[0], width), slots, mask, k_cache, v_cache, kv_len,
                               self.index_write)


class FirstFrame(nn.Module):
    """Sample one frame from slow logits/hidden: the semantic draw with RAS, then the unrolled fast AR.

    Inputs: logits [B, V+1], hidden [B, dim] (the slow AR's last row), noise_slow [B, 2, V+1] float32,
    window [B, W] int64 vocab ids (-1 = empty), noise_fast [B, C-1, codebook_size] float32 (C =
    num_codebooks), forced [B, 1+C] int64 (a column: semantic id, c_0..c_{C-1}) and use_forced [B]
    float32 (1 = take ``forced`` instead of the draws, 0 = free run).
    Returns (semantic [B] id, codes [B, C], fast_logits [B, C-1, codebook_size], sampled_semantic [B],
    sampled_codes [B, C]); codes[:, 0] is the semantic code (eos -> 0), as the publisher's generate.
    """

    def __init__(self, model: DualAR, params: SamplingParams):
        super().__init__()
        self.model = model
        self.params = params

    def forward(self, logits: Tensor, hidden: Tensor, noise_slow: Tensor, window: Tensor, noise_fast: Tensor,
                forced: Tensor, use_forced: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        cfg, p = self.model.cfg, self.params
        if p.do_sample:
            sampled_sem, _, _ = sample_semantic(
                logits, noise_slow, window, top_k=p.top_k, top_p=p.top_p, temperature=p.temperature,
                ras_top_p=p.ras_top_p, ras_temperature=p.ras_temperature,
                semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id)
        else:
            sampled_sem = greedy_semantic(logits, semantic_begin_id=cfg.semantic_begin_id, eos_id=cfg.eos_token_id)
        mix = use_forced.to(torch.long)
        semantic = sampled_sem + mix * (forced[:, 0] - sampled_sem)
        code = (semantic - cfg.semantic_begin_id).clamp(0, cfg.codebook_size - 1)
        sampled_codes = [code]
        codes = [code]
        fast_logits = []
        past = self.model.fast.start(hidden)
        for row in range(1, cfg.num_codebooks):
            lg = self.model.fast.step(code, row, past)
            fast_logits.append(lg)
            if p.do_sample:
                drawn = sample_top_k_top_p(lg, noise_fast[:, row - 1], p.top_k, p.top_p, p.temperature)
            else:
                drawn = greedy(lg)
            code = drawn + mix * (forced[:, 1 + row] - drawn)
            sampled_codes.append(drawn)
            codes.append(code)
        return (semantic, torch.stack(codes, 1), torch.stack(fast_logits, 1), sampled_sem,
                torch.stack(sampled_codes, 1))


class Frame(nn.Module):
    """One slow step on the previous column, then :class:`FirstFrame` on its output: one call per frame.

    Inputs: column [B, 1+C, 1] int64 (previous frame: semantic id, c_0..c_{C-1}), pos [1] int64 (its
    slot and RoPE position), then FirstFrame's tail inputs. Returns FirstFrame's outputs plus the slow
    logits [B, V+1] and hidden [B, dim] of this step. ``index_write``: see :class:`Prefill`.
    """

    def __init__(self, model: DualAR, params: SamplingParams, index_write: bool = False):
        super().__init__()
        self.prefill = Prefill(model, index_write)
        self.sample = FirstFrame(model, params)

    def forward(self, column: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor, noise_slow: Tensor,
                window: Tensor, noise_fast: Tensor, forced: Tensor, use_forced: Tensor,
                kv_len: int | None = None) -> tuple[Tensor, ...]:
        logits, hidden = self.prefill(column, pos, k_cache, v_cache, kv_len)
        logits, hidden = logits[:, -1], hidden[:, -1]
        return (*self.sample(logits, hidden, noise_slow, window, noise_fast, forced, use_forced), logits, hidden)
