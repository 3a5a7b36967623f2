"""The sampler: in-graph torch draws, the host-side RAS window and product noise (its NumPy reference:
:mod:`.sampling_reference`).

The publisher samples with ``ArkttsModel._processed_scores`` + ``_sample`` (SPEC.md section 7):

1. legacy top-k/top-p on the **raw** (un-tempered) scores: sort descending, ``probs = softmax`` over the whole
   vector, inclusive ``cumsum``; rank ``r`` is dropped when ``cum_r > top_p`` or ``r >= top_k``; rank 0 is
   always kept; dropped scores become ``-inf``;
2. divide by the temperature (clamped ``>= 1e-5``);
3. ``argmax(softmax(scores) / -log(U))`` over the whole vocabulary, ``U`` uniform noise of the same shape
   (the exponential race: an exact categorical draw whose randomness is ``U``).

Here the randomness ``U`` is an input, so recorded uniforms replay the publisher and a seeded
:class:`NoiseSource` makes the product deterministic (DESIGN.md principle 2).

Ties. The publisher's ``torch.sort`` is not stable, so when equal scores straddle the top-k or top-p cut the
publisher may keep either; its final ``argmax`` takes the lowest vocabulary index among equal race values.
This module fixes one rule everywhere: **among equal values the lower vocabulary index ranks first** (a stable
descending sort). ``torch.topk`` alone orders ties differently on every backend, so the torch sampler
canonicalises its candidates (see :func:`_top_k_candidates`): the tie rule then does not depend on the
backend's ``topk``, and the torch draws agree with the NumPy reference.

Layouts. Codebook draws use index ``c`` = code ``c``. Semantic draws use the compact layout of the 4,097-row
head: index ``i < V`` is semantic id ``semantic_begin_id + i`` and index ``V`` is eos. The eos id lies below
the semantic range, so in vocabulary order eos comes first; :func:`sample_semantic` and
:func:`greedy_semantic` rotate the compact vector into vocabulary order before drawing so ties resolve as the
publisher's full-vocabulary ``argmax`` does.

Sampling parameters (``top_k``, ``top_p``, temperatures) are Python numbers, baked into a graph at trace time:
a graph is exported for one generation setting. They are applied in fp32, as the publisher does for fp32
scores (``top_p`` 0.9 is compared as the fp32 value 0.9f).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from .config import SamplingParams

MIN_TEMPERATURE = 1e-5
"""The publisher clamps the temperature to at least this before dividing."""

# A dropped candidate's score: exp(-max - s) underflows to exactly 0 for any finite kept score s (the publisher
# uses -inf; a finite value keeps the graph free of infinities).
_DROPPED = -torch.finfo(torch.float32).max


def _check_params(top_k: int, top_p: float, temperature: float) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if not top_p > 0.0:
        raise ValueError(f"top_p must be > 0, got {top_p!r}")
    if not temperature > 0.0:
        raise ValueError(f"temperature must be > 0 (the publisher refuses 0), got {temperature!r}")


def _step(d: Tensor) -> Tensor:
    """1.0 where ``d > 0`` else 0.0, as float arithmetic (the sign of an fp32 difference is exact)."""
    return torch.sign(d).clamp(min=0.0)


def _equal(d: Tensor) -> Tensor:
    """1.0 where ``d == 0`` else 0.0."""
    return 1.0 - torch.sign(d).abs()


def _top_k_candidates(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` best entries of ``x`` in stable descending order: by value, ties by lower index.

    ``x``: fp32 ``[..., N]``, finite. Returns ``(values fp32 [..., k], indices int64 [..., k])``.

    ``torch.topk`` returns the right *values*, but which of several equal entries it returns at the k-th place,
    and in which order, is unspecified. So: take the k-th largest value, keep everything above it plus the
    lowest-index entries equal to it until there are ``k``, and order those by (value desc, index asc) with a
    k x k rank count and a scatter. Static shapes, no sort.
    """
    kth = torch.topk(x, k, dim=-1).values[..., k - 1 :]
    d = x - kth
    above = _step(d)
    at = _equal(d)
    room = k - above.sum(-1, keepdim=True)
    member = above + at * (1.0 - _step(torch.cumsum(at, -1) - room))
    idx = torch.topk(member, k, dim=-1).indices  # exactly k entries are 1: the set is fixed, the order is not
    val = x.gather(-1, idx)
    fidx = idx.to(x.dtype)
    dv = val.unsqueeze(-2) - val.unsqueeze(-1)  # [..., i, j] = val_j - val_i
    di = fidx.unsqueeze(-1) - fidx.unsqueeze(-2)  # [..., i, j] = idx_i - idx_j
    rank = (_step(dv) + _equal(dv) * _step(di)).sum(-1).to(torch.int64)  # how many candidates go before i
    return torch.zeros_like(val).scatter(-1, rank, val), torch.zeros_like(idx).scatter(-1, rank, idx)


def _top_k_candidates_eager(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """:func:`_top_k_candidates`'s exact result, faster in eager PyTorch.

    ``torch.topk(x, k + 1)`` is already in the canonical order when no two of its values are equal (then no tie
    straddles the cut and none needs ordering); only otherwise is the static-shape form run. The check reads a
    value on the host: eager only, never in an exported graph.
    """
    n = x.shape[-1]
    if k >= n:
        return _top_k_candidates(x, k)
    vals, idx = torch.topk(x, k + 1, dim=-1)
    if bool((vals[..., :-1] > vals[..., 1:]).all()):
        return vals[..., :k], idx[..., :k]
    return _top_k_candidates(x, k)


def _top_k_candidates_sorted(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """:func:`_top_k_candidates`'s exact result by one stable descending sort: equal values keep their order, the
    lower index first, which is the canonical order. Static shapes and no host read (CUDA graphs), in a couple of
    kernels where the rank count takes dozens; not for Core AI export, whose delegate has no stable sort."""
    vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    return vals[..., :k], idx[..., :k]


CANDIDATES = {"eager": _top_k_candidates_eager, "sorted": _top_k_candidates_sorted, "static": _top_k_candidates}
"""How the sampler finds its top-k candidates, one exact result: ``eager`` (a host check first; eager PyTorch),
``sorted`` (a stable sort; CUDA graphs), ``static`` (a rank count; exported graphs)."""


def _candidates(logits: Tensor, top_k: int, how: str) -> tuple[Tensor, Tensor, Tensor]:
    """(fp32 scores [..., N], candidate values [..., k], their indices int64 [..., k])."""
    x = logits.float()
    k = min(top_k, x.shape[-1])
    vals, cand = CANDIDATES[how](x, k)
    return x, vals, cand


Race = tuple[Tensor, float, float]
"""One draw over the candidates: its uniforms [..., N] (read at the candidates), ``top_p`` and temperature."""

Draws = Callable[[Tensor, Tensor, Tensor, Sequence[Race]], list[Tensor]]
"""The draws over one set of candidates (:func:`draws`' signature; a fused kernel's: backends/torch/fused.py)."""


def draws(x: Tensor, vals: Tensor, cand: Tensor, races: Sequence[Race]) -> list[Tensor]:
    """The top-p cut, temperature and exponential race of :func:`sample_top_k_top_p` for each of ``races`` over
    one set of candidates: scores ``x`` fp32 [..., N], the candidates' values fp32 [..., k] and indices int64
    [..., k] (:data:`CANDIDATES`' order). Returns each race's drawn index, int64 [...]. The full softmax's
    probabilities at the candidates are computed once for all races."""
    probs = torch.softmax(x, dim=-1).gather(-1, cand)
    return [_draw(x, vals, cand, probs, u, top_p, temperature) for u, top_p, temperature in races]


def _draw(
    x: Tensor, vals: Tensor, cand: Tensor, probs: Tensor, uniforms: Tensor, top_p: float, temperature: float
) -> Tensor:
    """One race of :func:`draws`, ``probs`` the candidates' full-softmax probabilities."""
    n, k = x.shape[-1], vals.shape[-1]
    not_first = torch.arange(k, device=x.device).clamp(max=1).to(x.dtype)
    keep = 1.0 - _step(torch.cumsum(probs, -1) - top_p) * not_first
    scores = vals / max(temperature, MIN_TEMPERATURE)
    q = torch.softmax(scores * keep + (1.0 - keep) * _DROPPED, dim=-1)
    race = q / -torch.log(uniforms.float().gather(-1, cand))
    best = race.amax(-1, keepdim=True)
    # the lowest vocabulary index among the candidates whose race value equals the best one
    choice = (cand.to(x.dtype) + (1.0 - _equal(best - race)) * n).amin(-1)
    return choice.to(torch.int64)


def sample_top_k_top_p(
    logits: Tensor,
    uniforms: Tensor,
    top_k: int,
    top_p: float,
    temperature: float,
    *,
    candidates: str = "static",
    draw: Draws = draws,
) -> Tensor:
    """One draw per row, exactly the publisher's legacy top-k/top-p processor followed by ``_sample``.

    Args:
        logits: ``[..., N]`` raw scores, any float dtype (upcast to fp32: fp16/bf16 logits are sampled in fp32,
            unlike the publisher, which samples in the logits dtype). Must be finite.
        uniforms: ``[..., N]`` noise in (0, 1), read at the candidates only (as fp32).
        top_k, top_p, temperature: the generation setting (Python numbers; ``temperature`` is clamped to
            :data:`MIN_TEMPERATURE`).

    Returns:
        int64 ``[...]``: the index drawn.

    Matches the publisher's ``_processed_scores``: candidates are the top ``k`` (nothing else can survive
    ``r >= top_k``), probabilities come from a softmax over the FULL vector (before temperature), the inclusive
    cumulative sum over the ranked candidates drops ``cum > top_p`` except rank 0; then the kept scores are
    divided by the temperature. Matches ``_sample``: ``argmax(softmax(kept) / -log(u))``, dropped entries weigh
    0, and equal race values go to the lowest index (the publisher's ``argmax`` over the vocabulary).
    If ``u`` is 0 at every kept candidate (impossible with :class:`NoiseSource`), every race value is 0 and the
    publisher would return index 0 of its whole vocabulary; this returns the lowest candidate.
    ``candidates``: how the top-k candidates are found (a name of :data:`CANDIDATES`; the same result); ``draw``:
    what draws over them (:func:`draws`, or a fused kernel of the same maths).
    """
    _check_params(top_k, top_p, temperature)
    return draw(*_candidates(logits, top_k, candidates), [(uniforms, top_p, temperature)])[0]


def greedy(logits: Tensor) -> Tensor:
    """``argmax`` over the last axis (``[..., N]`` -> int64 ``[...]``); ties go to the lowest index.

    The publisher's greedy path takes the argmax of the processed scores, which is the argmax of the logits:
    rank 0 is always kept and a positive temperature keeps the order.
    """
    return torch.argmax(logits.float(), dim=-1)


def _eos_first(semantic_begin_id: int, eos_id: int) -> bool:
    """Whether eos sorts before the semantic ids in the vocabulary (it does in the publisher's config)."""
    return eos_id < semantic_begin_id


def _to_vocab_order(compact: Tensor, eos_first: bool) -> Tensor:
    """Compact ``[..., V+1]`` (semantics, then eos) -> vocabulary order (eos first when its id is lower)."""
    if not eos_first:
        return compact
    return torch.cat([compact[..., -1:], compact[..., :-1]], dim=-1)


def _vocab_index_to_id(j: Tensor, num_semantic: int, semantic_begin_id: int, eos_id: int) -> Tensor:
    """Index in :func:`_to_vocab_order`'s layout -> token id, with clamp ramps instead of branches."""
    if _eos_first(semantic_begin_id, eos_id):
        is_eos = 1 - j.clamp(max=1)  # index 0
        return is_eos * eos_id + (1 - is_eos) * (semantic_begin_id + j - 1)
    is_eos = (j - (num_semantic - 1)).clamp(min=0)  # index V
    return is_eos * eos_id + (1 - is_eos) * (semantic_begin_id + j)


def greedy_semantic(logits: Tensor, *, semantic_begin_id: int, eos_id: int) -> Tensor:
    """Greedy semantic id from compact logits ``[..., V+1]`` -> int64 token ids ``[...]`` (ties: lowest id)."""
    eos_first = _eos_first(semantic_begin_id, eos_id)
    j = greedy(_to_vocab_order(logits, eos_first))
    return _vocab_index_to_id(j, logits.shape[-1] - 1, semantic_begin_id, eos_id)


def sample_semantic(
    logits: Tensor,
    noise: Tensor,
    window: Tensor,
    params: SamplingParams,
    semantic_begin_id: int,
    eos_id: int,
    *,
    candidates: str = "static",
    draw: Draws = draws,
) -> tuple[Tensor, Tensor, Tensor]:
    """The semantic draw with repetition-aware sampling (the publisher's ``_sample_semantic``).

    Args:
        logits: compact ``[..., V+1]`` (index ``i < V`` = id ``semantic_begin_id + i``, index ``V`` = eos).
        noise: ``[..., 2, V+1]`` uniforms in the same compact layout: row 0 for the normal draw, row 1 for the
            high-temperature draw.
        window: int64 ``[..., W]`` token ids of the RAS window (:class:`RasWindow`); ``-1`` = empty slot.
        params: ``top_k``, ``top_p``, ``temperature`` are the normal draw's setting; ``ras_top_p``,
            ``ras_temperature`` the high draw's (the same ``top_k`` caps both, as in the publisher).
        semantic_begin_id, eos_id: from the model config.

    Returns:
        ``(semantic_id, normal_id, high_id)``, each int64 ``[...]`` token ids (semantic or eos).

    Both draws are always made (the publisher draws both at every step, step 0 included). The result is the
    high draw when the normal draw is a semantic id present in the window, else the normal draw; eos is never
    replaced (the high draw may itself be eos). With an all ``-1`` window (step 0) the normal draw is returned.
    ``candidates`` and ``draw`` as :func:`sample_top_k_top_p`.
    """
    v = logits.shape[-1] - 1
    eos_first = _eos_first(semantic_begin_id, eos_id)
    x = _to_vocab_order(logits, eos_first)
    u = _to_vocab_order(noise, eos_first)
    p = params
    _check_params(p.top_k, p.top_p, p.temperature)
    _check_params(p.top_k, p.ras_top_p, p.ras_temperature)
    # both draws rank the same scores with the same top_k
    races = [(u[..., 0, :], p.top_p, p.temperature), (u[..., 1, :], p.ras_top_p, p.ras_temperature)]
    normal_j, high_j = draw(*_candidates(x, p.top_k, candidates), races)
    normal = _vocab_index_to_id(normal_j, v, semantic_begin_id, eos_id)
    high = _vocab_index_to_id(high_j, v, semantic_begin_id, eos_id)
    is_semantic = (normal - eos_id).abs().clamp(max=1)  # 0 for eos, 1 for a semantic id
    nearest = (window - normal.unsqueeze(-1)).abs().amin(-1)
    repeated = (1 - nearest.clamp(max=1)) * is_semantic
    return normal + repeated * (high - normal), normal, high


class RasWindow:
    """One utterance's host-side RAS window, reproducing the publisher's ``generate`` quirk: int64 ``[W]``.

    Before step 0 the window is empty (all ``-1``: the publisher's ``previous`` is ``None``). The first
    :meth:`push` (after step 0) makes it all zeros and does **not** insert the step-0 token; every later push
    rolls left by one and writes the new id in the last slot. So at step ``k >= 1`` it holds the ids of steps
    ``1..k-1`` (the last ``W``), padded with 0. Raises ValueError for ``size`` < 1.
    """

    def __init__(self, size: int = 10) -> None:
        if size < 1:
            raise ValueError(f"RasWindow needs size >= 1, got {size}")
        self._window = np.full(size, -1, dtype=np.int64)
        self._started = False

    def current(self) -> np.ndarray:
        """The window for the next step: a copy, int64 ``[W]``."""
        return self._window.copy()

    def push(self, semantic: int) -> None:
        """Record this step's semantic token id."""
        if not self._started:
            self._window[:] = 0
            self._started = True
            return
        self._window = np.append(self._window[1:], np.int64(semantic))


class NoiseSource:
    """Seeded uniforms for the product (one utterance): ``numpy.random.Generator(PCG64(seed))``.

    Each frame draws, in this order, ``noise_slow`` fp32 ``[2, num_semantic + 1]`` (normal then high semantic
    draw, compact layout) and ``noise_fast`` fp32 ``[num_fast, codebook_size]``: the publisher's per-step
    order (two semantic tensors, then one per codebook). Values are ``k / 2**24`` with ``k`` uniform in
    ``1 .. 2**24 - 1``: every fp32 value ``torch.rand`` can return except 0, so the open interval (0, 1) and
    ``-log(u)`` is finite and positive. The same seed gives the same sequence.
    """

    def __init__(self, seed: int, num_semantic: int, codebook_size: int, num_fast: int = 9) -> None:
        if num_semantic < 1 or codebook_size < 1 or num_fast < 0:
            raise ValueError("NoiseSource needs num_semantic >= 1, codebook_size >= 1, num_fast >= 0")
        self._rng = np.random.Generator(np.random.PCG64(seed))
        self._slow_shape = (2, num_semantic + 1)
        self._fast_shape = (num_fast, codebook_size)

    def _uniform(self, shape: tuple[int, ...]) -> np.ndarray:
        k = self._rng.integers(1, 1 << 24, size=shape, dtype=np.int64)
        return (k * 2.0**-24).astype(np.float32)  # exact: k < 2**24

    def next_frame(self) -> tuple[np.ndarray, np.ndarray]:
        """``(noise_slow [2, V+1], noise_fast [num_fast, codebook_size])``, both fp32."""
        slow = self._uniform(self._slow_shape)
        return slow, self._uniform(self._fast_shape)
