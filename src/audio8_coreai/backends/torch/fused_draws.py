"""The sampler's draws over its candidates as one Triton kernel per race: the top-p cut, the temperature and the
exponential race of :func:`...sampling.draws` (SPEC.md section 7), where the torch ops take about 25 kernels a draw.

The candidates (top-k, in the canonical order) still come from the frame's own sort; the kernel reads the full
scores once for the softmax's normaliser, the candidates' values and indices, and the race's uniforms at the
candidates. The same maths: products and quotients round as the torch ops' (no fused multiply-add); the full
softmax's sum and the top-p cumulative sum may differ from torch's in their last bit, so a draw can differ only where
a probability sits within a rounding of ``top_p`` or two race values within a rounding of each other. Tested under
``TRITON_INTERPRET=1`` against :func:`...sampling.draws` (tests/backends/torch/test_fused.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

from ...sampling import _DROPPED, MIN_TEMPERATURE, Race
from .fused import EXACT, as_rows


@triton.jit
def _draw(x_ptr, x_row, vals_ptr, vals_row, cand_ptr, cand_row, u_ptr, u_row, out_ptr, N, top_p, temperature,
          dropped, K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """Row r: the candidates' full-softmax probabilities, kept while their inclusive cumulative sum is at most
    ``top_p`` (rank 0 always), the kept values over the temperature softmaxed, raced against ``-log(u)``; the lowest
    index among the best race values."""
    r = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + r * x_row + cols, mask=cols < N, other=float("-inf"))
    top = tl.max(x, axis=0)
    total = tl.sum(tl.exp(x - top), axis=0)
    k = tl.arange(0, BLOCK_K)
    real = k < K
    vals = tl.load(vals_ptr + r * vals_row + k, mask=real, other=0.0)
    cand = tl.load(cand_ptr + r * cand_row + k, mask=real, other=0)
    probs = tl.exp(vals - top) / total
    cum = tl.cumsum(tl.where(real, probs, 0.0), axis=0)
    cut = tl.where((cum - top_p > 0) & (k > 0), 1.0, 0.0)
    keep = 1.0 - cut
    scores = (vals / temperature) * keep + (1.0 - keep) * dropped
    scores = tl.where(real, scores, float("-inf"))
    best_score = tl.max(scores, axis=0)
    weights = tl.exp(scores - best_score)
    q = weights / tl.sum(weights, axis=0)
    u = tl.load(u_ptr + r * u_row + cand, mask=real, other=0.5)
    race = tl.where(real, q / -tl.log(u), -1.0)
    best = tl.max(race, axis=0)
    index = tl.where(real & (race == best), cand, N)
    tl.store(out_ptr + r, tl.min(index, axis=0).to(tl.int64))


def fused_draws(x: Tensor, vals: Tensor, cand: Tensor, races: Sequence[Race]) -> list[Tensor]:
    """:func:`...sampling.draws` in one kernel per race: scores ``x`` fp32 [..., N], candidates' values fp32 [..., k]
    and indices int64 [..., k]; each race (uniforms [..., N], ``top_p``, temperature) -> its index int64 [...]."""
    lead, n, k = x.shape[:-1], x.shape[-1], vals.shape[-1]
    xr, x_row = as_rows(x)
    vr, v_row = as_rows(vals)
    cr, c_row = as_rows(cand)
    out = []
    for uniforms, top_p, temperature in races:
        ur, u_row = as_rows(uniforms.float())
        drawn = torch.empty(xr.shape[0], dtype=torch.int64, device=x.device)
        _draw[(xr.shape[0],)](
            xr, x_row, vr, v_row, cr, c_row, ur, u_row, drawn, n, float(top_p),
            max(float(temperature), MIN_TEMPERATURE), _DROPPED, K=k, BLOCK_N=triton.next_power_of_2(n),
            BLOCK_K=triton.next_power_of_2(k), **EXACT,
        )  # fmt: skip
        out.append(drawn.view(lead))
    return out
