"""The gate's ASR round trip: recognisers (pocketsphinx, or a plugged callable), the text normaliser and the
WER/CER counts per fixture and per language."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from .errors import _GATE_EXTRA, GateError
from .fixtures import Fixture
from .report import FixtureResult

WORD_LANGUAGES = frozenset({"en"})  # scored as WER; every other language as CER
SPACELESS_LANGUAGES = frozenset({"ja", "zh"})  # written without spaces: recognisers' spaces are not errors


def normalise_text(text: str) -> str:
    """The scoring normaliser: NFKC, lowercase, every punctuation character (Unicode category P*) to a space,
    runs of whitespace to one space, stripped."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return " ".join(text.split())


@dataclass
class ErrorCount:
    """Edits (substitutions + deletions + insertions) against ``units`` reference words or characters."""

    edits: int = 0
    units: int = 0

    @property
    def rate(self) -> float | None:
        return self.edits / self.units if self.units else None

    def __add__(self, other: ErrorCount) -> ErrorCount:
        return ErrorCount(self.edits + other.edits, self.units + other.units)


def metric_for(language: str) -> str:
    """``"WER"`` for languages scored over words (en), ``"CER"`` for the others."""
    return "WER" if language in WORD_LANGUAGES else "CER"


def count_errors(language: str, reference: str, hypothesis: str) -> ErrorCount:
    """Word (en) or character (other languages; ja/zh without spaces) errors of ``hypothesis`` against
    ``reference``, both normalised by :func:`normalise_text`, counted by jiwer. Raises GateError without jiwer."""
    try:
        import jiwer
    except ImportError as e:
        raise GateError(f"the ASR round trip needs jiwer: {_GATE_EXTRA}") from e
    ref, hyp = normalise_text(reference), normalise_text(hypothesis)
    if language in SPACELESS_LANGUAGES:
        ref, hyp = ref.replace(" ", ""), hyp.replace(" ", "")
    if not ref:
        return ErrorCount(0, 0)
    out = jiwer.process_words(ref, hyp) if language in WORD_LANGUAGES else jiwer.process_characters(ref, hyp)
    return ErrorCount(out.substitutions + out.deletions + out.insertions, out.substitutions + out.deletions + out.hits)


class Recognizer(Protocol):
    """Speech to text. ``languages``: the ISO 639-1 codes it transcribes (None: any language)."""

    name: str
    languages: frozenset[str] | None

    def transcribe(self, audio: np.ndarray, sample_rate: int, language: str) -> str:
        """Mono float ``audio`` [N] at ``sample_rate`` Hz, spoken in ``language`` -> the words heard (may be
        empty)."""
        ...


def covers(recognizer: Recognizer, language: str) -> bool:
    """Whether ``recognizer`` transcribes ``language``."""
    return recognizer.languages is None or language in recognizer.languages


class PocketSphinxRecognizer:
    """US English with the acoustic model, dictionary and language model inside the ``pocketsphinx`` package.

    Input is resampled to 16 kHz, peak-normalised to 0.5 and given a fixed, seeded noise floor of 3e-3 RMS
    (-50 dBFS): pocketsphinx's features break down on digital silence, which synthetic speech is full of
    (measured on espeak-ng en-us sentences: WER 0.86-0.95 without the floor; 34/54 = 0.63 with it on the five of
    tests/measure/test_gate.py, where a floor of 1e-3 or 1e-2, or no peak normalisation, did no better). Even so, its
    rates on synthetic speech are high: read them beside the reference's, not as absolute quality.
    """

    name = "pocketsphinx en-us"
    languages = frozenset({"en"})
    RATE = 16000
    PEAK = 0.5
    FLOOR = 3e-3

    def __init__(self):
        try:
            from pocketsphinx import Decoder
        except ImportError as e:
            raise GateError(f"pocketsphinx is not installed: {_GATE_EXTRA}") from e
        self._decoder = Decoder(samprate=self.RATE, loglevel="FATAL")

    def transcribe(self, audio: np.ndarray, sample_rate: int, language: str = "en") -> str:
        import soxr

        x = np.asarray(audio, dtype=np.float64).reshape(-1)
        if sample_rate != self.RATE:
            x = soxr.resample(x, sample_rate, self.RATE, quality="HQ")
        peak = np.abs(x).max() if x.size else 0.0
        if peak > 0:
            x = x * (self.PEAK / peak)
        x = x + self.FLOOR * np.random.default_rng(0).standard_normal(x.size)
        pcm = (np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)
        self._decoder.start_utt()
        self._decoder.process_raw(pcm.tobytes(), full_utt=True)
        self._decoder.end_utt()
        hyp = self._decoder.hyp()
        return hyp.hypstr if hyp is not None else ""


class CallableRecognizer:
    """A recogniser plugged in as a Python callable ``fn(audio, sample_rate, language) -> text``: ``audio``
    mono float32 [N], ``sample_rate`` in Hz (44100 for the gate's speech), ``language`` an ISO 639-1 code.
    ``name`` names it in the report; ``languages`` is the callable's ``languages`` attribute (an iterable of
    codes) when it has one, else None (every language)."""

    def __init__(self, fn: Callable[[np.ndarray, int, str], str], name: str):
        self._fn = fn
        self.name = name
        codes = getattr(fn, "languages", None)
        self.languages = None if codes is None else frozenset(codes)

    def transcribe(self, audio: np.ndarray, sample_rate: int, language: str) -> str:
        """Raises GateError when the callable returns anything but a string."""
        text = self._fn(np.ascontiguousarray(audio, dtype=np.float32).reshape(-1), int(sample_rate), language)
        if not isinstance(text, str):
            raise GateError(f"recogniser {self.name} returned {type(text).__name__}, not the text heard (str)")
        return text


def load_recognizer(spec: str) -> CallableRecognizer:
    """``MODULE:CALLABLE`` (``CALLABLE`` may be dotted: ``pkg.asr:Model.transcribe``) -> the callable as a
    :class:`CallableRecognizer`. The module is imported with the current folder first on ``sys.path`` (as
    ``python -m`` would), so a module file beside the command works without installing it.

    Raises GateError for a malformed spec, a module that cannot be imported, a missing attribute or one
    that is not callable.
    """
    import importlib
    import sys

    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise GateError(f"--recognizer {spec!r}: expected MODULE:CALLABLE, e.g. my_asr:transcribe")
    cwd = str(Path.cwd())
    sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise GateError(
            f"--recognizer {spec!r}: cannot import {module_name} ({e}); put it in the current folder or on PYTHONPATH"
        ) from e
    finally:
        sys.path.remove(cwd)
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise GateError(f"--recognizer {spec!r}: {module_name} has no {attr}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise GateError(f"--recognizer {spec!r}: {attr} is a {type(fn).__name__}, not a callable")
    return CallableRecognizer(fn, spec)


def default_recognizers() -> tuple[list[Recognizer], str | None]:
    """The offline recognisers that load here -> (recognisers, why none could, or None)."""
    try:
        return [PocketSphinxRecognizer()], None
    except GateError as e:
        return [], str(e)


def _asr_fixture(fixture: Fixture, ref_audio, port_audio, rate: int, recognizers) -> dict:
    """Transcripts and error counts of both runs' audio, or why there are none."""
    recognizer = next((r for r in recognizers or () if covers(r, fixture.language)), None)
    if recognizer is None:
        return {"skipped": f"no recogniser for {fixture.language!r}"}
    out = {"recognizer": recognizer.name, "metric": metric_for(fixture.language)}
    for label, audio in (("reference", ref_audio), ("port", port_audio)):
        text = recognizer.transcribe(audio, rate, fixture.language) if len(audio) else ""
        count = count_errors(fixture.language, fixture.text, text)
        out[label] = {"text": text, "edits": count.edits, "units": count.units, "rate": count.rate}
    return out


def _asr_summary(by_language: dict[str, list[FixtureResult]], recognizers, why: str | None = None) -> dict:
    """Corpus error rates per language (edits / reference units over its fixtures), reference and port; ``why``:
    why the default recognisers did not load (said in a skipped language's reason)."""
    out = {}
    for lang, results in by_language.items():
        scored = [r.asr for r in results if r.asr and "port" in r.asr]
        if not scored:
            have = ", ".join(sorted({x for r in recognizers or () for x in r.languages or ()})) or "none"
            out[lang] = {
                "fixtures": len(results),
                "skipped": f"no recogniser for {lang!r} (recognisers here cover: {have}{'; ' + why if why else ''})",
            }
            continue
        entry = {"fixtures": len(scored), "metric": scored[0]["metric"], "recognizer": scored[0]["recognizer"]}
        for label in ("reference", "port"):
            total = ErrorCount()
            for a in scored:
                total = total + ErrorCount(a[label]["edits"], a[label]["units"])
            entry[label] = {"edits": total.edits, "units": total.units, "rate": total.rate}
        out[lang] = entry
    return out
