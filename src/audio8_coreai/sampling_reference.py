"""The sampler's NumPy reference: the same rules as :mod:`.sampling`'s torch draws, written the publisher's
straightforward full-sort way (the tests hold the torch draws to it; the gate and the publisher-style bench frame use
it)."""

from __future__ import annotations

import numpy as np

from .config import SamplingParams
from .sampling import MIN_TEMPERATURE, _check_params


def np_processed_scores(logits: np.ndarray, top_k: int, top_p: float, temperature: float) -> np.ndarray:
    """The publisher's ``_processed_scores`` for one vector: ``[N]`` -> fp32 ``[N]``, ``-inf`` where dropped.

    Full stable descending sort (ties: lower index first), softmax over the whole sorted vector, inclusive
    cumulative sum (accumulated in float64 and rounded to fp32, as torch's CPU ``cumsum`` does), drop
    ``cum > top_p`` (fp32 threshold) or rank ``>= top_k``, never rank 0; then divide by the clamped temperature.
    """
    _check_params(top_k, top_p, temperature)
    x = np.asarray(logits, dtype=np.float32)
    order = np.argsort(-x, kind="stable")
    ranked = x[order]
    e = np.exp(ranked - ranked[0])
    probs = e / e.sum(dtype=np.float32)
    cum = np.cumsum(probs, dtype=np.float64).astype(np.float32)
    remove = (cum > np.float32(top_p)) | (np.arange(x.size) >= top_k)
    remove[0] = False
    ranked_scores = ranked / np.float32(max(temperature, MIN_TEMPERATURE))
    ranked_scores[remove] = -np.inf
    out = np.empty_like(ranked_scores)
    out[order] = ranked_scores
    return out


def np_sample_top_k_top_p(
    logits: np.ndarray, uniforms: np.ndarray, top_k: int, top_p: float, temperature: float
) -> np.ndarray:
    """Reference of :func:`sample_top_k_top_p`: ``[..., N]`` logits and uniforms -> int64 ``[...]`` indices.

    ``_sample`` on the processed scores: ``argmax(softmax(scores) / -log(u))`` over the whole vector; ``argmax``
    returns the first (lowest-index) maximum.
    """
    x = np.asarray(logits, dtype=np.float32)
    u = np.asarray(uniforms, dtype=np.float32)
    flat_x = x.reshape(-1, x.shape[-1])
    flat_u = u.reshape(-1, u.shape[-1])
    out = np.empty(flat_x.shape[0], dtype=np.int64)
    for row, (xr, ur) in enumerate(zip(flat_x, flat_u)):
        scores = np_processed_scores(xr, top_k, top_p, temperature)
        e = np.exp(scores - scores.max())
        probs = e / e.sum(dtype=np.float32)
        with np.errstate(divide="ignore"):
            out[row] = int(np.argmax(probs / -np.log(ur)))
    return out.reshape(x.shape[:-1])


def np_sample_semantic(
    logits: np.ndarray,
    noise: np.ndarray,
    window: np.ndarray,
    params: SamplingParams,
    semantic_begin_id: int,
    eos_id: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Reference of :func:`sample_semantic` (same arguments and outputs, NumPy arrays).

    Written the publisher's way: the compact entries are laid out by token id (a vocabulary-ordered vector), both
    draws are made, and the high draw replaces a normal semantic id found in the window.
    """
    x = np.asarray(logits, dtype=np.float32)
    u = np.asarray(noise, dtype=np.float32)
    v = x.shape[-1] - 1
    ids = np.concatenate([semantic_begin_id + np.arange(v), [eos_id]]).astype(np.int64)
    by_id = np.argsort(ids, kind="stable")
    p = params
    normal = ids[by_id][np_sample_top_k_top_p(x[..., by_id], u[..., 0, by_id], p.top_k, p.top_p, p.temperature)]
    high = ids[by_id][np_sample_top_k_top_p(x[..., by_id], u[..., 1, by_id], p.top_k, p.ras_top_p, p.ras_temperature)]
    semantic_end_id = semantic_begin_id + v - 1
    in_window = (np.asarray(window, dtype=np.int64) == normal[..., None]).any(-1)
    is_semantic = (normal >= semantic_begin_id) & (normal <= semantic_end_id)
    return np.where(in_window & is_semantic, high, normal), normal, high
