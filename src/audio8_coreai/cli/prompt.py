"""``audio8 prompt``: print the [11, P] prompt the model sees."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import numpy as np
import typer

from ..checkpoint import DEFAULT_MODEL
from ..errors import CheckpointError, PromptError
from .app import ModelOpt, TextArg, TextCommand, VoicesOpt, app, friendly, out, text_of

if TYPE_CHECKING:
    from ..plan import Piece


@app.command(cls=TextCommand)
@friendly
def prompt(
    text: TextArg,
    model: ModelOpt = DEFAULT_MODEL,
    ref_text: Annotated[str | None, typer.Option(help="Transcript of the reference clip (voice clone).")] = None,
    ref_codes: Annotated[Path | None, typer.Option(help=".npy of reference codes int [10, T].")] = None,
    voice: Annotated[str | None, typer.Option(help="The prompt of this stored voice (see `audio8 voice`).")] = None,
    voices: VoicesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the [11, P] prompt as JSON.")] = False,
) -> None:
    """Print the [11, P] prompt the model sees (needs only config.json and the tokenizer files); a text too long for
    one utterance as the pieces say speaks, each with its prompt (--json: {"pieces": [{text, shape, prompt}]})."""
    from ..checkpoint import load_checkpoint
    from ..plan import make_plan
    from ..request import check_request
    from ..text import PromptBuilder, load_tokenizer
    from ..voices import Voice, VoiceStore

    text = text_of(text)
    ckpt = load_checkpoint(model, weights=False, codec=False)
    if ckpt.tokenizer_dir is None:
        raise CheckpointError(f"{ckpt.path} has no tokenizer.json; the prompt needs the checkpoint's tokenizer files")
    builder = PromptBuilder(load_tokenizer(ckpt.tokenizer_dir), ckpt.config)
    if (ref_text is None) != (ref_codes is None):
        raise PromptError("voice-clone prompts need both --ref-text and --ref-codes")
    if voice is not None and ref_codes is not None:
        raise PromptError("give a stored voice (--voice) or reference codes (--ref-codes), not both")
    speaker = None  # a one-off voice of the given transcript and codes (checked by the prompt builder)
    if ref_codes is not None:
        speaker = Voice(_read_codes(ref_codes), ref_text, ckpt.codec_config.sample_rate, 0.0, "", "")
    elif voice is not None:  # its codes as stored: made with another checkpoint, they are refused when spoken
        speaker = VoiceStore(voices).load(voice)
    # as say speaks it: a text too long for one utterance in pieces, each with its prompt
    plan = make_plan(check_request(text), speaker, builder, ckpt.config, ckpt.generation, "")
    if as_json:
        _print_json(plan.pieces)
        return
    for n, piece in enumerate(plan.pieces, 1):  # each prompt built as it is printed (a book's are hundreds of MB)
        ids = piece.prompt
        if len(plan.pieces) > 1:
            out.print(f"piece {n} of {len(plan.pieces)}: {piece.text!r}", highlight=False)
        out.print(f"prompt [{ids.shape[0]}, {ids.shape[1]}]; row 0:", highlight=False)
        out.print(" ".join(map(str, ids[0].tolist())), highlight=False)


def _print_json(pieces: Sequence[Piece]) -> None:
    """One piece as ``{shape, prompt}``, several as ``{"pieces": [{text, shape, prompt}]}``: written to stdout a
    piece at a time, each prompt built as it is written, so a long text's output never sits in memory whole."""
    if len(pieces) == 1:
        ids = pieces[0].prompt
        sys.stdout.write(json.dumps({"shape": list(ids.shape), "prompt": ids.tolist()}) + "\n")
        return
    sys.stdout.write('{"pieces": [')
    for n, piece in enumerate(pieces):
        ids = piece.prompt
        shown = {"text": piece.text, "shape": list(ids.shape), "prompt": ids.tolist()}
        sys.stdout.write((", " if n else "") + json.dumps(shown))  # ASCII: any stdout encoding takes it
    sys.stdout.write("]}\n")


def _read_codes(path: Path) -> np.ndarray:
    """The reference codes of ``--ref-codes``: a .npy array, its shape and dtype checked by the prompt builder.
    Raises PromptError naming the file where it cannot be read or is no .npy file (a stored voice's .npz, text)."""
    try:
        with open(path, "rb") as f:
            npy = f.read(6) == b"\x93NUMPY"
            f.seek(0)
            codes = np.load(f, allow_pickle=False) if npy else None
    except (OSError, ValueError) as e:
        raise PromptError(f"cannot read reference codes {path}: {e} (expected a .npy int array [10, frames])") from e
    if codes is None:
        raise PromptError(
            f"{path} is not a .npy file: --ref-codes takes a .npy int array [10, frames] "
            "(a stored voice is spoken by name: audio8 say --voice NAME)"
        )
    return codes
