"""Teacher-forced draw agreement of a precision against fp32 on any checkpoint (no oracle needed).

The fp32 torch backend (the publisher's CPU numerics) runs free from a seed and its steps are recorded: the
column fed back, the noise, the RAS window and its own draws. Another backend then replays the recording
teacher-forced (``forced``: every step sees fp32's columns, so one miss does not change later inputs) and each
of its draws is compared with fp32's: the semantic draw (with RAS) and the nine codebook draws of every frame.
This is how a low precision is held to the bar of ../shared/reference/PORT-NOTES.md section 4.4 (semantic
98.5 %, codebook 97.5 %) on the 0.6b random checkpoint, where no publisher recording exists.

Random weights never draw eos reliably, so the recording runs a fixed number of frames (an eos draw is fed back
as any other column, as the benchmark does).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..config import SamplingParams
from ..sampling import NoiseSource, RasWindow
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
class Recording:
    """fp32's free run of one prompt: per step ``column`` int [1+C] (semantic id then codes: what the next
    step is fed and what teacher forcing imposes), ``noise_slow`` [2, V+1], ``noise_fast`` [C-1, cb],
    ``window`` [W], and fp32's own slow ``logits`` [V+1] and ``fast_logits`` [C-1, cb] (for cosines)."""

    prompt: np.ndarray
    columns: np.ndarray
    noise_slow: np.ndarray
    noise_fast: np.ndarray
    windows: np.ndarray
    logits: np.ndarray
    fast_logits: np.ndarray


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
        return {**asdict(self), "semantic_rate": self.semantic_rate, "codebook_rate": self.codebook_rate,
                "bars": {"semantic": SEMANTIC_BAR, "codebook": CODEBOOK_BAR}, "passed": self.passed}

    def line(self) -> str:
        s, c = self.semantic, self.codebook
        return (f"{self.backend}: semantic {s[0]}/{s[1]} ({100 * self.semantic_rate:.2f} %), codebook {c[0]}/{c[1]} "
                f"({100 * self.codebook_rate:.2f} %), slow argmax {self.slow_argmax[0]}/{self.slow_argmax[1]}, "
                f"min cos slow {self.slow_logits_min_cos:.6f} fast {self.fast_logits_min_cos:.6f} vs "
                f"{self.reference} -> {'PASS' if self.passed else 'FAIL'} (bars {100 * SEMANTIC_BAR:.1f} / "
                f"{100 * CODEBOOK_BAR:.1f} %)")


def record(backend, prompt: np.ndarray, params: SamplingParams, seed: int, frames: int) -> Recording:
    """Free-run ``frames`` frames of ``prompt`` int [1+C, P] on ``backend`` (the reference) from ``seed``."""
    cfg = backend.cfg
    noise = NoiseSource(seed, cfg.num_semantic, cfg.codebook_size, cfg.num_codebooks - 1)
    window = RasWindow(cfg.ras_window_size)
    backend.prefill(prompt)
    cols, ns, nf, wins, lg, flg = [], [], [], [], [], []
    column = None
    for step in range(frames):
        noise_slow, noise_fast = noise.next_frame()
        win = window.current()[0]
        if column is None:
            res = backend.first_frame(params, noise_slow, win, noise_fast)
        else:
            res = backend.frame(params, column, prompt.shape[1] + step - 1, noise_slow, win, noise_fast)
        column = np.concatenate([[res.semantic], res.codes]).astype(np.int64)
        window.push(res.semantic)
        cols.append(column)
        ns.append(noise_slow)
        nf.append(noise_fast)
        wins.append(win)
        lg.append(res.logits)
        flg.append(res.fast_logits)
    return Recording(prompt, np.stack(cols), np.stack(ns), np.stack(nf), np.stack(wins), np.stack(lg),
                     np.stack(flg))


def replay(backend, rec: Recording, params: SamplingParams, out: Agreement) -> Agreement:
    """Teacher-force ``rec`` through ``backend`` and add its agreement with the recorded draws to ``out``."""
    cfg = backend.cfg
    p_len = rec.prompt.shape[1]
    backend.prefill(rec.prompt)
    per = out.per_codebook or [0] * (cfg.num_codebooks - 1)
    for s in range(len(rec.columns)):
        forced = rec.columns[s]
        if s == 0:
            res = backend.first_frame(params, rec.noise_slow[s], rec.windows[s], rec.noise_fast[s], forced)
        else:
            res = backend.frame(params, rec.columns[s - 1], p_len + s - 1, rec.noise_slow[s], rec.windows[s],
                                rec.noise_fast[s], forced)
        ok_sem = int(res.sampled_semantic == forced[0])
        ok_cb = res.sampled_codes[1:] == forced[2:]
        out.semantic = (out.semantic[0] + ok_sem, out.semantic[1] + 1)
        out.codebook = (out.codebook[0] + int(ok_cb.sum()), out.codebook[1] + len(ok_cb))
        per = [a + int(b) for a, b in zip(per, ok_cb)]
        out.slow_argmax = (out.slow_argmax[0] + int(np.argmax(res.logits) == np.argmax(rec.logits[s])),
                           out.slow_argmax[1] + 1)
        out.slow_logits_min_cos = min(out.slow_logits_min_cos, cosine(res.logits, rec.logits[s]))
        out.fast_logits_min_cos = min(out.fast_logits_min_cos,
                                      min(cosine(x, y) for x, y in zip(res.fast_logits, rec.fast_logits[s])))
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
