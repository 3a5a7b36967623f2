"""``audio8 say``: speak text into a file or stdout, whole or streamed."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..checkpoint import DEFAULT_MODEL
from ..errors import AudioError, EngineError
from ..settings import DEFAULTS
from .app import (
    AssetsOpt,
    BackendOpt,
    CodecProcessOpt,
    CudaGraphsOpt,
    DeviceOpt,
    ModelOpt,
    PrecisionOpt,
    TextArg,
    TextCommand,
    VoicesOpt,
    app,
    described,
    err,
    friendly,
    out,
    print_warnings,
    text_of,
)


@app.command(cls=TextCommand)
@friendly
def say(
    text: TextArg,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Where to write the audio (.wav, .flac, .ogg), or - for stdout (16-bit wav, streamed as made).",
        ),
    ] = Path("speech.wav"),
    model: ModelOpt = DEFAULT_MODEL,
    seed: Annotated[int | None, typer.Option(help="Same seed, same audio; default: a fresh one.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature (default: the checkpoint's).")] = None,
    top_k: Annotated[int | None, typer.Option(help="Top-k (default: the checkpoint's).")] = None,
    top_p: Annotated[float | None, typer.Option(help="Top-p (default: the checkpoint's).")] = None,
    max_frames: Annotated[
        int | None,
        typer.Option(
            help=f"Frame cap of each utterance (46 ms a frame; a long text is split into utterances whatever the "
            f"cap; default: {DEFAULTS.speech.cap_base_frames} plus "
            f"{DEFAULTS.speech.cap_frames_per_token} per text token, at most the checkpoint's max_new_tokens and "
            "what the context leaves)."
        ),
    ] = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = None,
    cuda_graphs: CudaGraphsOpt = DEFAULTS.torch.cuda_graphs,
    codec_process: CodecProcessOpt = DEFAULTS.torch.codec_process,
    backend: BackendOpt = "torch",
    assets: AssetsOpt = None,
    voice: Annotated[str | None, typer.Option(help="Speak in this stored voice (see `audio8 voice`).")] = None,
    voices: VoicesOpt = None,
    ref_audio: Annotated[
        Path | None, typer.Option(help="One-off cloning: a clip of the voice (0.5-30 s), not stored; needs --ref-text.")
    ] = None,
    ref_text: Annotated[str | None, typer.Option(help="The transcript of --ref-audio.")] = None,
    stream: Annotated[
        bool,
        typer.Option(
            "--stream",
            help="Write the audio as it is made, every --chunk-frames "
            "frames; text too long for one utterance is split into "
            "sentences.",
        ),
    ] = False,
    chunk_frames: Annotated[
        int, typer.Option(help=described(DEFAULTS.speech, "chunk_frames", "With --stream: "))
    ] = DEFAULTS.speech.chunk_frames,
    first_chunk_frames: Annotated[
        int | None,
        typer.Option(
            help=described(
                DEFAULTS.speech,
                "first_chunk_frames",
                "With --stream: ",
                f" (default {DEFAULTS.speech.first_chunk_frames}, at most --chunk-frames)",
            )
        ),
    ] = None,
) -> None:
    """Speak TEXT into an audio file (44.1 kHz mono), in the model's own voice or a cloned one."""
    from ..audio import check_writable, read_reference, write_audio
    from ..request import check_request
    from ..tts import TTS
    from ..voices import VoiceStore

    # Fail before loading a model; the chunk sizes too: long text is streamed even without --stream.
    req = check_request(
        text_of(text),
        voice=voice,
        ref_audio=ref_audio,
        ref_text=ref_text,
        seed=seed,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_frames=max_frames,
        chunk_frames=chunk_frames,
        first_chunk_frames=first_chunk_frames,
    )
    to_stdout = str(output) == "-"
    if to_stdout and sys.stdout.isatty():
        raise AudioError(
            "-o - writes binary audio to stdout, which is a terminal here: pipe it (| aplay, "
            "| ffplay -) or give a file name"
        )
    if not to_stdout:
        check_writable(output)
    if ref_audio is not None:
        print_warnings(read_reference(ref_audio)[1].warnings)
    elif voice is not None:  # read once, before loading: an unknown or damaged voice fails here (its checkpoint:
        req = dataclasses.replace(req, voice=VoiceStore(voices).load(req.voice))  # checked by the plan)
    load_options = dict(
        device=device, precision=precision, voices_dir=voices, backend=backend, assets=assets, cuda_graphs=cuda_graphs
    )
    load_options["codec_process"] = codec_process
    with err.status("loading the model..."):
        tts = TTS.load(model, **load_options)
    plan = tts.plan(req)  # a clip is encoded here, once
    if plan.warning:
        print_warnings([plan.warning])
    progress = Progress(
        TextColumn("frames"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,  # off a terminal rich would leave a blank line where the bar was
    )
    spoken_as = f"voice {voice!r}, " if voice else (f"voice of {ref_audio.name}, " if ref_audio else "")
    if not stream and not to_stdout and len(plan.pieces) > 1:
        err.print(
            "note: the text is too long for one utterance; it is split into sentences, as with --stream",
            highlight=False,
        )
        stream = True
    if stream or to_stdout:
        speech = tts.stream(plan)
        with progress:
            task = progress.add_task("frames", total=speech.max_frames)
            speech.on_frame = lambda step: progress.update(task, completed=step + 1)
            (_write_stdout if to_stdout else _write_stream)(speech, output)
        (err if to_stdout else out).print(
            f"{'stdout' if to_stdout else output}: {_count(speech.frames, 'frame')} in "
            f"{_count(len(speech.pieces), 'piece')}, "
            f"{speech.duration_s:.2f} s of audio, "
            f"first audio after {speech.first_audio_s or 0:.2f} s ({spoken_as}seed {speech.seed}, "
            f"{tts.backend.description})",
            highlight=False,
        )
        return
    with progress:
        task = progress.add_task("frames", total=None)
        result = tts.generate(
            plan,
            on_start=lambda n: progress.update(task, total=n),
            on_frame=lambda step: progress.update(task, completed=step + 1),
        )
    if result.frames == 0:
        raise _no_audio(output, result.seed)
    write_audio(output, result.audio, result.sample_rate)
    if not result.reached_eos:
        remedy = _cap_remedy([result.prompt_length], result.max_frames, tts.config.max_seq_len)
        if remedy.startswith("the context is full"):
            remedy += ", or use --stream, which splits it by its estimated speech"
        _warn_cap("the utterance", result.max_frames, remedy)
    out.print(
        f"{output}: {_count(result.frames, 'frame')}, {result.duration_s:.2f} s of audio, RTF {result.rtf:.2f} "
        f"({spoken_as}seed {result.seed}, {tts.backend.description})",
        highlight=False,
    )


def _no_audio(output: Path, seed: int) -> EngineError:
    """The error for an utterance the model ended on its first frame with ``seed``: nothing is written to
    ``output``."""
    return EngineError(
        f"the model ended the utterance at once (eos on the first frame, seed {seed}): nothing written to "
        f"{'stdout' if str(output) == '-' else output}; try another --seed"
    )


def _write_stdout(speech, output: Path) -> None:
    """Write ``speech`` (a SpeechStream) to stdout as 16-bit wav, each chunk as it comes (the header's sizes say
    'until the end', as a streamed wav does). A reader that closes the pipe early ends the run quietly."""
    from ..audio import SpeechEncoder

    encoder, sink = SpeechEncoder("wav", speech.sample_rate), sys.stdout.buffer
    try:
        for chunk in speech:
            sink.write(encoder.write(chunk))
            sink.flush()
        if speech.frames == 0:  # nothing was written, not even the header
            raise _no_audio(output, speech.seed)
        sink.write(encoder.close())
        sink.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush into the closed pipe at exit
        raise typer.Exit(0) from None
    _warn_capped(speech)


def _write_stream(speech, output: Path) -> None:
    """Write the chunks of ``speech`` (a SpeechStream) to ``output`` as they come; warn about capped pieces."""
    from ..audio import open_audio_writer, partial_path

    existed = output.exists()
    try:
        with open_audio_writer(output, speech.sample_rate) as f:
            for chunk in speech:
                f.write(chunk)
                f.flush()
            if speech.frames == 0:  # raised inside: the writer then leaves an existing file as it was
                raise _no_audio(output, speech.seed)
    except KeyboardInterrupt:
        if partial_path(output).exists():
            err.print(
                f"{output} {'is left as it was' if existed else 'was not written'}; the audio made so far is in "
                f"{partial_path(output)}",
                highlight=False,
                soft_wrap=True,
            )
        raise
    _warn_capped(speech)


def _warn_capped(speech) -> None:
    capped = speech.capped
    if capped:
        pieces = "piece" if len(capped) == 1 else "pieces"
        which = "the utterance" if len(speech.pieces) == 1 else f"{pieces} {_numbers(capped, len(speech.pieces))}"
        cap = max(speech.pieces[i].max_frames for i in capped)
        remedy = _cap_remedy([p.prompt.shape[1] for p in speech.pieces], cap, speech.backend.cfg.max_seq_len)
        _warn_cap(which, cap, remedy)


def _warn_cap(which: str, cap: int, remedy: str) -> None:
    """The one warning of speech stopped at its frame cap (``which``: the utterance, or the pieces' numbers)."""
    err.print(
        f"[yellow]warning:[/] {which} stopped at the frame cap ({_count(cap, 'frame')}) before the model ended it; "
        f"the audio may be cut ({remedy})",
        highlight=False,
    )


def _numbers(indices: list[int], total: int, shown: int = 10) -> str:
    """The 1-based numbers of ``indices`` (of ``total`` pieces), the first ``shown`` of them and how many in all when
    there are more: a warning of a few lines, whatever the text's length."""
    listed = ", ".join(str(i + 1) for i in indices[:shown])
    return listed if len(indices) <= shown else f"{listed}... ({len(indices)} of {total})"


def _cap_remedy(prompt_lengths: list[int], cap: int, context: int) -> str:
    """What to do about pieces (prompts of ``prompt_lengths`` columns) stopped at the frame cap ``cap``: a larger
    --max-frames, at most what the context leaves every piece (it caps each of them), or a shorter text when that
    is no larger (of a split text: shorter sentences, which the split keeps whole, or another seed)."""
    most = min(context - length for length in prompt_lengths)
    if most <= cap and len(prompt_lengths) > 1:
        return "the context is full: shorter sentences make shorter pieces, or try another --seed"
    if most <= cap:
        return "the context is full: shorten the text"
    return f"raise --max-frames, up to {most} (what the context leaves), or shorten the text"


def _count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless one ("1 frame", "3 frames")."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
