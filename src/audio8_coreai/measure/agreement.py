"""Teacher-forced draw agreement of a precision against fp32 on any checkpoint (no oracle needed).

The fp32 torch backend (the publisher's CPU numerics) runs free from a seed and its steps are recorded
(:mod:`.replay`): the column fed back, the noise and its own logits. Another backend then replays the recording
teacher-forced (``forced``: every step sees fp32's columns, so one miss does not change later inputs) and each
of its draws is compared with fp32's: the semantic draw (with RAS) and the nine codebook draws of every frame.
This is how a low precision is held to the bar of ../shared/reference/PORT-NOTES.md section 4.4 (semantic
98.5 %, codebook 97.5 %) on the 0.6b random checkpoint, where no publisher recording exists.

A recording ends at eos or at its frame cap, as every utterance does (the engine's loop).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..backends.base import Backend
from ..config import SamplingParams
from ..engine.noise import noise_source
from .replay import Recording, replay_recording
from .replay import record as replay_record
from .stats import cosine

SEMANTIC_BAR = 0.985
CODEBOOK_BAR = 0.975
PROMPTS = (
    "The meeting has been moved to Thursday afternoon, so please update your calendars.",
    "Rain is expected later tonight, with clearing skies by tomorrow morning.",
    "Could you tell me how to get to the train station from here?",
    "She opened the old wooden box and found a letter addressed to her grandmother.",
)


@dataclass
class Agreement:
    """Counts (agreeing, total) over every replayed step, and the worst logit cosines."""

    backend: str
    reference: str
    frames: int = 0
    semantic: tuple[int, int] = (0, 0)
    codebook: tuple[int, int] = (0, 0)
    slow_argmax: tuple[int, int] = (0, 0)
    slow_logits_min_cos: float = 1.0
    fast_logits_min_cos: float = 1.0
    per_codebook: list[int] = field(default_factory=list)  # agreeing draws of codebooks 1..C-1

    @property
    def semantic_rate(self) -> float:
        return self.semantic[0] / max(self.semantic[1], 1)

    @property
    def codebook_rate(self) -> float:
        return self.codebook[0] / max(self.codebook[1], 1)

    @property
    def passed(self) -> bool:
        return self.semantic_rate >= SEMANTIC_BAR and self.codebook_rate >= CODEBOOK_BAR

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "semantic_rate": self.semantic_rate,
            "codebook_rate": self.codebook_rate,
            "bars": {"semantic": SEMANTIC_BAR, "codebook": CODEBOOK_BAR},
            "passed": self.passed,
        }

    def line(self) -> str:
        s, c = self.semantic, self.codebook
        return (
            f"{self.backend}: semantic {s[0]}/{s[1]} ({100 * self.semantic_rate:.2f} %), codebook {c[0]}/{c[1]} "
            f"({100 * self.codebook_rate:.2f} %), slow argmax {self.slow_argmax[0]}/{self.slow_argmax[1]}, "
            f"min cos slow {self.slow_logits_min_cos:.6f} fast {self.fast_logits_min_cos:.6f} vs "
            f"{self.reference} -> {'PASS' if self.passed else 'FAIL'} (bars {100 * SEMANTIC_BAR:.1f} / "
            f"{100 * CODEBOOK_BAR:.1f} %)"
        )


def record_reference(backend: Backend, prompt: np.ndarray, params: SamplingParams, seed: int, frames: int) -> Recording:
    """Free-run ``prompt`` int64 [1+C, P] on ``backend`` (the reference) from ``seed``, up to eos or ``frames``
    frames (:func:`.replay.record`)."""
    return replay_record(backend, prompt, params, noise_source(backend.cfg, seed), frames)[0]


def add_agreement(backend: Backend, rec: Recording, params: SamplingParams, out: Agreement) -> Agreement:
    """Teacher-force ``rec`` through ``backend`` (:func:`.replay.replay_recording`) and add its agreement with the
    recorded draws to ``out``."""
    per = out.per_codebook or [0] * (backend.cfg.num_codebooks - 1)
    for s, res in enumerate(replay_recording(backend, rec, params)):
        forced = rec.columns[s]
        ok_sem = int(res.sampled_semantic == forced[0])
        ok_cb = res.sampled_codes[1:] == forced[2:]
        out.semantic = (out.semantic[0] + ok_sem, out.semantic[1] + 1)
        out.codebook = (out.codebook[0] + int(ok_cb.sum()), out.codebook[1] + len(ok_cb))
        per = [a + int(b) for a, b in zip(per, ok_cb)]
        out.slow_argmax = (
            out.slow_argmax[0] + int(np.argmax(res.logits) == np.argmax(rec.logits[s])),
            out.slow_argmax[1] + 1,
        )
        out.slow_logits_min_cos = min(out.slow_logits_min_cos, cosine(res.logits, rec.logits[s]))
        out.fast_logits_min_cos = min(
            out.fast_logits_min_cos, min(cosine(x, y) for x, y in zip(res.fast_logits, rec.fast_logits[s]))
        )
        out.frames += 1
    out.per_codebook = per
    return out


def save_recordings(path: Path, recs: list[Recording], meta: dict) -> None:
    arrays = {f"{i}__{k}": v for i, r in enumerate(recs) for k, v in asdict(r).items()}
    np.savez_compressed(path, meta_json=json.dumps(meta), **arrays)


def load_recordings(path: Path) -> tuple[list[Recording], dict]:
    with np.load(path) as f:
        meta = json.loads(str(f["meta_json"]))
        n = len({k.split("__")[0] for k in f.files if "__" in k})
        recs = [Recording(**{k: f[f"{i}__{k}"] for k in Recording.__dataclass_fields__}) for i in range(n)]
    return recs, meta
