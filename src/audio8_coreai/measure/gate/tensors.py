"""The gate's tensor rungs: a reference run recorded in the oracle's layout, the reference's Gumbel margin of
every teacher-forced miss, and the codec rung (two decodes of the same codes compared)."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from ...config import SamplingParams
from ...engine.loop import Generation
from ...sampling_reference import np_processed_scores
from ..parity import ScenarioReport
from ..replay import Recording
from ..stats import cosine
from .mel import log_mel_cos

LOW_MARGIN = 0.1  # a miss whose reference margin is under this was a near-tie: a rounding-sized flip


def gumbel_margin(scores: np.ndarray, uniforms: np.ndarray | None = None) -> float:
    """How decisive a draw was: ``(best - runner_up) / best`` of the race ``softmax(scores) / -log(u)``.

    ``scores`` [N] are the processed scores the draw saw (``-inf`` where dropped); ``uniforms`` [N] its noise
    (None for a greedy draw: the race is the softmax itself). In [0, 1]: 0 is a tie (any rounding can flip it),
    1 means a single candidate.
    """
    s = np.asarray(scores, dtype=np.float64)
    p = np.exp(s - s.max())
    race = p / p.sum()
    if uniforms is not None:
        race = race / -np.log(np.asarray(uniforms, dtype=np.float64))
    if race.size < 2:
        return 1.0
    runner_up, best = np.partition(race, -2)[-2:]
    return float((best - runner_up) / best) if best > 0 else 0.0


def _semantic_margin(logits, noise, params: SamplingParams, want: int, cfg) -> float:
    """The reference's margin for its semantic draw: the normal draw's race, or the RAS draw's when RAS replaced
    the normal draw (the recorded id is not the normal draw's)."""
    if not params.do_sample:
        return gumbel_margin(logits)
    normal = np_processed_scores(logits, params.top_k, params.top_p, params.temperature)
    race = np.exp(normal - normal.max()) / -np.log(noise[0].astype(np.float64))
    i = int(np.argmax(race))
    normal_id = cfg.eos_token_id if i == cfg.num_semantic else cfg.semantic_begin_id + i
    if normal_id == want:
        return gumbel_margin(normal, noise[0])
    high = np_processed_scores(logits, params.top_k, params.ras_top_p, params.ras_temperature)
    return gumbel_margin(high, noise[1])


def miss_margins(rep: ScenarioReport, fx: dict, sc: str, params: SamplingParams, cfg) -> list[dict]:
    """``rep.misses`` as dicts, each with the reference's ``margin`` (:func:`gumbel_margin`) from the recorded
    logits and uniforms of scenario ``sc`` in ``fx`` (the oracle's keys)."""
    out = []
    for m in rep.misses:
        if m.draw == 0:
            noise = (
                np.stack(
                    [
                        fx[f"{sc}__sem_regular_uniform_compact"][m.step, m.item],
                        fx[f"{sc}__sem_ras_uniform_compact"][m.step, m.item],
                    ]
                )
                if params.do_sample
                else None
            )
            margin = _semantic_margin(fx[f"{sc}__slow_logits_compact"][m.step, m.item], noise, params, m.want, cfg)
        else:
            logits = fx[f"{sc}__fast_logits"][m.step, m.draw - 1, m.item]
            if params.do_sample:
                margin = gumbel_margin(
                    np_processed_scores(logits, params.top_k, params.top_p, params.temperature),
                    fx[f"{sc}__fast_uniform"][m.step, m.draw - 1, m.item],
                )
            else:
                margin = gumbel_margin(logits)
        out.append({**asdict(m), "margin": round(margin, 6)})
    return out


def record_run(name: str, rec: Recording, params: SamplingParams, gen: Generation) -> tuple[dict, dict]:
    """A reference run (:func:`..replay.record`: the recording and its generation) in the oracle's fixture layout,
    scenario ``name``, batch 1 -> (arrays, meta) for :func:`..parity.replay_forced` and
    :func:`..parity.compare_free_run`. Every step is recorded, the eos step included."""
    semantic, codebooks = rec.columns[:, 0], rec.columns[:, 1:]
    fx = {
        "num_steps": np.int64(len(rec.columns)),
        "prompt_input_ids": rec.prompt[None],
        "sem_regular_uniform_compact": rec.noise_slow[:, None, 0],
        "sem_ras_uniform_compact": rec.noise_slow[:, None, 1],
        "fast_uniform": rec.noise_fast[:, :, None],
        "semantic": semantic[:, None],
        "codebooks": codebooks[:, None],
        "slow_logits_compact": rec.logits[:, None],
        "fast_logits": rec.fast_logits[:, :, None],
        "fast_choice": codebooks[:, 1:, None],
        "codes": gen.codes[None],
        "code_lengths": np.array([gen.frames]),
        "finished": np.array([gen.reached_eos]),
    }
    meta = {
        "scenarios": {
            name: {
                "do_sample": params.do_sample,
                "max_new_tokens": gen.max_frames,
                "extra": {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p},
            }
        }
    }
    return {f"{name}__{k}": v for k, v in fx.items()}, meta


def _codec_stage(reference: np.ndarray, port: np.ndarray, sample_rate: int) -> dict:
    """Waveform cosine, max |diff| and log-mel cosine of two decodes of the same codes."""
    if not len(reference):
        return {"skipped": "no frames to decode"}
    n = min(len(reference), len(port))
    return {
        "waveform_cos": cosine(port[:n], reference[:n]),
        "waveform_max_diff": float(np.abs(port[:n] - reference[:n]).max()),
        "logmel_cos": log_mel_cos(reference, port, sample_rate),
    }


def _teacher_forced(rep: ScenarioReport, fx: dict, params: SamplingParams, cfg) -> dict:
    out = asdict(rep)
    out["misses"] = miss_margins(rep, fx, rep.key, params, cfg)
    return out
