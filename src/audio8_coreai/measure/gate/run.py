"""The gate's ladder, run: against fp32 (record the reference, replay it through the port, free-run the port,
then the codec, ASR and speaker rungs) or against an oracle fixture (parity's replay); writes the report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ...audio import REFERENCE_RATE, read_reference, write_audio
from ...audio.files import staged_folder
from ...backends.choice import open_backend
from ...config import SamplingParams
from ...engine.loop import frame_budget, generate
from ...engine.noise import noise_source
from ...errors import BackendError
from ...settings import DEFAULTS
from ..oracle import _params, load_fixture
from ..parity import ParityReport, compare_free_run, replay_forced, run_parity
from ..replay import record
from .asr import Recognizer, _asr_fixture, _asr_summary, default_recognizers
from .errors import GateError
from .fixtures import ESPEAK_VOICES, Fixture, espeak_clip, load_fixtures
from .pictures import _matplotlib, plot_fixture, plot_summary
from .report import FixtureResult, GateReport, _json, render_markdown
from .speaker import SpeakerEncoder, _speaker_fixture, _speaker_summary, default_speaker_encoder
from .tensors import _codec_stage, _teacher_forced, record_run


def _eos_verdict(results: list[FixtureResult]) -> str:
    """``fail`` when the port stopped at the cap where the reference reached eos."""
    capped = [
        f.name for f in results if f.teacher_forced["free_run_expected_eos"] and not f.teacher_forced["free_run_eos"]
    ]
    return "fail" if capped else "pass"


def _tensor_verdict(results: list[FixtureResult], precision: str) -> str:
    if precision != "fp32":
        return f"reported ({precision}: exact agreement is not expected)"
    exact = all(
        t["semantic_draws"][0] == t["semantic_draws"][1]
        and t["codebook_draws"][0] == t["codebook_draws"][1]
        and t["free_run_identical"] is not False
        for t in (f.teacher_forced for f in results)
    )
    return "pass" if exact else "fail"


def run_gate(
    model: str | Path,
    out_dir: str | Path,
    *,
    against: str | Path = "fp32",
    backend: str = "torch",
    device: str = "cpu",
    precision: str | None = None,
    assets: str | Path | None = None,
    fixtures: str | Path | None = None,
    names: Sequence[str] | None = None,
    reference_device: str = "cpu",
    max_frames: int | None = None,
    recognizers: Sequence[Recognizer] | None = None,
    speaker_encoder: SpeakerEncoder | None = None,
    asr_margin: float = DEFAULTS.measure.asr_margin,
    speaker_margin: float = DEFAULTS.measure.speaker_margin,
    log: Callable[[str], None] | None = None,
) -> GateReport:
    """Run the ladder (package docstring) and write ``report.json``, ``report.md``, ``summary.png``,
    ``pictures/NAME.png``, ``audio/NAME.{reference,port}.wav`` and generated clips under ``out_dir``.

    ``against``: ``"fp32"`` (the checkpoint in fp32 torch on ``reference_device``, over ``fixtures``, optionally
    only ``names``) or the path of an oracle ``fixture.npz`` recorded for this checkpoint. The port is
    ``backend`` (torch on ``device`` in ``precision``, None: fp32; or coreai with ``assets``, None: theirs; one
    given must be theirs). ``max_frames`` caps every
    free run (default: the checkpoint's max_new_tokens). ``recognizers`` / ``speaker_encoder`` replace the
    defaults (pocketsphinx, resemblyzer). ``log`` receives a line per step (progress).
    Raises GateError, ParityError, CheckpointError, BackendError and the TTS errors for bad input.
    """

    t0 = time.perf_counter()
    say = log or (lambda line: None)
    if precision is None and backend == "torch":
        precision = "fp32"
    _matplotlib()  # a missing extra fails here, not after minutes of generation
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise GateError(f"{out} is a file: give a folder for the report")
    if not out.parent.is_dir():
        raise GateError(f"{out}: the folder {out.parent} does not exist: make it first, or write elsewhere")
    if out.is_dir() and any(out.iterdir()) and not (out / "report.json").is_file():  # a report's is replaced whole
        raise GateError(f"{out} holds files that are no gate report: give a new or empty folder, or a report's")
    if not (0 <= asr_margin <= 1 and 0 <= speaker_margin <= 2):
        raise GateError(f"margins out of range: asr {asr_margin} (0..1), speaker {speaker_margin} (0..2)")
    if (backend == "coreai") != (assets is not None):
        raise BackendError("the coreai backend runs converted assets: give --assets DIR with --backend coreai")
    if str(against) != "fp32" and not Path(against).expanduser().is_file():
        said = "is a folder" if Path(against).expanduser().is_dir() else "does not exist"
        raise GateError(f"--against must be fp32 or an oracle fixture.npz; {against} {said}")
    if str(against) != "fp32" and (fixtures is not None or names):
        raise GateError("fixtures apply to --against fp32; an oracle fixture.npz brings its own scenarios")
    if str(against) != "fp32" and recognizers:
        raise GateError("a recognizer (--recognizer) serves the ASR rung of --against fp32; an oracle replay has none")
    with staged_folder(out, replace=True) as staged:  # an interrupted run leaves the last report whole
        for sub in ("pictures", "audio"):
            (staged / sub).mkdir()
        if str(against) == "fp32":
            report = _against_fp32(
                model,
                staged,
                backend,
                device,
                precision,
                assets,
                fixtures,
                names,
                reference_device,
                max_frames,
                recognizers,
                speaker_encoder,
                asr_margin,
                speaker_margin,
                say,
            )
        else:
            fixture = Path(against).expanduser()
            report = _against_oracle(model, staged, fixture, backend, device, precision, assets, say)
        report.margins = {"asr": asr_margin, "speaker": speaker_margin}
        report.seconds = time.perf_counter() - t0
        plot_summary(staged / "summary.png", report)
        (staged / "report.json").write_text(
            json.dumps(report.to_dict(), indent=2, ensure_ascii=False, default=_json), encoding="utf-8"
        )
        (staged / "report.md").write_text(render_markdown(report), encoding="utf-8")
    say(f"wrote {out}: report.md, report.json, summary.png")  # the verdict is the caller's to say (report.passed)
    return report


def _against_oracle(
    model, out: Path, fixture: Path, backend: str, device: str, precision: str | None, assets, say
) -> GateReport:
    """The oracle rungs: parity's whole replay, margins for its misses, the codec stage and pictures."""
    from ...checkpoint import load_checkpoint

    ckpt = load_checkpoint(model)
    port = open_backend(ckpt, backend, device=device, precision=precision, assets=assets)
    fx, meta = load_fixture(fixture)
    say(f"replaying {fixture} through {port.description}")
    parity: ParityReport = run_parity(port, fixture)
    rate = ckpt.codec_config.sample_rate
    hop = ckpt.codec_config.frame_length
    report = GateReport(
        str(model),
        port.description,
        f"oracle {fixture}",
        port.precision,
        parity=json.loads(parity.to_json()),
        skipped=list(parity.skipped),
    )
    why = "an oracle fixture records no text (its random weights make no speech)"
    report.skipped += [f"ASR round trip: {why}", f"speaker similarity: {why}"]
    for rep in parity.scenarios:
        sc = rep.key  # "batch" for the batch items a Core AI port replays one by one ("batch[1]")
        params = _params(meta, sc, port)
        result = FixtureResult(rep.name, None, None, None, sc == "clone", _teacher_forced(rep, fx, params, port.cfg))
        if fx[f"{sc}__prompt_input_ids"].shape[0] == 1:  # batch scenarios: parity's codec rung covers them
            n = int(fx[f"{sc}__code_lengths"][0])
            reference = fx[f"{sc}__decode_waveform"][0, : n * hop]
            decoded = port.decode_window(fx[f"{sc}__codes"][0, :, :n]) if n else np.zeros(0, np.float32)
            result.codec = _codec_stage(reference, decoded, rate)
            result.picture = f"pictures/{rep.name}.png"
            plot_fixture(
                out / result.picture,
                f"{rep.name}: the port decodes the oracle's codes",
                [("oracle", reference), ("port", decoded)],
                rate,
            )
        report.fixtures.append(result)
        free = {True: "identical", False: "differs", None: "none recorded"}[rep.free_run_identical]
        say(
            f"{rep.name}: semantic {rep.semantic_draws[0]}/{rep.semantic_draws[1]}, codebook "
            f"{rep.codebook_draws[0]}/{rep.codebook_draws[1]}, free run {free}"
        )
    # Past the recording the replayed uniforms are neutral (0.5), so once a reduced-precision free run flips,
    # its length says nothing about the port: eos is judged only where the run must be identical.
    eos = _eos_verdict(report.fixtures) if report.precision == "fp32" else "reported (the recorded uniforms end)"
    report.verdicts = {
        "tensor": _tensor_verdict(report.fixtures, report.precision),
        "eos": eos,
        "asr": {},
        "speaker": "skipped",
    }
    if report.precision == "fp32" and not parity.passed:
        report.verdicts["tensor"] = "fail"
    return report


def _against_fp32(
    model,
    out: Path,
    backend: str,
    device: str,
    precision: str | None,
    assets,
    fixtures,
    names,
    reference_device: str,
    max_frames,
    recognizers,
    speaker_encoder,
    asr_margin,
    speaker_margin,
    say,
) -> GateReport:
    """The fp32 rungs over a fixtures file: record the fp32 torch run, replay it through the port, free-run
    the port, then the codec, ASR and speaker rungs and pictures."""
    from ...tts import TTS

    chosen = load_fixtures(fixtures)
    if names:
        unknown = sorted(set(names) - {f.name for f in chosen})
        if unknown:
            raise GateError(f"no fixture named {', '.join(unknown)}; the file has {', '.join(f.name for f in chosen)}")
        chosen = [f for f in chosen if f.name in set(names)]
    port = TTS.load(model, device=device, precision=precision, backend=backend, assets=assets)
    ref = TTS(port.checkpoint, open_backend(port.checkpoint, device=reference_device, precision="fp32"), port.prompts)
    asr_why = None
    if recognizers is None:
        recognizers, asr_why = default_recognizers()
        if asr_why:
            say(f"ASR round trip skipped: {asr_why}")
    if speaker_encoder is None and any(f.clone for f in chosen):
        speaker_encoder, spk_why = default_speaker_encoder()
        if spk_why:
            say(f"speaker similarity skipped: {spk_why}")
    else:
        spk_why = None if speaker_encoder is not None else "no clone fixtures"
    # Core AI graphs bake their sampling in; the reference must draw with the same settings.
    params = port.backend.sampling or port.sampling()
    cfg, rate = port.config, port.sample_rate
    report = GateReport(
        str(model), port.backend.description, f"fp32 ({ref.backend.description})", port.backend.precision
    )
    by_language: dict[str, list[FixtureResult]] = {}
    for fixture in chosen:
        result = _fp32_fixture(
            fixture, port, ref, params, cfg, rate, out, max_frames, recognizers, speaker_encoder, spk_why, say
        )
        report.fixtures.append(result)
        by_language.setdefault(fixture.language, []).append(result)
    report.asr = _asr_summary(by_language, recognizers, asr_why)
    report.speaker = _speaker_summary(report.fixtures, speaker_encoder, spk_why)
    asr_verdicts = {}
    for lang, a in report.asr.items():
        if "skipped" in a:
            asr_verdicts[lang] = "skipped"
        else:
            ok = (a["port"]["rate"] or 0.0) <= (a["reference"]["rate"] or 0.0) + asr_margin
            asr_verdicts[lang] = "pass" if ok else "fail"
    speaker = (
        "skipped"
        if not report.speaker or "skipped" in report.speaker
        # empty: no clone fixtures
        else ("pass" if report.speaker["port_mean"] >= report.speaker["reference_mean"] - speaker_margin else "fail")
    )
    report.verdicts = {
        "tensor": _tensor_verdict(report.fixtures, report.precision),
        "eos": _eos_verdict(report.fixtures),
        "asr": asr_verdicts,
        "speaker": speaker,
    }
    return report


def _fp32_fixture(
    fixture: Fixture,
    port,
    ref,
    params: SamplingParams,
    cfg,
    rate: int,
    out: Path,
    max_frames,
    recognizers,
    speaker_encoder,
    spk_why,
    say,
) -> FixtureResult:
    """Every rung of one fixture against the fp32 reference."""
    voice, clip = None, None
    if fixture.clone:
        path = fixture.ref_audio or espeak_clip(
            fixture.ref_text,
            fixture.espeak_voice or ESPEAK_VOICES.get(fixture.language, fixture.language),
            out / "clips" / f"{fixture.name}.wav",
        )
        clip, _ = read_reference(path)  # 44.1 kHz mono, as the codec encoder sees it
        voice = ref.voice_from_clip(path, fixture.ref_text, fixture.name)
        prompt = port.prompts.clone(fixture.text, voice.transcript, voice.codes)
    else:
        prompt = port.prompts.plain(fixture.text)
    budget = frame_budget(cfg, prompt.shape[1], max_frames, port.checkpoint.generation.max_new_tokens)
    rec, reference = record(ref.backend, prompt, params, noise_source(cfg, fixture.seed), budget)
    fx, meta = record_run(fixture.name, rec, params, reference)
    rep = replay_forced(port.backend, fx, meta, fixture.name)
    free = generate(port.backend, prompt, params, fixture.seed, budget)
    compare_free_run(rep, fx, fixture.name, free.codes, free.reached_eos)
    result = FixtureResult(
        fixture.name, fixture.language, fixture.text, fixture.seed, fixture.clone, _teacher_forced(rep, fx, params, cfg)
    )
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
    plot_fixture(
        out / result.picture,
        f"{fixture.name} ({fixture.language}, seed {fixture.seed})",
        [("reference", ref_audio), ("port", port_audio)],
        rate,
    )
    tf = result.teacher_forced
    say(
        f"{fixture.name}: semantic {tf['semantic_draws'][0]}/{tf['semantic_draws'][1]}, codebook "
        f"{tf['codebook_draws'][0]}/{tf['codebook_draws'][1]}, frames {free.frames}/{reference.frames}, "
        f"identical prefix {tf['free_run_prefix']}"
    )
    return result
