"""The quality gate: is the port's speech the reference's speech? (DESIGN.md measure/; PORT-NOTES.md section 4)

Under sampling one flipped draw changes every later frame, so end-to-end identity is no bar for reduced
precisions; the gate measures the port the way its users hear it, beside a reference run, with a ladder:

1. **Teacher-forced agreement.** The port is fed the reference's columns and uniforms step by step
   (:func:`..parity.replay_forced`): semantic and codebook draw agreement, slow argmax agreement, logits cosine
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
- an oracle ``fixture.npz`` (recorded from the publisher's code, see ``tests/oracle/README.md``): the whole
  :func:`..parity.run_parity` replay, with the recorded uniforms. Oracle checkpoints have random weights and the
  recording holds no text, so stages 4 and 5 are skipped.

Verdicts: ``eos`` (the port reaches eos wherever the reference did), ``asr`` and ``speaker`` as above, and
``tensor`` (all draws equal and free runs identical) only for an fp32 port, where exactness is expected;
reduced precisions report the tensor stages without a verdict (as the earlier port's engine gate did).
Random-weight checkpoints make no speech: on them only the tensor stages mean anything.

Reference clips: a clone fixture gives a clip file and its transcript, or only the transcript, and the gate
speaks it with espeak-ng (``espeak_voice``, default per language) into ``OUT/clips/NAME.wav``.

One job a module: :mod:`.fixtures` (the utterances), :mod:`.tensors` (rungs 1 to 3), :mod:`.mel` (the log-mel),
:mod:`.asr` (rung 4), :mod:`.speaker` (rung 5), :mod:`.report` (JSON and markdown), :mod:`.pictures` (rung 6) and
:mod:`.run` (:func:`run_gate`: the ladder). This package's face re-exports their public names.
"""

from .asr import (
    CallableRecognizer,
    ErrorCount,
    PocketSphinxRecognizer,
    Recognizer,
    count_errors,
    covers,
    default_recognizers,
    load_recognizer,
    metric_for,
    normalise_text,
)
from .errors import GateError
from .fixtures import DEFAULT_FIXTURES, ESPEAK_VOICES, Fixture, espeak_clip, load_fixtures
from .mel import log_mel, log_mel_cos, mel_filterbank
from .pictures import plot_fixture, plot_summary
from .report import FixtureResult, GateReport, render_markdown
from .run import run_gate
from .speaker import ResemblyzerEncoder, SpeakerEncoder, default_speaker_encoder
from .tensors import LOW_MARGIN, gumbel_margin, miss_margins, record_run

__all__ = [
    "DEFAULT_FIXTURES",
    "ESPEAK_VOICES",
    "LOW_MARGIN",
    "CallableRecognizer",
    "ErrorCount",
    "Fixture",
    "FixtureResult",
    "GateError",
    "GateReport",
    "PocketSphinxRecognizer",
    "Recognizer",
    "ResemblyzerEncoder",
    "SpeakerEncoder",
    "count_errors",
    "covers",
    "default_recognizers",
    "default_speaker_encoder",
    "espeak_clip",
    "gumbel_margin",
    "load_fixtures",
    "load_recognizer",
    "log_mel",
    "log_mel_cos",
    "mel_filterbank",
    "metric_for",
    "miss_margins",
    "normalise_text",
    "plot_fixture",
    "plot_summary",
    "record_run",
    "render_markdown",
    "run_gate",
]
