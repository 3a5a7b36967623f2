"""What the public calls hand back (Synthesis, Voice) as Python values: their repr gives the figures, not the
arrays, and == compares identity (two arrays have no one truth value)."""

from __future__ import annotations

import numpy as np

from audio8_coreai import Synthesis, Voice


def _synthesis() -> Synthesis:
    codes = np.arange(20, dtype=np.int64).reshape(10, 2)
    return Synthesis(np.zeros(4096, np.float32), 44100, codes, True, 7, 5, 100, 0.1, 0.2, 0.3)


def test_a_synthesis_says_its_figures_and_compares_as_itself():
    one, two = _synthesis(), _synthesis()
    assert repr(one) == (
        "Synthesis(sample_rate=44100, reached_eos=True, seed=7, prompt_length=5, max_frames=100, prefill_s=0.1, "
        "frames_s=0.2, codec_s=0.3)"
    )
    assert one == one and one != two and [one].index(one) == 0 and two not in [one]
    assert (one.frames, one.duration_s) == (2, 4096 / 44100)


def test_a_voice_says_its_figures_not_its_codes():
    voice = Voice(np.zeros((10, 300), np.int64), "Hello there.", 16000, 2.0, "ab12", "2026-12-04T00:00:00Z", "ana")
    said = repr(voice)
    assert said.startswith("Voice(transcript='Hello there.', sample_rate=16000, duration_s=2.0, fingerprint='ab12'")
    assert "name='ana'" in said and "array" not in said and len(said) < 300
    assert voice == voice and voice != Voice(**{k: getattr(voice, k) for k in voice.__dataclass_fields__})
