"""The ``audio8`` command: say | prompt | parity | make-checkpoint.

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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .audio import AudioError
from .backends.torch import BackendError
from .checkpoint import DEFAULT_MODEL, CheckpointError
from .config import ConfigError
from .engine import EngineError
from .parity import ParityError
from .prompt import PromptError
from .tokenizer import TokenizerError

USER_ERRORS = (AudioError, BackendError, CheckpointError, ConfigError, EngineError, ParityError, PromptError,
               TokenizerError)

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
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
            err.print(f"[bold red]error:[/] {e}", highlight=False)
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
DtypeOpt = Annotated[str, typer.Option(help="fp32 or bf16 (the codec stays fp32 on CPU).")]


@app.command()
@friendly
def say(
    text: Annotated[str, typer.Argument(help="The text to speak.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the audio (.wav, .flac, .ogg).")]
    = Path("speech.wav"),
    model: ModelOpt = DEFAULT_MODEL,
    seed: Annotated[Optional[int], typer.Option(help="Same seed, same audio; default: a fresh one.")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Sampling temperature (default 0.7).")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Top-k (default 50).")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Top-p (default 0.9).")] = None,
    max_frames: Annotated[Optional[int], typer.Option(help="Frame cap (46 ms each; default 512).")] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "fp32",
) -> None:
    """Speak TEXT into an audio file (44.1 kHz mono)."""
    from .audio import write_audio
    from .prompt import check_text
    from .tts import TTS

    check_text(text)  # fail before loading a model
    _check_output(output)
    with err.status("loading the model..."):
        tts = TTS.load(model, device=device, dtype=dtype)
    progress = Progress(TextColumn("frames"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err, transient=True)
    with progress:
        task = progress.add_task("frames", total=None)
        result = tts.generate(text, seed=seed, temperature=temperature, top_k=top_k, top_p=top_p,
                              max_frames=max_frames,
                              on_start=lambda n: progress.update(task, total=n),
                              on_frame=lambda step: progress.update(task, completed=step + 1))
    if result.frames == 0:
        raise EngineError("the model ended the utterance at once (eos on the first frame): nothing to write; "
                          "try another --seed")
    write_audio(output, result.audio, result.sample_rate)
    if not result.reached_eos:
        err.print(f"[yellow]warning:[/] stopped at the frame cap ({result.max_frames} frames) before the model "
                  "ended the utterance; the audio may be cut (raise --max-frames or shorten the text)")
    out.print(f"{output}: {result.frames} frames, {result.duration_s:.2f} s of audio, RTF {result.rtf:.2f} "
              f"(seed {result.seed}, {tts.backend.description})", highlight=False)


def _check_output(path: Path) -> None:
    """Catch an unwritable output before minutes of synthesis."""
    from .audio import WRITE_FORMATS

    if path.suffix.lower() not in WRITE_FORMATS:
        raise AudioError(f"cannot write {path.name!r}: use a .wav, .flac or .ogg file name")
    if path.is_dir():
        raise AudioError(f"{path} is a folder: give a file name such as {path / 'speech.wav'}")
    folder = path.expanduser().parent
    if not folder.is_dir():
        raise AudioError(f"cannot write {path}: the folder {folder} does not exist")


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
    from .prompt import PromptBuilder, check_text
    from .tokenizer import load_tokenizer

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
    dtype: DtypeOpt = "fp32",
    tolerance: Annotated[float, typer.Option(help="Max |logit/waveform diff| for fp32 parity.")] = 1e-4,
    as_json: Annotated[bool, typer.Option("--json", help="Print the full report as JSON.")] = False,
) -> None:
    """Replay an oracle fixture; exit 0 only when fp32 parity holds (reports agreement counts for bf16)."""
    from .backends.torch import TorchBackend
    from .checkpoint import load_checkpoint
    from .parity import run_parity

    backend = TorchBackend(load_checkpoint(model), device, dtype)
    report = run_parity(backend, fixture, tolerance)
    if as_json:
        out.print_json(report.to_json())
    else:
        _print_parity(report)
    exact = backend.dtype.is_floating_point and backend.dtype.itemsize == 4
    if exact and not report.passed:
        raise typer.Exit(1)


def _print_parity(report) -> None:
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
        out.print(f"codec {c.name:16s} max|dwave| {c.waveform_max_diff:.2e} ({inter})", highlight=False)
    verdict = "PASS" if report.passed else "FAIL"
    out.print(f"fp32 parity (tolerance {report.tolerance:g}): {verdict}  [{report.backend}]", highlight=False)


@app.command("make-checkpoint")
@friendly
def make_checkpoint_cmd(
    directory: Annotated[Path, typer.Argument(help="New folder to write (must not exist or be empty).")],
    size: Annotated[Size, typer.Option(help="tiny (tests) or 0.6b (benchmarks, about 2.8 GB).")] = Size.tiny,
    seed: Annotated[int, typer.Option(help="Same seed, byte-identical files.")] = 0,
) -> None:
    """Write a checkpoint with random weights in the publisher's exact layout."""
    from .checkpoint import make_checkpoint

    with err.status(f"writing a {size.value} checkpoint..."):
        path = make_checkpoint(directory, size.value, seed)
    out.print(f"wrote {path}", highlight=False)


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
