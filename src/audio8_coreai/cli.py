"""The ``audio8`` command: say | serve | voice (add, list, show, rm) | prompt | parity | gate | convert | bench |
make-checkpoint.

Every expected failure (bad text, a wrong checkpoint folder, an unwritable output, an unknown device)
prints one line saying what to do and exits with status 2; no tracebacks.
"""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .audio import AudioError
from .backends.base import BackendError, EngineError
from .backends.coreai import DECODER_FRAMES, ENCODER_FRAMES, PARTS
from .checkpoint import DEFAULT_MODEL, CheckpointError
from .config import ConfigError
from .measure.gate import GateError
from .measure.oracle import ParityError
from .settings import DEFAULTS
from .text import PromptError, TokenizerError
from .voices import VoiceError

USER_ERRORS = (AudioError, BackendError, CheckpointError, ConfigError, EngineError, GateError, ParityError,
               PromptError, TokenizerError, VoiceError)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Audio8-TTS-Preview-0.6b: speak text from the publisher's checkpoint.")
err = Console(stderr=True)
out = Console()


def friendly(fn):
    """Turn the project's user-facing errors into one 'error: ...' line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            # One line (greppable, paths never cut); the message escaped: "[1, 11, 32]" is text, not markup.
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err.print("interrupted")
            raise typer.Exit(130) from None

    return wrapper


class Size(str, Enum):
    tiny = "tiny"
    b06 = "0.6b"


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Checkpoint folder (publisher layout) or hub id.")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[Optional[str], typer.Option(
    "--dtype", "--precision", help="Torch precision: fp32 (exact), bf16, int16 (16-bit fixed point, near-exact), "
    "int12, int8 or mixed (int8 slow AR: these miss draws); default int16 on CPU, fp32 on CUDA. The codec stays "
    "fp32 on CPU.")]
CudaGraphsOpt = Annotated[bool, typer.Option(
    "--cuda-graphs", help="With --device cuda: replay each frame as one captured CUDA graph (torch backend).")]
VoicesOpt = Annotated[Optional[Path], typer.Option("--voices", help="Voices folder (default: the per-user one).")]
BackendOpt = Annotated[str, typer.Option(help="torch, or coreai (runs the assets given with --assets).")]
AssetsOpt = Annotated[Optional[Path], typer.Option(help="Core AI asset folder written by `audio8 convert` "
                                                        "(with --backend coreai).")]


@app.command()
@friendly
def say(
    text: Annotated[str, typer.Argument(help="The text to speak.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the audio (.wav, .flac, .ogg), or "
                                                                "- for stdout (16-bit wav, streamed as made).")]
    = Path("speech.wav"),
    model: ModelOpt = DEFAULT_MODEL,
    seed: Annotated[Optional[int], typer.Option(help="Same seed, same audio; default: a fresh one.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (default 0.7).")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Top-k (default 50).")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Top-p (default 0.9).")] = None,
    max_frames: Annotated[Optional[int], typer.Option(
        help="Frame cap (46 ms each; default: the checkpoint's max_new_tokens, 512, or what the context leaves)."
    )] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    cuda_graphs: CudaGraphsOpt = False,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    voice: Annotated[Optional[str], typer.Option(help="Speak in this stored voice (see `audio8 voice`).")] = None,
    voices: VoicesOpt = None,
    ref_audio: Annotated[Optional[Path], typer.Option(help="One-off cloning: a clip of the voice (0.5-30 s), "
                                                           "not stored; needs --ref-text.")] = None,
    ref_text: Annotated[Optional[str], typer.Option(help="The transcript of --ref-audio.")] = None,
    stream: Annotated[bool, typer.Option("--stream", help="Write the audio as it is made, every --chunk-frames "
                                                          "frames; text too long for one utterance is split into "
                                                          "sentences.")] = False,
    chunk_frames: Annotated[int, typer.Option(help="With --stream: frames per chunk (46 ms each).")]
    = DEFAULTS.chunk_frames,
    first_chunk_frames: Annotated[Optional[int], typer.Option(
        help=f"With --stream: frames in the first chunk, so the first audio comes sooner (default "
             f"{DEFAULTS.first_chunk_frames}, at most --chunk-frames).")] = None,
) -> None:
    """Speak TEXT into an audio file (44.1 kHz mono), in the model's own voice or a cloned one."""
    from .audio import check_writable, read_reference, write_audio
    from .request import check_request
    from .tts import TTS
    from .voices import VoiceStore

    # Fail before loading a model; the chunk sizes too: long text is streamed even without --stream.
    req = check_request(text, voice=voice, ref_audio=ref_audio, ref_text=ref_text, seed=seed, temperature=temperature,
                        top_k=top_k, top_p=top_p, max_frames=max_frames, chunk_frames=chunk_frames,
                        first_chunk_frames=first_chunk_frames)
    to_stdout = str(output) == "-"
    if to_stdout and sys.stdout.isatty():
        raise AudioError("-o - writes binary audio to stdout, which is a terminal here: pipe it (| aplay, "
                         "| ffplay -) or give a file name")
    if not to_stdout:
        check_writable(output)
    if ref_audio is not None:
        _warn(read_reference(ref_audio)[1].warnings)
    elif voice is not None:
        VoiceStore(voices).load(req.voice)  # an unknown or damaged voice fails here; the checkpoint check follows
    with err.status("loading the model..."):
        tts = TTS.load(model, device=device, dtype=dtype, voices_dir=voices, backend=backend, assets=assets,
                       cuda_graphs=cuda_graphs)
    progress = Progress(TextColumn("frames"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True)
    spoken_as = f"voice {voice!r}, " if voice else (f"voice of {ref_audio.name}, " if ref_audio else "")
    chosen = req.voice if ref_audio is None else tts.voice_from_clip(ref_audio, req.ref_text)  # encoded once
    if not stream and not to_stdout and not tts.fits_one_utterance(req.text, chosen):
        err.print("note: the text is too long for one utterance; it is split into sentences, as with --stream",
                  highlight=False)
        stream = True
    if stream or to_stdout:
        speech = tts.stream(req.text, chunk_frames=req.chunk_frames, first_chunk_frames=req.first_chunk_frames,
                            seed=req.seed, temperature=req.temperature, top_k=req.top_k, top_p=req.top_p,
                            max_frames=req.max_frames, voice=chosen)
        with progress:
            task = progress.add_task("frames", total=speech.max_frames)
            speech.on_frame = lambda step: progress.update(task, completed=step + 1)
            (_write_stdout if to_stdout else _write_stream)(speech, output)
        (err if to_stdout else out).print(
            f"{output}: {speech.frames} frames in {len(speech.pieces)} piece(s), {speech.duration_s:.2f} s of audio, "
            f"first audio after {speech.first_audio_s or 0:.2f} s ({spoken_as}seed {speech.seed}, "
            f"{tts.backend.description})", highlight=False)
        return
    with progress:
        task = progress.add_task("frames", total=None)
        result = tts.generate(req.text, seed=req.seed, temperature=req.temperature, top_k=req.top_k,
                              top_p=req.top_p, max_frames=req.max_frames, voice=chosen,
                              on_start=lambda n: progress.update(task, total=n),
                              on_frame=lambda step: progress.update(task, completed=step + 1))
    if result.frames == 0:
        raise _no_audio(output)
    write_audio(output, result.audio, result.sample_rate)
    if not result.reached_eos:
        full = result.prompt_length + result.max_frames >= tts.config.max_seq_len
        remedy = ("the context is full: shorten the text, or use --stream, which splits it by its estimated "
                  "speech" if full
                  else "raise --max-frames if the context allows, or shorten the text")
        err.print(f"[yellow]warning:[/] stopped at the frame cap ({result.max_frames} frames) before the model "
                  f"ended the utterance; the audio may be cut ({remedy})")
    out.print(f"{output}: {result.frames} frames, {result.duration_s:.2f} s of audio, RTF {result.rtf:.2f} "
              f"({spoken_as}seed {result.seed}, {tts.backend.description})", highlight=False)


def _no_audio(output: Path) -> EngineError:
    """The error for an utterance the model ended on its first frame: nothing is written to ``output``."""
    return EngineError(f"the model ended the utterance at once (eos on the first frame): nothing written to "
                       f"{output}; try another --seed")


def _write_stdout(speech, output: Path) -> None:
    """Write ``speech`` (a SpeechStream) to stdout as 16-bit wav, each chunk as it comes (the header's sizes say
    'until the end', as a streamed wav does). A reader that closes the pipe early ends the run quietly."""
    from .audio import SpeechEncoder

    encoder, sink = SpeechEncoder("wav", speech.sample_rate), sys.stdout.buffer
    try:
        for chunk in speech:
            sink.write(encoder.write(chunk))
            sink.flush()
        if speech.frames == 0:  # nothing was written, not even the header
            raise _no_audio(output)
        sink.write(encoder.close())
        sink.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush into the closed pipe at exit
        raise typer.Exit(0) from None
    _warn_capped(speech)


def _write_stream(speech, output: Path) -> None:
    """Write the chunks of ``speech`` (a SpeechStream) to ``output`` as they come; warn about capped pieces."""
    from .audio import open_audio_writer, partial_path

    try:
        with open_audio_writer(output, speech.sample_rate) as f:
            for chunk in speech:
                f.write(chunk)
                f.flush()
            if speech.frames == 0:  # raised inside: the writer then leaves an existing file as it was
                raise _no_audio(output)
    except KeyboardInterrupt:
        if partial_path(output).exists():
            err.print(f"{output} is left as it was; the audio made so far is in {partial_path(output)}",
                      highlight=False, soft_wrap=True)
        raise
    _warn_capped(speech)


def _warn_capped(speech) -> None:
    capped = [i + 1 for i, eos in enumerate(speech.reached_eos) if not eos]
    if capped:
        which = "the utterance" if len(speech.pieces) == 1 else f"piece(s) {', '.join(map(str, capped))}"
        err.print(f"[yellow]warning:[/] {which} stopped at the frame cap before the model ended it; the audio may "
                  "be cut (raise --max-frames)", highlight=False)


def _check_port(host: str, port: int) -> None:
    """Raise ConfigError unless ``host:port`` can be listened on now."""
    import errno
    import socket

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port must be 1 to 65535, got {port}")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind((host, port))
    except OSError as e:
        in_use = e.errno in (errno.EADDRINUSE, errno.EACCES)  # taken, or a port below 1024 without root
        remedy = ("pick another --port, or stop what uses it" if in_use else
                  "give --host an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for all)")
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}): {remedy}") from None


def _warn(warnings) -> None:
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)


@app.command()
@friendly
def prompt(
    text: Annotated[str, typer.Argument(help="The text to speak.")],
    model: ModelOpt = DEFAULT_MODEL,
    ref_text: Annotated[Optional[str], typer.Option(help="Transcript of the reference clip (voice clone).")] = None,
    ref_codes: Annotated[Optional[Path], typer.Option(help=".npy of reference codes int [10, T].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the [11, P] prompt as JSON.")] = False,
) -> None:
    """Print the [11, P] prompt the model sees (needs only config.json and the tokenizer files)."""
    from .checkpoint import load_checkpoint
    from .text import PromptBuilder, check_text, load_tokenizer

    ckpt = load_checkpoint(model, weights=False, codec=False)
    if ckpt.tokenizer_dir is None:
        raise CheckpointError(f"{ckpt.path} has no tokenizer.json; the prompt needs the checkpoint's tokenizer files")
    builder = PromptBuilder(load_tokenizer(ckpt.tokenizer_dir), ckpt.config)
    if (ref_text is None) != (ref_codes is None):
        raise PromptError("voice-clone prompts need both --ref-text and --ref-codes")
    if ref_codes is not None:
        try:
            codes = np.load(ref_codes, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise PromptError(f"cannot read reference codes {ref_codes}: {e} (expected a .npy int array [10, T])") from e
        ids = builder.clone(check_text(text), ref_text, codes)
    else:
        ids = builder.plain(check_text(text))
    if as_json:
        out.print_json(json.dumps({"shape": list(ids.shape), "prompt": ids.tolist()}))
    else:
        out.print(f"prompt [{ids.shape[0]}, {ids.shape[1]}]; row 0:", highlight=False)
        out.print(" ".join(str(int(i)) for i in ids[0]), highlight=False)


@app.command()
@friendly
def parity(
    fixture: Annotated[Path, typer.Option(help="An oracle fixture.npz recorded from the publisher's code.")],
    model: ModelOpt = DEFAULT_MODEL,
    device: DeviceOpt = "cpu",
    dtype: Annotated[str, typer.Option("--dtype", "--precision", help="Torch precision to replay: fp32 (the parity "
                                       "criterion), or bf16, int16, int12, int8, mixed (agreement counts).")]
    = "fp32",
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    tolerance: Annotated[float, typer.Option(help="Max |logit/waveform diff| for fp32 parity (> 0).")]
    = DEFAULTS.tolerance,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full report as JSON.")] = False,
) -> None:
    """Replay an oracle fixture; exit 0 only when fp32 parity holds (reports agreement counts for bf16,
    fp16 and mixed). Core AI assets replay what their baked sampling allows and say what they skip."""
    from .backends.torch import TorchBackend
    from .checkpoint import load_checkpoint
    from .measure.oracle import recorded_from_another
    from .measure.parity import run_parity

    if not tolerance > 0 or tolerance == float("inf"):
        raise ConfigError(f"--tolerance must be a number > 0, got {tolerance}")
    ckpt = load_checkpoint(model)
    if backend == "coreai" and assets is not None:
        from .backends.coreai import CoreAIBackend

        engine_backend = CoreAIBackend(ckpt, assets)
        exact = engine_backend.precision == "fp32"
    elif backend == "torch" and assets is None:
        engine_backend = TorchBackend(ckpt, device, dtype)
        exact = engine_backend.precision.name == "fp32"
    else:
        raise BackendError(f"backend {backend!r} with assets {assets}: use --backend torch, or --backend coreai "
                           "--assets DIR")
    report = run_parity(engine_backend, fixture, tolerance)
    if as_json:
        out.print_json(report.to_json())
    else:
        _print_parity(report, exact)
    recorded = None if report.passed else recorded_from_another(fixture, ckpt.model_file)
    if recorded is not None:
        err.print(f"note: {fixture} was recorded from the checkpoint in {recorded}, whose weights differ from "
                  f"{ckpt.model_file}: run with --model {recorded}", highlight=False, soft_wrap=True)
    if exact and not report.passed:
        raise typer.Exit(1)


def _print_parity(report, exact: bool) -> None:
    for s in report.scenarios:
        free = "" if s.free_run_identical is None else (
            f", free run {'identical' if s.free_run_identical else 'DIFFERS'} "
            f"({s.free_run_frames}/{s.free_run_expected_frames} frames, eos {s.free_run_eos})")
        out.print(f"{s.name:8s} steps {s.steps:3d}  max|dlogit| slow {s.slow_logits_max_diff:.2e} fast "
                  f"{s.fast_logits_max_diff:.2e}  argmax {s.slow_argmax[0]}/{s.slow_argmax[1]}  semantic draws "
                  f"{s.semantic_draws[0]}/{s.semantic_draws[1]}  codebook draws {s.codebook_draws[0]}/"
                  f"{s.codebook_draws[1]}{free}", highlight=False)
    for c in report.codec:
        inter = ", ".join(f"{k} {v:.1e}" for k, v in c.intermediates_max_diff.items())
        out.print(f"codec {c.name:16s} max|dwave| {c.waveform_max_diff:.2e} cos {c.waveform_cos:.6f} ({inter})",
                  highlight=False)
    for e in report.encoder:
        latent = "" if e.latent_max_diff is None else f"  max|dlatent| {e.latent_max_diff:.2e}"
        out.print(f"encoder {e.name:14s} codes {e.codes_equal[0]}/{e.codes_equal[1]} equal{latent}", highlight=False)
    for reason in report.skipped:
        out.print(f"skipped {reason}", highlight=False)
    verdict = "PASS" if report.passed else "FAIL"
    if exact:
        out.print(f"fp32 parity (tolerance {report.tolerance:g}): {verdict}  [{report.backend}]", highlight=False)
    else:  # the fp32 criterion does not apply: the counts above are the result
        out.print(f"agreement of a non-fp32 precision (the counts above; fp32 parity, tolerance "
                  f"{report.tolerance:g}, would be {verdict})  [{report.backend}]", highlight=False)


@app.command()
@friendly
def gate(
    out_dir: Annotated[Path, typer.Option("--out", help="Report folder: report.json, report.md, PNG pictures, "
                                                        "the wavs (created; files in it are replaced).")],
    model: ModelOpt = DEFAULT_MODEL,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[str, typer.Option("--dtype", "--precision", help="The port's precision on torch: fp32 or "
                                                                      "bf16.")] = "fp32",
    against: Annotated[str, typer.Option(help="fp32 (the checkpoint in fp32 torch, over --fixtures) or an "
                                              "oracle fixture.npz recorded for this checkpoint.")] = "fp32",
    fixtures: Annotated[Optional[Path], typer.Option(help="Fixtures JSON (default: the shipped set of 16 "
                                                          "across en/ja/zh/de/fr/es/ko with 4 clones).")] = None,
    fixture: Annotated[Optional[list[str]], typer.Option("--fixture", help="Run only this fixture (repeatable)."
                                                         )] = None,
    reference_device: Annotated[str, typer.Option(help="Device of the fp32 reference run.")] = "cpu",
    max_frames: Annotated[Optional[int], typer.Option(help="Frame cap per free run (default: the checkpoint's "
                                                           "max_new_tokens).")] = None,
    asr_margin: Annotated[float, typer.Option(help="Error-rate points (absolute) the port may lose to the "
                                                   "reference per language.")] = DEFAULTS.asr_margin,
    speaker_margin: Annotated[float, typer.Option(help="Mean speaker cosine the port may lose to the "
                                                       "reference.")] = DEFAULTS.speaker_margin,
    recognizer: Annotated[Optional[list[str]], typer.Option(
        metavar="MODULE:CALLABLE",
        help="A stronger recogniser, MODULE:CALLABLE: fn(audio float32 [N], sample_rate Hz, language code) -> "
             "text, for the languages in its optional `languages` attribute (else all); imported from the current "
             "folder or PYTHONPATH; repeatable, the first that covers a language is used, pocketsphinx after.")]
    = None,
) -> None:
    """Judge the port by its speech: teacher-forced agreement, codec, free run, ASR round trip and speaker
    similarity against an fp32 run or an oracle fixture; exit 1 when a verdict fails."""
    from .measure.gate import default_recognizers, load_recognizer, run_gate

    recognizers = None  # the defaults, and why they are missing if they are
    if recognizer:
        recognizers = [load_recognizer(spec) for spec in recognizer] + default_recognizers()[0]
    report = run_gate(model, out_dir, against=against, backend=backend, device=device, dtype=dtype, assets=assets,
                      fixtures=fixtures, names=fixture, reference_device=reference_device, max_frames=max_frames,
                      recognizers=recognizers, asr_margin=asr_margin, speaker_margin=speaker_margin,
                      log=lambda line: err.print(line, highlight=False))
    t = report.totals()
    out.print(f"teacher-forced: semantic {t['semantic_draws'][0]}/{t['semantic_draws'][1]}, codebook "
              f"{t['codebook_draws'][0]}/{t['codebook_draws'][1]}, misses {t['misses']} ({t['misses_low_margin']} "
              f"near-ties); free runs identical {t['free_run_identical'][0]}/{t['free_run_identical'][1]}",
              highlight=False, soft_wrap=True)
    for key, verdict in report.verdicts.items():
        if isinstance(verdict, dict):
            verdict = ", ".join(f"{k} {v}" for k, v in verdict.items()) or "-"
        out.print(f"{key}: {verdict}", highlight=False, soft_wrap=True)
    out.print(f"gate {'PASS' if report.passed else 'FAIL'}: {out_dir / 'report.md'}", highlight=False, soft_wrap=True)
    if not report.passed:
        raise typer.Exit(1)


class Precision(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    mixed = "mixed"


@app.command()
@friendly
def convert(
    model: ModelOpt = DEFAULT_MODEL,
    out_dir: Annotated[Path, typer.Option("--out", help="New folder for the assets (must not exist or be empty).")]
    = Path("assets"),
    precision: Annotated[Precision, typer.Option(help="fp32 (exact), fp16, or mixed (int8 slow-AR weights, "
                                                      "fp16 elsewhere).")] = Precision.fp32,
    context: Annotated[Optional[int], typer.Option(help="KV slots for prompt + frames, a multiple of 32 "
                                                        "(default: the model's max_seq_len).")] = None,
    decoder_frames: Annotated[int, typer.Option(help="Codec decoder bucket, frames per call (2048 samples "
                                                     "each).")] = DEFAULTS.decoder_frames,
    encoder_frames: Annotated[int, typer.Option(help="Codec encoder bucket, frames per call.")]
    = DEFAULTS.encoder_frames,
    part: Annotated[Optional[list[str]], typer.Option(help="Convert only this part (repeatable): dualar, "
                                                           "codec_decoder, codec_encoder.")] = None,
    greedy: Annotated[bool, typer.Option(help="Bake do_sample false into the frame graphs (argmax draws, the "
                                              "publisher's greedy path) instead of the checkpoint's sampling.")]
    = False,
) -> None:
    """Convert a checkpoint into Core AI assets (dualar, codec decoder, codec encoder .aimodel folders)."""
    import dataclasses
    import time

    from .backends.coreai import convert as convert_assets
    from .checkpoint import load_checkpoint
    from .config import SamplingParams

    t0 = time.perf_counter()
    ckpt = load_checkpoint(model)
    sampling = SamplingParams.from_configs(ckpt.config, ckpt.generation)
    path = convert_assets(ckpt, out_dir, precision.value, context,
                          sampling=dataclasses.replace(sampling, do_sample=False) if greedy else sampling,
                          decoder_frames=decoder_frames, encoder_frames=encoder_frames, parts=part or PARTS)
    sizes = ", ".join(f"{p.name} {sum(f.stat().st_size for f in p.rglob('*') if f.is_file()) / 1e6:.1f} MB"
                      for p in sorted(path.glob("*.aimodel")))
    out.print(f"wrote {path} in {time.perf_counter() - t0:.0f} s: {sizes}", highlight=False)


@app.command("make-checkpoint")
@friendly
def make_checkpoint_cmd(
    directory: Annotated[Path, typer.Argument(help="New folder to write (must not exist or be empty).")],
    size: Annotated[Size, typer.Option(help="tiny (tests) or 0.6b (benchmarks, about 2.8 GB).")] = Size.tiny,
    seed: Annotated[int, typer.Option(help="Same seed, byte-identical files.")] = DEFAULTS.checkpoint_seed,
) -> None:
    """Write a checkpoint with random weights in the publisher's exact layout."""
    from .checkpoint import make_checkpoint

    with err.status(f"writing a {size.value} checkpoint..."):
        path = make_checkpoint(directory, size.value, seed)
    out.print(f"wrote {path}", highlight=False)


@app.command()
@friendly
def bench(
    model: Annotated[Path, typer.Option("--model", "-m", help="A 0.6b checkpoint folder; a random one (seed 0, "
                                                              "about 2.8 GB) is written there when absent.")]
    = Path(DEFAULTS.bench_checkpoint),
    precision: Annotated[Optional[list[str]], typer.Option(help="Torch precision to measure (repeatable): fp32, "
                                                                "bf16, int16, int12, int8, mixed.")] = None,
    threads: Annotated[Optional[list[int]], typer.Option(help="Torch threads (repeatable; default torch's).")]
    = None,
    baseline: Annotated[bool, typer.Option(help="Also time the publisher-style frame (fp32, full head, host "
                                                "sampling, one call per fast row) for the vs-base ratio.")]
    = False,
    device: DeviceOpt = "cpu",
    frames: Annotated[int, typer.Option(help="Frames per timed frame loop (eos ignored).")] = DEFAULTS.bench_frames,
    runs: Annotated[int, typer.Option(help="Timed runs after one warm-up; medians are reported.")]
    = DEFAULTS.bench_runs,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write every figure here.")] = None,
    codec_dtype: Annotated[Optional[list[str]], typer.Option(help="Codec dtype (repeatable): fp32 (default on CPU, "
                                                                  "exact) or bf16 (opt-in, faster, not exact).")]
    = None,
    cuda_graphs: Annotated[bool, typer.Option("--cuda-graphs", help="With --device cuda: also time each "
                                                                    "configuration with its frame replayed as one "
                                                                    "CUDA graph.")] = False,
    rss: Annotated[bool, typer.Option("--rss/--no-rss", help="Measure each configuration's peak RSS alone in a "
                                                             "subprocess of its own (one more load each).")] = True,
) -> None:
    """Speed and memory: prefill, ms/frame (slow, fast, sampler), weight-streaming floor, codec, RTF, TTFA, RSS."""
    from .backends.torch import resolve_device, resolve_dtype
    from .measure.bench import BenchConfig, ensure_checkpoint, format_table, meta, run_configs
    from .precision import resolve_precision

    if frames < 1 or runs < 1:
        raise ConfigError("--frames and --runs must be >= 1")
    if cuda_graphs and not device.startswith("cuda"):
        raise ConfigError(f"--cuda-graphs times CUDA graphs: add --device cuda (not {device})")
    # Checked here, not in the worker after minutes of loading: the device, every precision and codec dtype, and
    # where the JSON goes.
    resolve_device(device)
    for name in precision or []:
        resolve_precision(name, "torch-cpu")
    for name in codec_dtype or []:
        resolve_dtype(name)
    if json_out is not None and not json_out.expanduser().parent.is_dir():
        raise ConfigError(f"--json {json_out}: the folder {json_out.expanduser().parent} does not exist")
    log = functools.partial(err.print, highlight=False)
    ckpt = str(ensure_checkpoint(model, log))
    thread_list = threads or [None]
    configs = [BenchConfig(ckpt, "torch", device, "fp32", t, runs, frames, baseline=True)
               for t in thread_list] if baseline else []
    configs += [BenchConfig(ckpt, "torch", device, p, t, runs, frames, codec_dtype=c, cuda_graphs=g)
                for p in precision or ["fp32"] for t in thread_list for c in codec_dtype or [None]
                for g in ((False, True) if cuda_graphs else (False,))]
    busy = meta()["load_average"][0]
    if busy > 0.5:
        log(f"[yellow]warning:[/] load average {busy:.1f} before starting: other processes use the CPU, so times "
            "are inflated and noisy (see CPU use); compare rows of one run")
    try:
        rows = run_configs(configs, log, rss=rss)
    except RuntimeError as e:
        raise BackendError(str(e)) from None
    out.print(format_table(rows), highlight=False, soft_wrap=True)
    if json_out is not None:
        json_out.write_text(json.dumps({"meta": meta(), "results": rows}, indent=2) + "\n")
        log(f"wrote {json_out}")


@app.command()
@friendly
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface).")] = DEFAULTS.host,
    port: Annotated[int, typer.Option(help="TCP port.")] = DEFAULTS.port,
    model: ModelOpt = DEFAULT_MODEL,
    voices: VoicesOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = None,
    cuda_graphs: CudaGraphsOpt = False,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    workers: Annotated[int, typer.Option(help="Model instances, each serving one request at a time.")]
    = DEFAULTS.workers,
    max_queue: Annotated[int, typer.Option(help="Requests that may wait for a worker; more get 503.")]
    = DEFAULTS.max_queue,
    max_frames: Annotated[Optional[int], typer.Option(help="Frame cap per utterance (default: the model's).")]
    = None,
    chunk_frames: Annotated[int, typer.Option(help="Frames per streamed chunk (46 ms each).")]
    = DEFAULTS.chunk_frames,
    first_chunk_frames: Annotated[Optional[int], typer.Option(
        help=f"Frames in a stream's first chunk (default {DEFAULTS.first_chunk_frames}, at most --chunk-frames)."
    )] = None,
    max_input_chars: Annotated[int, typer.Option(help="Longest input text per request.")]
    = DEFAULTS.max_input_chars,
    batch: Annotated[int, typer.Option(
        help="Serve N requests at once from ONE model instance, their frames batched (torch backend; "
             "replaces --workers). 0: off.")] = 0,
) -> None:
    """Serve the OpenAI-compatible speech API (POST /v1/audio/speech), voices, /health and /metrics."""
    import uvicorn

    from .server import ServerSettings, create_app
    from .request import check_chunks
    from .tts import TTS

    if workers < 1 or max_queue < 0 or max_input_chars < 1 or (max_frames is not None and max_frames < 1) or batch < 0:
        raise ConfigError("--workers, --max-input-chars and --max-frames must be >= 1, --max-queue and --batch >= 0")
    check_chunks(chunk_frames, first_chunk_frames)
    _check_port(host, port)  # before minutes of loading
    if batch and workers != 1:
        raise ConfigError("--batch N serves N requests from one model instance: give --batch or --workers, not both")
    if batch and cuda_graphs:
        raise ConfigError("--cuda-graphs replays one utterance's frame (--workers instances); --batch runs its own "
                          "batched frames: give one of them")
    instances = 1 if batch else workers
    with err.status(f"loading {instances} model instance(s)..."):
        engines = [TTS.load(model, device=device, dtype=dtype, voices_dir=voices, backend=backend, assets=assets,
                            cuda_graphs=cuda_graphs) for _ in range(instances)]
    if batch:
        _, engines = engines[0].batched(batch)
        workers = batch
    settings = ServerSettings(workers=workers, max_queue=max_queue, max_input_chars=max_input_chars,
                              max_frames=max_frames, chunk_frames=chunk_frames, first_chunk_frames=first_chunk_frames)
    uvicorn.run(create_app(engines, settings), host=host, port=port, log_level="info")


voice_app = typer.Typer(no_args_is_help=True, context_settings={"help_option_names": ["-h", "--help"]},
                        help="Cloned voices: register a clip by name, list, show, remove.")
app.add_typer(voice_app, name="voice")


@voice_app.command("add")
@friendly
def voice_add(
    name: Annotated[str, typer.Argument(help="The new voice's name (letters, digits, space, '_', '-', '.').")],
    audio: Annotated[Path, typer.Option("--audio", help="The clip: 0.5-30 s of the speaker alone (wav, flac, "
                                                        "ogg, mp3; any sample rate and channels).")],
    text: Annotated[str, typer.Option("--text", help="What the clip says, word for word.")],
    model: ModelOpt = DEFAULT_MODEL,
    voices: VoicesOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a voice of the same name.")] = False,
    device: DeviceOpt = "auto",
) -> None:
    """Register a voice: encode the clip with the model's codec and store it with its transcript."""
    from .audio import read_reference
    from .text import check_text
    from .tts import TTS
    from .voices import VoiceStore

    store = VoiceStore(voices)
    store.check_new(name, force)  # fail before loading a model
    check_text(text, "reference text")
    _warn(read_reference(audio)[1].warnings)
    with err.status("loading the model..."):
        tts = TTS.load(model, device=device)
    with err.status("encoding the clip..."):
        voice = tts.register_voice(name, audio, text, store=store, replace=force)
    out.print(f"voice {voice.name!r}: {voice.duration_s:.2f} s at {voice.sample_rate} Hz -> {voice.frames} frames, "
              f"saved to {store.path(voice.name)}", highlight=False)


@voice_app.command("list")
@friendly
def voice_list(
    voices: VoicesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the voices as JSON.")] = False,
) -> None:
    """List the stored voices (a damaged file is listed with what is wrong)."""
    from .voices import VoiceStore

    store = VoiceStore(voices)
    entries: list[tuple[str, object]] = []
    for name in store.names():
        try:
            entries.append((name, store.load(name)))
        except VoiceError as e:
            entries.append((name, e))
    if as_json:
        out.print_json(json.dumps([{"name": n, "error": str(v)} if isinstance(v, VoiceError)
                                   else {**v.meta(), "frames": v.frames} for n, v in entries]))
        return
    if not entries:
        out.print(f"no voices in {store.root}; add one with: audio8 voice add NAME --audio CLIP --text TRANSCRIPT",
                  highlight=False)
    for _, v in entries:
        if isinstance(v, VoiceError):
            out.print(f"[red]damaged:[/] {v}", highlight=False)
        else:
            words = v.transcript if len(v.transcript) <= 50 else v.transcript[:49] + "…"
            out.print(f"{v.name}  {v.duration_s:.1f} s, {v.frames} frames, {v.sample_rate} Hz, {v.created}  "
                      f"\"{words}\"", highlight=False)


@voice_app.command("show")
@friendly
def voice_show(
    name: Annotated[str, typer.Argument(help="The voice's name.")],
    voices: VoicesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the voice (codes included) as JSON.")] = False,
) -> None:
    """Show one voice: transcript, source clip, duration, frames, checkpoint fingerprint, created."""
    from .voices import VoiceStore

    store = VoiceStore(voices)
    v = store.load(name)
    if as_json:
        out.print_json(json.dumps({**v.meta(), "frames": v.frames, "codes": v.codes.tolist()}))
        return
    rows = [("name", v.name), ("transcript", v.transcript), ("source", v.source or "-"),
            ("source audio", f"{v.duration_s:.2f} s at {v.sample_rate} Hz"),
            ("codes", f"[{v.codes.shape[0]}, {v.frames}] ({v.frames} frames)"), ("checkpoint", v.fingerprint),
            ("created", v.created), ("file", str(store.path(v.name)))]
    rows += [("warning", w) for w in v.warnings]
    for key, value in rows:
        out.print(f"{key:13s} {value}", highlight=False)


@voice_app.command("rm")
@friendly
def voice_rm(
    name: Annotated[str, typer.Argument(help="The voice to remove.")],
    voices: VoicesOpt = None,
) -> None:
    """Remove a stored voice."""
    from .voices import VoiceStore

    path = VoiceStore(voices).remove(name)
    out.print(f"removed voice {name!r} ({path})", highlight=False)


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
