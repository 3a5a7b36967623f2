"""The gate's speaker similarity rung (clone fixtures): a speaker encoder (resemblyzer's) and the cosine of the
reference clip's embedding with each run's speech."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from .errors import _GATE_EXTRA, GateError
from .report import FixtureResult


class SpeakerEncoder(Protocol):
    """Speech to a speaker embedding; similar voices give a high cosine."""

    name: str

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """Mono float ``audio`` [N] at ``sample_rate`` Hz -> L2-normalised float embedding [D]."""
        ...


class ResemblyzerEncoder:
    """resemblyzer's GE2E speaker encoder (256-d, model inside the PyPI package), on the CPU: 16 kHz, volume
    normalised, long silences trimmed by webrtcvad (its ``preprocess_wav``)."""

    name = "resemblyzer GE2E"

    def __init__(self):
        try:
            from resemblyzer import VoiceEncoder, preprocess_wav
        except ImportError as e:  # resemblyzer itself, or webrtcvad/librosa under it
            raise GateError(
                f"resemblyzer cannot be imported ({e}): {_GATE_EXTRA} and pip install --no-deps resemblyzer"
            ) from e
        self._preprocess = preprocess_wav
        self._encoder = VoiceEncoder("cpu", verbose=False)

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        wav = self._preprocess(np.asarray(audio, dtype=np.float32).reshape(-1), source_sr=sample_rate)
        if wav.size < 1600:  # under 0.1 s of sound after the silences are trimmed
            raise GateError("no speech found (under 0.1 s of sound after trimming silences)")
        # One thread: the 3-layer, 256-unit LSTM gains nothing from more, and on a busy machine spinning OpenMP
        # workers made each call take seconds (measured 11 s with 2 threads vs 0.05 s with 1 under load).
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return np.asarray(self._encoder.embed_utterance(wav), dtype=np.float64)
        finally:
            torch.set_num_threads(threads)


def default_speaker_encoder() -> tuple[SpeakerEncoder | None, str | None]:
    """resemblyzer if it loads -> (encoder, None), else (None, why)."""
    try:
        return ResemblyzerEncoder(), None
    except GateError as e:
        return None, str(e)


def _speaker_fixture(clip, clip_rate: int, ref_audio, port_audio, rate: int, encoder, why) -> dict:
    """Cosine of the clip's embedding with each run's speech, or why there is none."""
    if encoder is None:
        return {"skipped": why}
    try:
        target = encoder.embed(clip, clip_rate)
        return {
            "encoder": encoder.name,
            **{
                label: float(target @ encoder.embed(audio, rate))
                for label, audio in (("reference", ref_audio), ("port", port_audio))
            },
        }
    except GateError as e:
        return {"skipped": str(e)}


def _speaker_summary(results: list[FixtureResult], encoder, why) -> dict:
    clones = [r for r in results if r.clone]
    if not clones:
        return {}
    scored = [r.speaker for r in clones if r.speaker and "port" in r.speaker]
    if not scored:
        reasons = sorted({r.speaker["skipped"] for r in clones if r.speaker and "skipped" in r.speaker})
        return {"fixtures": len(clones), "skipped": "; ".join(reasons) or why}
    ref, port = [s["reference"] for s in scored], [s["port"] for s in scored]
    return {
        "encoder": scored[0]["encoder"],
        "fixtures": len(scored),
        "reference_mean": float(np.mean(ref)),
        "reference_min": float(np.min(ref)),
        "port_mean": float(np.mean(port)),
        "port_min": float(np.min(port)),
    }
