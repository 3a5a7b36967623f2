"""The quality gate: is the port's speech the reference's speech? (DESIGN.md gate.py; PORT-NOTES.md section 4)

Under sampling one flipped draw changes every later frame, so end-to-end identity is no bar for reduced
precisions; the gate measures the port the way its users hear it, beside a reference run, with a ladder:

1. **Teacher-forced agreement.** The port is fed the reference's columns and uniforms step by step
   (:func:`.parity.replay_forced`): semantic and codebook draw agreement, slow argmax agreement, logits cosine
   min and max |diff|, and every miss with the reference's Gumbel margin (:func:`gumbel_margin`): how close the
   reference's own draw came to going the other way.
2. **Codec.** The port decodes the reference's codes: waveform cosine, max |diff| and log-mel cosine (128 mels,
   n_fft 2048, hop 512, log(mel power + 1e-5); :func:`log_mel`). Clone fixtures also compare the port's codec
   encoder codes of the reference clip with the reference's.
3. **Free run.** The port generates with the fixture's seed (the same uniforms as the reference): eos before the
   frame cap, frames, and the identical-prefix length (frames equal to the reference's before the first flip).
4. **ASR round trip.** A :class:`Recognizer` transcribes the reference's and the port's audio; errors are
   counted with jiwer after :func:`normalise_text` as corpus rates per language: WER for en, CER for every
   other language (ja and zh without spaces). The default recogniser is pocketsphinx, whose PyPI package ships
   an English model; a stronger one plugs in as a Python callable (:func:`load_recognizer`, ``audio8 gate
   --recognizer MODULE:CALLABLE``); languages without a recogniser are reported as skipped. A language passes
   when the port's rate is at most the reference's plus ``asr_margin`` (absolute).
5. **Speaker similarity** (clone fixtures): cosine of :class:`SpeakerEncoder` embeddings (resemblyzer's, whose
   PyPI package ships its model) of the generated speech and the reference clip, for the reference run and
   the port. It passes when the port's mean is at least the reference's mean minus ``speaker_margin``.
6. **Pictures**: waveform and log-mel spectrogram per fixture (reference vs port) and a summary chart, PNG.

Two references (``against``):

- ``"fp32"``: the same checkpoint in fp32 through the torch backend (on ``reference_device``), over a fixtures
  file (:func:`load_fixtures`; the default set ships with the package). Its run is recorded in the oracle's
  fixture layout, so the teacher-forced replay is parity's own.
- an oracle ``fixture.npz`` (recorded from the publisher's code, see ``shared/oracle/README.md``): the whole
  :func:`.parity.run_parity` replay, with the recorded uniforms. Oracle checkpoints have random weights and the
  recording holds no text, so stages 4 and 5 are skipped.

Verdicts: ``eos`` (the port reaches eos wherever the reference did), ``asr`` and ``speaker`` as above, and
``tensor`` (all draws equal and free runs identical) only for an fp32 port, where exactness is expected;
reduced precisions report the tensor stages without a verdict (as the earlier port's engine gate did).
Random-weight checkpoints make no speech: on them only the tensor stages mean anything.

Reference clips: a clone fixture gives a clip file and its transcript, or only the transcript, and the gate
speaks it with espeak-ng (``espeak_voice``, default per language) into ``OUT/clips/NAME.wav``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from .audio import REFERENCE_RATE, read_reference, write_audio
from .backends.torch import TorchBackend
from .engine import Generation, frame_budget, generate
from .errors import Audio8Error
from .graphs import SamplingParams
from .parity import (ParityReport, ScenarioReport, _cos, _params, compare_free_run, load_fixture, replay_forced,
                     run_parity)
from .text import check_text
from .sampling import NoiseSource, RasWindow, np_processed_scores

DEFAULT_FIXTURES = Path(__file__).with_name("gate_fixtures.json")
N_MELS, N_FFT, HOP = 128, 2048, 512
LOG_FLOOR = 1e-5  # added to the mel power before the log: the earlier port's definition (PORT-NOTES 4.2)
ASR_MARGIN = 0.05  # absolute error-rate points the port may lose to the reference per language
SPEAKER_MARGIN = 0.05  # cosine the port's mean speaker similarity may lose to the reference's
LOW_MARGIN = 0.1  # a miss whose reference margin is under this was a near-tie: a rounding-sized flip
WORD_LANGUAGES = frozenset({"en"})  # scored as WER; every other language as CER
SPACELESS_LANGUAGES = frozenset({"ja", "zh"})  # written without spaces: recognisers' spaces are not errors
ESPEAK_VOICES = {"en": "en-us", "ja": "ja", "zh": "cmn", "de": "de", "fr": "fr", "es": "es", "ko": "ko"}
_GATE_EXTRA = "pip install 'audio8-coreai[gate]'"


class GateError(Audio8Error, ValueError):
    """The gate cannot run as asked (bad fixtures file, no espeak-ng for a clip, missing extra)."""


# --- fixtures --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fixture:
    """One utterance of the gate: ``text`` in ``language`` (ISO 639-1) with ``seed``; a clone fixture also has
    the reference clip ``ref_audio`` (a path, or None to speak ``ref_text`` with espeak-ng voice
    ``espeak_voice``) and its transcript ``ref_text``."""

    name: str
    language: str
    text: str
    seed: int
    ref_text: str | None = None
    ref_audio: Path | None = None
    espeak_voice: str | None = None

    @property
    def clone(self) -> bool:
        return self.ref_text is not None


def load_fixtures(path: str | Path | None = None) -> list[Fixture]:
    """Read a fixtures file (default: the set shipped with the package) -> fixtures, in file order.

    The file is a JSON list of ``{"name", "language", "text", "seed", "reference"}`` where ``reference`` is
    null (the model's own voice) or ``{"text": transcript, "audio": clip path or null, "espeak_voice":
    optional}``; a relative clip path is relative to the file. Raises GateError naming the entry and field.
    """
    path = Path(path).expanduser() if path is not None else DEFAULT_FIXTURES
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GateError(f"cannot read fixtures {path}: {e}") from e
    if not isinstance(entries, list) or not entries:
        raise GateError(f"fixtures {path}: expected a non-empty JSON list of fixtures")
    out, names = [], set()
    for i, e in enumerate(entries):
        where = f"fixtures {path}, entry {i}"
        if not isinstance(e, dict):
            raise GateError(f"{where}: expected an object with name, language, text, seed, reference")
        missing = [k for k in ("name", "language", "text", "seed") if k not in e]
        if missing:
            raise GateError(f"{where}: missing {', '.join(missing)}")
        name, language, text, seed = e["name"], e["language"], e["text"], e["seed"]
        if not isinstance(name, str) or not name or not name.replace("_", "").replace("-", "").isalnum():
            raise GateError(f"{where}: name must be letters, digits, '_' or '-' (it names files), got {name!r}")
        if name in names:
            raise GateError(f"{where}: the name {name!r} is used twice")
        names.add(name)
        if not isinstance(language, str) or not language:
            raise GateError(f"{where} ({name}): language must be a code such as en, ja, zh")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise GateError(f"{where} ({name}): seed must be an integer >= 0, got {seed!r}")
        ref = e.get("reference")
        if ref is None:
            out.append(Fixture(name, language, check_text(text), seed))
            continue
        if not isinstance(ref, dict) or not isinstance(ref.get("text"), str):
            raise GateError(f"{where} ({name}): reference must be null or {{\"text\": transcript, \"audio\": "
                            "clip path or null, \"espeak_voice\": optional}")
        audio = ref.get("audio")
        clip = None if audio is None else (path.parent / Path(audio).expanduser())
        out.append(Fixture(name, language, check_text(text), seed, check_text(ref["text"], "reference text"),
                           clip, ref.get("espeak_voice")))
    return out


def espeak_clip(text: str, voice: str, path: Path) -> Path:
    """Speak ``text`` with espeak-ng ``voice`` into the WAV ``path`` (22.05 kHz, 16-bit mono).

    Raises GateError when espeak-ng is not installed or fails (unknown voice)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise GateError("espeak-ng is not installed, and a clone fixture without a clip needs it to speak its "
                        "reference (apt-get install espeak-ng), or give the clip in the fixtures file")
    path.parent.mkdir(parents=True, exist_ok=True)
    run = subprocess.run([exe, "-v", voice, "-w", str(path), text], capture_output=True, text=True, timeout=120)
    if run.returncode != 0 or not path.is_file():
        raise GateError(f"espeak-ng could not speak voice {voice!r}: {run.stderr.strip() or run.returncode}")
    return path


# --- metrics ---------------------------------------------------------------------------------------------------


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear (200/3 Hz a mel) below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(hz < 1000.0, hz * 3.0 / 200.0, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / log_step)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(mel < 15.0, mel * 200.0 / 3.0, 1000.0 * np.exp(log_step * (mel - 15.0)))


def mel_filterbank(sample_rate: int, n_fft: int = N_FFT, n_mels: int = N_MELS) -> np.ndarray:
    """Triangular mel filters, float64 [n_mels, n_fft // 2 + 1], 0 Hz to Nyquist.

    Slaney's mel scale and area normalisation (each filter scaled by 2 / its width in Hz): the defaults of
    ``librosa.filters.mel``, so the log-mel here is the one most published comparisons use.
    """
    fft_hz = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2))
    width = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    rising, falling = -ramps[:-2] / width[:-1, None], ramps[2:] / width[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Log-mel spectrogram of mono ``audio`` [N] -> float32 [128, 1 + N // 512].

    Centred frames (zero-padded by n_fft/2 each side), periodic Hann window of 2048, hop 512, power spectrum,
    128 Slaney mel filters (:func:`mel_filterbank`), then ``log(mel + 1e-5)``.
    """
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    x = np.pad(x, N_FFT // 2)
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    return np.log(mel_filterbank(sample_rate) @ power.T + LOG_FLOOR).astype(np.float32)


def log_mel_cos(a: np.ndarray, b: np.ndarray, sample_rate: int) -> float:
    """Cosine of the log-mel spectrograms of two mono signals, over their common length."""
    n = min(len(a), len(b))
    return _cos(log_mel(a[:n], sample_rate), log_mel(b[:n], sample_rate))


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
            noise = np.stack([fx[f"{sc}__sem_regular_uniform_compact"][m.step, m.item],
                              fx[f"{sc}__sem_ras_uniform_compact"][m.step, m.item]]) if params.do_sample else None
            margin = _semantic_margin(fx[f"{sc}__slow_logits_compact"][m.step, m.item], noise, params, m.want, cfg)
        else:
            logits = fx[f"{sc}__fast_logits"][m.step, m.draw - 1, m.item]
            if params.do_sample:
                margin = gumbel_margin(np_processed_scores(logits, params.top_k, params.top_p, params.temperature),
                                       fx[f"{sc}__fast_uniform"][m.step, m.draw - 1, m.item])
            else:
                margin = gumbel_margin(logits)
        out.append({**asdict(m), "margin": round(margin, 6)})
    return out


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

    def __add__(self, other: "ErrorCount") -> "ErrorCount":
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
    return ErrorCount(out.substitutions + out.deletions + out.insertions,
                      out.substitutions + out.deletions + out.hits)


# --- recognisers and speaker encoders --------------------------------------------------------------------------


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
    tests/test_gate.py, where a floor of 1e-3 or 1e-2, or no peak normalisation, did no better). Even so, its
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
            raise GateError(f"resemblyzer cannot be imported ({e}): {_GATE_EXTRA} and "
                            "pip install --no-deps resemblyzer") from e
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
        raise GateError(f"--recognizer {spec!r}: cannot import {module_name} ({e}); put it in the current folder "
                        "or on PYTHONPATH") from e
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


def default_speaker_encoder() -> tuple[SpeakerEncoder | None, str | None]:
    """resemblyzer if it loads -> (encoder, None), else (None, why)."""
    try:
        return ResemblyzerEncoder(), None
    except GateError as e:
        return None, str(e)


# --- the report ------------------------------------------------------------------------------------------------


@dataclass
class FixtureResult:
    """One fixture's rungs, JSON-ready. ``teacher_forced``: a :class:`.parity.ScenarioReport` as a dict with
    ``misses`` carrying margins; ``codec``: ``waveform_cos``, ``waveform_max_diff``, ``logmel_cos``; ``asr`` and
    ``speaker``: the reference's and the port's scores, or ``{"skipped": why}``; paths relative to the report."""

    name: str
    language: str | None
    text: str | None
    seed: int | None
    clone: bool
    teacher_forced: dict
    codec: dict | None = None
    encoder: dict | None = None
    asr: dict | None = None
    speaker: dict | None = None
    picture: str | None = None
    audio: dict[str, str] = field(default_factory=dict)


@dataclass
class GateReport:
    """The whole gate: what was compared, per-fixture results, totals, verdicts and ``passed``."""

    model: str
    port: str
    reference: str
    precision: str
    fixtures: list[FixtureResult] = field(default_factory=list)
    asr: dict = field(default_factory=dict)
    speaker: dict = field(default_factory=dict)
    verdicts: dict = field(default_factory=dict)
    margins: dict = field(default_factory=dict)
    parity: dict | None = None  # the oracle replay (against a fixture.npz), as parity reports it
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def totals(self) -> dict:
        """Teacher-forced sums over the fixtures: agreeing/total draws, min cosines, misses and near-ties."""
        tf = [f.teacher_forced for f in self.fixtures]
        out = {k: [sum(t[k][0] for t in tf), sum(t[k][1] for t in tf)]
               for k in ("slow_argmax", "semantic_draws", "codebook_draws")}
        out["slow_logits_min_cos"] = min((t["slow_logits_min_cos"] for t in tf), default=1.0)
        out["fast_logits_min_cos"] = min((t["fast_logits_min_cos"] for t in tf), default=1.0)
        misses = [m for t in tf for m in t["misses"]]
        out["misses"] = len(misses)
        out["misses_low_margin"] = sum(m["margin"] < LOW_MARGIN for m in misses)
        out["free_run_identical"] = [sum(bool(t["free_run_identical"]) for t in tf), len(tf)]
        out["free_run_frames"] = [sum(t["free_run_frames"] or 0 for t in tf),
                                  sum(t["free_run_expected_frames"] or 0 for t in tf)]
        return out

    @property
    def passed(self) -> bool:
        """No verdict is ``fail`` (skipped and reported rungs do not fail the gate)."""
        flat = [v for v in self.verdicts.values() if isinstance(v, str)]
        flat += [v for d in self.verdicts.values() if isinstance(d, dict) for v in d.values()]
        return not any(v == "fail" for v in flat)

    def to_dict(self) -> dict:
        return {**asdict(self), "totals": self.totals(), "passed": self.passed}


def _fmt_rate(c: dict) -> str:
    return "-" if c["rate"] is None else f"{c['edits']}/{c['units']} = {100 * c['rate']:.1f} %"


def render_markdown(report: GateReport) -> str:
    """``report.md``: verdicts, totals, per-language ASR, speaker, a table per fixture, misses, pictures."""
    t = report.totals()
    lines = [f"# Gate: {report.port} against {report.reference}", "",
             f"Model `{report.model}`, precision {report.precision}; {len(report.fixtures)} fixtures in "
             f"{report.seconds:.0f} s. **{'PASS' if report.passed else 'FAIL'}**", "",
             "## Verdicts", ""]
    for key, v in report.verdicts.items():
        if isinstance(v, dict):
            v = ", ".join(f"{k}: {x}" for k, x in v.items()) or "-"
        lines.append(f"- {key}: {v}")
    lines += ["", f"Margins: ASR {report.margins.get('asr')} (absolute rate), speaker {report.margins.get('speaker')} "
              "(cosine).", "", "## Teacher-forced agreement", "",
              "| measure | value |", "|---|---|",
              f"| semantic draws | {t['semantic_draws'][0]}/{t['semantic_draws'][1]} |",
              f"| codebook draws | {t['codebook_draws'][0]}/{t['codebook_draws'][1]} |",
              f"| slow argmax | {t['slow_argmax'][0]}/{t['slow_argmax'][1]} |",
              f"| slow / fast logits cos min | {t['slow_logits_min_cos']:.6f} / {t['fast_logits_min_cos']:.6f} |",
              f"| misses (reference margin < {LOW_MARGIN}) | {t['misses']} ({t['misses_low_margin']}) |",
              f"| free runs identical | {t['free_run_identical'][0]}/{t['free_run_identical'][1]} |",
              f"| free-run frames port / reference | {t['free_run_frames'][0]} / {t['free_run_frames'][1]} |", ""]
    if report.asr:
        lines += ["## ASR round trip", "", "| language | metric | fixtures | reference | port | verdict |",
                  "|---|---|---|---|---|---|"]
        for lang, a in report.asr.items():
            if "skipped" in a:
                lines.append(f"| {lang} | - | {a['fixtures']} | - | - | skipped: {a['skipped']} |")
            else:
                lines.append(f"| {lang} | {a['metric']} | {a['fixtures']} | {_fmt_rate(a['reference'])} | "
                             f"{_fmt_rate(a['port'])} | {report.verdicts['asr'].get(lang)} |")
        lines.append("")
    if report.speaker:
        lines += ["## Speaker similarity (clones)", ""]
        if "skipped" in report.speaker:
            lines.append(f"skipped: {report.speaker['skipped']}")
        else:
            s = report.speaker
            lines.append(f"{s['encoder']}, {s['fixtures']} clones: reference mean {s['reference_mean']:.3f} / min "
                         f"{s['reference_min']:.3f}; port mean {s['port_mean']:.3f} / min {s['port_min']:.3f}")
        lines.append("")
    lines += ["## Fixtures", "", "| fixture | lang | semantic | codebook | misses | wav cos | log-mel cos | frames "
              "port/ref | prefix | eos | ASR ref/port | speaker ref/port |", "|" + "---|" * 12]
    for f in report.fixtures:
        tf, c = f.teacher_forced, f.codec or {}
        asr = f.asr or {}
        asr_s = "-" if "port" not in asr else (f"{_pct(asr['reference']['rate'])}/{_pct(asr['port']['rate'])}")
        spk = f.speaker or {}
        spk_s = "-" if "port" not in spk else f"{spk['reference']:.3f}/{spk['port']:.3f}"
        wav = "-" if "waveform_cos" not in c else f"{c['waveform_cos']:.6f}"
        mel = "-" if "logmel_cos" not in c else f"{c['logmel_cos']:.6f}"
        lines.append(f"| {f.name} | {f.language or '-'} | {tf['semantic_draws'][0]}/{tf['semantic_draws'][1]} | "
                     f"{tf['codebook_draws'][0]}/{tf['codebook_draws'][1]} | {len(tf['misses'])} | {wav} | {mel} | "
                     f"{tf['free_run_frames']}/{tf['free_run_expected_frames']} | {tf['free_run_prefix']} | "
                     f"{tf['free_run_eos']} | {asr_s} | {spk_s} |")
    misses = [(f.name, m) for f in report.fixtures for m in f.teacher_forced["misses"]]
    if misses:
        lines += ["", "## Misses (teacher-forced)", "", "| fixture | step | item | draw | reference | port | margin |",
                  "|---|---|---|---|---|---|---|"]
        for name, m in misses:
            draw = "semantic" if m["draw"] == 0 else f"codebook {m['draw']}"
            lines.append(f"| {name} | {m['step']} | {m['item']} | {draw} | {m['want']} | {m['got']} | "
                         f"{m['margin']:.4f} |")
    asr_rows = [f for f in report.fixtures if f.asr and "port" in f.asr]
    if asr_rows:
        lines += ["", "## Transcripts", ""]
        for f in asr_rows:
            lines += [f"- **{f.name}** text: {f.text}", f"  - reference: {f.asr['reference']['text']}",
                      f"  - port: {f.asr['port']['text']}"]
    if report.skipped:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in report.skipped]
    lines += ["", "## Pictures", "", "![summary](summary.png)", ""]
    lines += [f"![{f.name}]({f.picture})" for f in report.fixtures if f.picture]
    return "\n".join(lines) + "\n"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f} %"


# --- pictures --------------------------------------------------------------------------------------------------


def _matplotlib():
    """(Figure, FigureCanvasAgg) from matplotlib; raises GateError when it is not installed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise GateError(f"the gate's pictures need matplotlib: {_GATE_EXTRA}") from e
    return Figure, FigureCanvasAgg


def _figure(width: float, height: float):
    """A matplotlib Figure on the Agg canvas, without pyplot (no global backend switch, no GUI)."""
    figure, canvas = _matplotlib()
    fig = figure(figsize=(width, height), dpi=100, layout="constrained")
    canvas(fig)
    return fig


def plot_fixture(path: Path, title: str, signals: Sequence[tuple[str, np.ndarray]], sample_rate: int) -> Path:
    """Waveform (top) and log-mel spectrogram (bottom) of each labelled signal, side by side, as a PNG."""
    fig = _figure(6.0 * len(signals), 6.0)
    axes = fig.subplots(2, len(signals), squeeze=False)
    mels = [log_mel(x, sample_rate) if len(x) else np.zeros((N_MELS, 1), np.float32) for _, x in signals]
    lo, hi = min(float(m.min()) for m in mels), max(float(m.max()) for m in mels)
    for i, ((label, x), mel) in enumerate(zip(signals, mels)):
        t = np.arange(len(x)) / sample_rate
        axes[0, i].plot(t, x, linewidth=0.4)
        axes[0, i].set(title=f"{label}: {len(x) / sample_rate:.2f} s", xlabel="s", ylim=(-1, 1))
        axes[1, i].imshow(mel, origin="lower", aspect="auto", vmin=lo, vmax=hi, cmap="magma",
                          extent=(0, len(x) / sample_rate, 0, N_MELS))
        axes[1, i].set(title=f"{label}: log-mel", xlabel="s", ylabel="mel bin")
    fig.suptitle(title)
    fig.savefig(path)
    return path


def plot_summary(path: Path, report: GateReport) -> Path:
    """Four panels: teacher-forced agreement, free-run frames, ASR error and speaker similarity per fixture
    (reference vs port), as a PNG."""
    fig = _figure(14.0, 9.0)
    (agree, frames), (asr, spk) = fig.subplots(2, 2)
    names = [f.name for f in report.fixtures]
    x = np.arange(len(names))

    def pct(pair):
        return 100.0 * pair[0] / pair[1] if pair[1] else 100.0

    def bars(ax, a, b, labels, title, ylabel, xs=x, ticks=names):
        ax.bar(xs - 0.2, a, 0.4, label=labels[0])
        ax.bar(xs + 0.2, b, 0.4, label=labels[1])
        ax.set_xticks(xs, ticks, rotation=60, ha="right", fontsize=8)
        ax.set_title(title, loc="left")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, ncols=2, loc="lower right", bbox_to_anchor=(1.0, 1.0))  # above the bars

    tf = [f.teacher_forced for f in report.fixtures]
    bars(agree, [pct(t["semantic_draws"]) for t in tf], [pct(t["codebook_draws"]) for t in tf],
         ("semantic", "codebook"), "teacher-forced draws equal to the reference", "%")
    agree.set_ylim(min([90.0] + [pct(t["codebook_draws"]) - 2 for t in tf]), 100.5)
    bars(frames, [t["free_run_expected_frames"] or 0 for t in tf], [t["free_run_frames"] or 0 for t in tf],
         ("reference", "port"), "free-run frames", "frames")
    rows = [f for f in report.fixtures if f.asr and "port" in f.asr]
    if rows:
        bars(asr, [100 * (f.asr["reference"]["rate"] or 0) for f in rows],
             [100 * (f.asr["port"]["rate"] or 0) for f in rows], ("reference", "port"),
             "ASR error (WER en, CER others)", "%", np.arange(len(rows)), [f.name for f in rows])
    else:
        asr.set_axis_off()
        asr.text(0.5, 0.5, "ASR round trip skipped", ha="center", va="center")
    rows = [f for f in report.fixtures if f.speaker and "port" in f.speaker]
    if rows:
        bars(spk, [f.speaker["reference"] for f in rows], [f.speaker["port"] for f in rows], ("reference", "port"),
             "speaker similarity to the reference clip", "cosine", np.arange(len(rows)), [f.name for f in rows])
    else:
        spk.set_axis_off()
        spk.text(0.5, 0.5, "speaker similarity skipped", ha="center", va="center")
    fig.suptitle(f"{report.port} against {report.reference}")
    fig.savefig(path)
    return path


# --- running ---------------------------------------------------------------------------------------------------


class _RecordingNoise:
    """A :class:`.sampling.NoiseSource` that keeps every frame's uniforms (the reference run's recording)."""

    def __init__(self, source: NoiseSource):
        self.source, self.frames = source, []

    def next_frame(self) -> tuple[np.ndarray, np.ndarray]:
        pair = self.source.next_frame()
        self.frames.append(pair)
        return pair


def record_run(name: str, prompt: np.ndarray, params: SamplingParams, gen: Generation,
               noise: Sequence[tuple[np.ndarray, np.ndarray]], ras_window_size: int) -> tuple[dict, dict]:
    """A reference run (``gen`` from :func:`.engine.generate` with ``keep_results``, and the uniforms it drew) in
    the oracle's fixture layout, scenario ``name``, batch 1 -> (arrays, meta) for :func:`.parity.replay_forced`
    and :func:`.parity.compare_free_run`. Every step is recorded, the eos step included."""
    res = gen.frame_results
    steps = len(res)
    semantic = np.array([r.semantic for r in res], dtype=np.int64)
    codebooks = np.stack([r.codes for r in res]).astype(np.int64)  # [S, C]
    window, windows = RasWindow(ras_window_size), []
    for r in res:  # the windows the engine showed each step
        windows.append(window.current()[0])
        window.push(r.semantic)
    slow = np.stack([n[0] for n in noise[:steps]])  # [S, 2, V+1]
    fast = np.stack([n[1] for n in noise[:steps]])  # [S, C-1, codebook_size]
    p = prompt.shape[1]
    fx = {"num_steps": np.int64(steps), "prompt_input_ids": prompt[None],
          "sem_regular_uniform_compact": slow[:, None, 0], "sem_ras_uniform_compact": slow[:, None, 1],
          "fast_uniform": fast[:, :, None], "ras_previous": np.stack(windows)[:, None],
          "semantic": semantic[:, None], "codebooks": codebooks[:, None],
          "step_input_column": np.concatenate([semantic[:, None], codebooks], axis=1)[:-1, None],
          "step_physical_position": (p + np.arange(steps - 1))[:, None],
          "slow_logits_compact": np.stack([r.logits for r in res])[:, None],
          "fast_logits": np.stack([r.fast_logits for r in res])[:, :, None],
          "fast_choice": codebooks[:, 1:, None], "codes": gen.codes[None],
          "code_lengths": np.array([gen.frames]), "finished": np.array([gen.reached_eos])}
    meta = {"scenarios": {name: {"do_sample": params.do_sample, "max_new_tokens": gen.max_frames,
                                 "extra": {"temperature": params.temperature, "top_k": params.top_k,
                                           "top_p": params.top_p}}}}
    return {f"{name}__{k}": v for k, v in fx.items()}, meta


def _codec_stage(reference: np.ndarray, port: np.ndarray, sample_rate: int) -> dict:
    """Waveform cosine, max |diff| and log-mel cosine of two decodes of the same codes."""
    if not len(reference):
        return {"skipped": "no frames to decode"}
    n = min(len(reference), len(port))
    return {"waveform_cos": _cos(port[:n], reference[:n]),
            "waveform_max_diff": float(np.abs(port[:n] - reference[:n]).max()),
            "logmel_cos": log_mel_cos(reference, port, sample_rate)}


def _teacher_forced(rep: ScenarioReport, fx: dict, params: SamplingParams, cfg) -> dict:
    out = asdict(rep)
    out["misses"] = miss_margins(rep, fx, rep.key, params, cfg)
    return out


def _precision(backend) -> str:
    """The port's precision: Core AI assets say so; the torch backend's dtype otherwise."""
    precision = getattr(backend, "precision", None)
    if precision is not None:  # a name (Core AI manifest) or a precision setting with a name (torch)
        return str(getattr(precision, "name", precision))
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(str(backend.dtype).removeprefix("torch."),
                                                                          str(backend.dtype))


def _eos_verdict(results: list[FixtureResult]) -> str:
    """``fail`` when the port stopped at the cap where the reference reached eos."""
    capped = [f.name for f in results
              if f.teacher_forced["free_run_expected_eos"] and not f.teacher_forced["free_run_eos"]]
    return "fail" if capped else "pass"


def _tensor_verdict(results: list[FixtureResult], precision: str) -> str:
    if precision != "fp32":
        return f"reported ({precision}: exact agreement is not expected)"
    exact = all(t["semantic_draws"][0] == t["semantic_draws"][1] and t["codebook_draws"][0] == t["codebook_draws"][1]
                and t["free_run_identical"] is not False for t in (f.teacher_forced for f in results))
    return "pass" if exact else "fail"


def run_gate(model: str | Path, out_dir: str | Path, *, against: str | Path = "fp32", backend: str = "torch",
             device: str = "cpu", dtype: str = "fp32", assets: str | Path | None = None,
             fixtures: str | Path | None = None, names: Sequence[str] | None = None, reference_device: str = "cpu",
             max_frames: int | None = None, recognizers: Sequence[Recognizer] | None = None,
             speaker_encoder: SpeakerEncoder | None = None, asr_margin: float = ASR_MARGIN,
             speaker_margin: float = SPEAKER_MARGIN, log: Callable[[str], None] | None = None) -> GateReport:
    """Run the ladder (module docstring) and write ``report.json``, ``report.md``, ``summary.png``,
    ``pictures/NAME.png``, ``audio/NAME.{reference,port}.wav`` and generated clips under ``out_dir``.

    ``against``: ``"fp32"`` (the checkpoint in fp32 torch on ``reference_device``, over ``fixtures``, optionally
    only ``names``) or the path of an oracle ``fixture.npz`` recorded for this checkpoint. The port is
    ``backend`` (torch on ``device`` in ``dtype``, or coreai with ``assets``). ``max_frames`` caps every
    free run (default: the checkpoint's max_new_tokens). ``recognizers`` / ``speaker_encoder`` replace the
    defaults (pocketsphinx, resemblyzer). ``log`` receives a line per step (progress).
    Raises GateError, ParityError, CheckpointError, BackendError and the TTS errors for bad input.
    """
    from .backends.torch import BackendError

    t0 = time.perf_counter()
    say = log or (lambda line: None)
    _matplotlib()  # a missing extra fails here, not after minutes of generation
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise GateError(f"{out} is a file: give a folder for the report")
    if not (0 <= asr_margin <= 1 and 0 <= speaker_margin <= 2):
        raise GateError(f"margins out of range: asr {asr_margin} (0..1), speaker {speaker_margin} (0..2)")
    if (backend == "coreai") != (assets is not None):
        raise BackendError("the coreai backend runs converted assets: give --assets DIR with --backend coreai")
    if str(against) != "fp32" and not Path(against).expanduser().is_file():
        raise GateError(f"--against must be fp32 or an oracle fixture.npz; {against} is neither")
    if str(against) != "fp32" and (fixtures is not None or names):
        raise GateError("fixtures apply to --against fp32; an oracle fixture.npz brings its own scenarios")
    for sub in ("pictures", "audio"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    if str(against) == "fp32":
        report = _against_fp32(model, out, backend, device, dtype, assets, fixtures, names, reference_device,
                               max_frames, recognizers, speaker_encoder, asr_margin, speaker_margin, say)
    else:
        report = _against_oracle(model, out, Path(against).expanduser(), backend, device, dtype, assets, say)
    report.margins = {"asr": asr_margin, "speaker": speaker_margin}
    report.seconds = time.perf_counter() - t0
    plot_summary(out / "summary.png", report)
    (out / "report.json").write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=_json),
                                     encoding="utf-8")
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    say(f"wrote {out / 'report.md'}: {'PASS' if report.passed else 'FAIL'}")
    return report


def _json(value):
    """numpy scalars in the report -> Python numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def _port_backend(checkpoint, backend: str, device: str, dtype: str, assets):
    if backend == "coreai":
        from .backends.coreai import CoreAIBackend

        return CoreAIBackend(checkpoint, assets)
    return TorchBackend(checkpoint, device, dtype)


def _against_oracle(model, out: Path, fixture: Path, backend: str, device: str, dtype: str, assets,
                    say) -> GateReport:
    """The oracle rungs: parity's whole replay, margins for its misses, the codec stage and pictures."""
    from .checkpoint import load_checkpoint

    ckpt = load_checkpoint(model)
    port = _port_backend(ckpt, backend, device, dtype, assets)
    fx, meta = load_fixture(fixture)
    say(f"replaying {fixture} through {port.description}")
    parity: ParityReport = run_parity(port, fixture)
    rate = ckpt.codec_config.sample_rate
    hop = ckpt.codec_config.frame_length
    report = GateReport(str(model), port.description, f"oracle {fixture}", _precision(port),
                        parity=json.loads(parity.to_json()), skipped=list(parity.skipped))
    why = "an oracle fixture records no text (its random weights make no speech)"
    report.skipped += [f"ASR round trip: {why}", f"speaker similarity: {why}"]
    for rep in parity.scenarios:
        sc = rep.key  # "batch" for the batch items a Core AI port replays one by one ("batch[1]")
        params = _params(meta, sc, port)
        result = FixtureResult(rep.name, None, None, None, sc == "clone", _teacher_forced(rep, fx, params, port.cfg))
        if fx[f"{sc}__prompt_input_ids"].shape[0] == 1:  # batch scenarios: parity's codec rung covers them
            n = int(fx[f"{sc}__code_lengths"][0])
            reference = fx[f"{sc}__decode_waveform"][0, :n * hop]
            decoded = port.decode_window(fx[f"{sc}__codes"][0, :, :n]) if n else np.zeros(0, np.float32)
            result.codec = _codec_stage(reference, decoded, rate)
            result.picture = f"pictures/{rep.name}.png"
            plot_fixture(out / result.picture, f"{rep.name}: the port decodes the oracle's codes",
                         [("oracle", reference), ("port", decoded)], rate)
        report.fixtures.append(result)
        say(f"{rep.name}: semantic {rep.semantic_draws[0]}/{rep.semantic_draws[1]}, codebook "
            f"{rep.codebook_draws[0]}/{rep.codebook_draws[1]}, free run identical {rep.free_run_identical}")
    # Past the recording the replayed uniforms are neutral (0.5), so once a reduced-precision free run flips,
    # its length says nothing about the port: eos is judged only where the run must be identical.
    eos = _eos_verdict(report.fixtures) if report.precision == "fp32" else "reported (the recorded uniforms end)"
    report.verdicts = {"tensor": _tensor_verdict(report.fixtures, report.precision), "eos": eos, "asr": {},
                       "speaker": "skipped"}
    if report.precision == "fp32" and not parity.passed:
        report.verdicts["tensor"] = "fail"
    return report


def _against_fp32(model, out: Path, backend: str, device: str, dtype: str, assets, fixtures, names,
                  reference_device: str, max_frames, recognizers, speaker_encoder, asr_margin, speaker_margin,
                  say) -> GateReport:
    """The fp32 rungs over a fixtures file: record the fp32 torch run, replay it through the port, free-run
    the port, then the codec, ASR and speaker rungs and pictures."""
    from .tts import TTS

    chosen = load_fixtures(fixtures)
    if names:
        unknown = sorted(set(names) - {f.name for f in chosen})
        if unknown:
            raise GateError(f"no fixture named {', '.join(unknown)}; the file has {', '.join(f.name for f in chosen)}")
        chosen = [f for f in chosen if f.name in set(names)]
    port = TTS.load(model, device=device, dtype=dtype, backend=backend, assets=assets)
    ref = TTS(port.checkpoint, TorchBackend(port.checkpoint, reference_device, "fp32"), port.prompts)
    if recognizers is None:
        recognizers, why = default_recognizers()
        if why:
            say(f"ASR round trip skipped: {why}")
    if speaker_encoder is None and any(f.clone for f in chosen):
        speaker_encoder, spk_why = default_speaker_encoder()
    else:
        spk_why = None if speaker_encoder is not None else "no clone fixtures"
    # Core AI graphs bake their sampling in; the reference must draw with the same settings.
    params = getattr(port.backend, "sampling", None) or port.sampling()
    cfg, rate = port.config, port.sample_rate
    report = GateReport(str(model), port.backend.description, f"fp32 ({ref.backend.description})",
                        _precision(port.backend))
    by_language: dict[str, list[FixtureResult]] = {}
    for fixture in chosen:
        result = _fp32_fixture(fixture, port, ref, params, cfg, rate, out, max_frames, recognizers,
                               speaker_encoder, spk_why, say)
        report.fixtures.append(result)
        by_language.setdefault(fixture.language, []).append(result)
    report.asr = _asr_summary(by_language, recognizers)
    report.speaker = _speaker_summary(report.fixtures, speaker_encoder, spk_why)
    asr_verdicts = {}
    for lang, a in report.asr.items():
        if "skipped" in a:
            asr_verdicts[lang] = "skipped"
        else:
            ok = (a["port"]["rate"] or 0.0) <= (a["reference"]["rate"] or 0.0) + asr_margin
            asr_verdicts[lang] = "pass" if ok else "fail"
    speaker = "skipped" if not report.speaker or "skipped" in report.speaker else (  # empty: no clone fixtures
        "pass" if report.speaker["port_mean"] >= report.speaker["reference_mean"] - speaker_margin else "fail")
    report.verdicts = {"tensor": _tensor_verdict(report.fixtures, report.precision),
                       "eos": _eos_verdict(report.fixtures), "asr": asr_verdicts, "speaker": speaker}
    return report


def _fp32_fixture(fixture: Fixture, port, ref, params: SamplingParams, cfg, rate: int, out: Path, max_frames,
                  recognizers, speaker_encoder, spk_why, say) -> FixtureResult:
    """Every rung of one fixture against the fp32 reference."""
    voice, clip = None, None
    if fixture.clone:
        path = fixture.ref_audio or espeak_clip(
            fixture.ref_text, fixture.espeak_voice or ESPEAK_VOICES.get(fixture.language, fixture.language),
            out / "clips" / f"{fixture.name}.wav")
        clip, _ = read_reference(path)  # 44.1 kHz mono, as the codec encoder sees it
        voice = ref.voice_from_clip(path, fixture.ref_text, fixture.name)
        prompt = port.prompts.clone(fixture.text, voice.transcript, voice.codes)
    else:
        prompt = port.prompts.plain(fixture.text)
    budget = frame_budget(cfg, prompt.shape[1], max_frames, port.checkpoint.generation.max_new_tokens)
    noise = _RecordingNoise(NoiseSource(fixture.seed, cfg.num_semantic, cfg.codebook_size, cfg.num_codebooks - 1))
    reference = generate(ref.backend, prompt, params, fixture.seed, budget, keep_results=True, noise=noise)
    fx, meta = record_run(fixture.name, prompt, params, reference, noise.frames, cfg.ras_window_size)
    rep = replay_forced(port.backend, fx, meta, fixture.name)
    free = generate(port.backend, prompt, params, fixture.seed, budget)
    compare_free_run(rep, fx, fixture.name, free.codes, free.reached_eos)
    result = FixtureResult(fixture.name, fixture.language, fixture.text, fixture.seed, fixture.clone,
                           _teacher_forced(rep, fx, params, cfg))
    del fx  # the recording holds every step's logits and uniforms: free them before the next fixture
    reference.frame_results.clear()
    ref_audio = ref.backend.decode_window(reference.codes) if reference.frames else np.zeros(0, np.float32)
    port_audio = port.backend.decode_window(free.codes) if free.frames else np.zeros(0, np.float32)
    if reference.frames:
        result.codec = _codec_stage(ref_audio, port.backend.decode_window(reference.codes), rate)
    if voice is not None:
        codes = port.backend.encode(clip)
        equal = int((codes == voice.codes).sum()) if codes.shape == voice.codes.shape else 0
        result.encoder = {"codes_equal": [equal, int(voice.codes.size)]}
    for label, audio in (("reference", ref_audio), ("port", port_audio)):
        result.audio[label] = f"audio/{fixture.name}.{label}.wav"
        write_audio(out / result.audio[label], audio, rate)
    result.asr = _asr_fixture(fixture, ref_audio, port_audio, rate, recognizers)
    if fixture.clone:
        result.speaker = _speaker_fixture(clip, REFERENCE_RATE, ref_audio, port_audio, rate, speaker_encoder, spk_why)
    result.picture = f"pictures/{fixture.name}.png"
    plot_fixture(out / result.picture, f"{fixture.name} ({fixture.language}, seed {fixture.seed})",
                 [("reference", ref_audio), ("port", port_audio)], rate)
    tf = result.teacher_forced
    say(f"{fixture.name}: semantic {tf['semantic_draws'][0]}/{tf['semantic_draws'][1]}, codebook "
        f"{tf['codebook_draws'][0]}/{tf['codebook_draws'][1]}, frames {free.frames}/{reference.frames}, "
        f"identical prefix {tf['free_run_prefix']}")
    return result


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


def _asr_summary(by_language: dict[str, list[FixtureResult]], recognizers) -> dict:
    """Corpus error rates per language (edits / reference units over its fixtures), reference and port."""
    out = {}
    for lang, results in by_language.items():
        scored = [r.asr for r in results if r.asr and "port" in r.asr]
        if not scored:
            have = ", ".join(sorted({x for r in recognizers or () for x in r.languages or ()})) or "none"
            out[lang] = {"fixtures": len(results),
                         "skipped": f"no recogniser for {lang!r} (recognisers here cover: {have})"}
            continue
        entry = {"fixtures": len(scored), "metric": scored[0]["metric"], "recognizer": scored[0]["recognizer"]}
        for label in ("reference", "port"):
            total = ErrorCount()
            for a in scored:
                total = total + ErrorCount(a[label]["edits"], a[label]["units"])
            entry[label] = {"edits": total.edits, "units": total.units, "rate": total.rate}
        out[lang] = entry
    return out


def _speaker_fixture(clip, clip_rate: int, ref_audio, port_audio, rate: int, encoder, why) -> dict:
    """Cosine of the clip's embedding with each run's speech, or why there is none."""
    if encoder is None:
        return {"skipped": why}
    try:
        target = encoder.embed(clip, clip_rate)
        return {"encoder": encoder.name,
                **{label: float(target @ encoder.embed(audio, rate))
                   for label, audio in (("reference", ref_audio), ("port", port_audio))}}
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
    return {"encoder": scored[0]["encoder"], "fixtures": len(scored), "reference_mean": float(np.mean(ref)),
            "reference_min": float(np.min(ref)), "port_mean": float(np.mean(port)), "port_min": float(np.min(port))}
