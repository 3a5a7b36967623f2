"""``audio8 prompt``: print the [11, P] prompt the model sees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ..checkpoint import DEFAULT_MODEL
from ..errors import CheckpointError, PromptError
from .app import ModelOpt, TextArg, app, friendly, out, text_of


@app.command()
@friendly
def prompt(
    text: TextArg,
    model: ModelOpt = DEFAULT_MODEL,
    ref_text: Annotated[str | None, typer.Option(help="Transcript of the reference clip (voice clone).")] = None,
    ref_codes: Annotated[Path | None, typer.Option(help=".npy of reference codes int [10, T].")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the [11, P] prompt as JSON.")] = False,
) -> None:
    """Print the [11, P] prompt the model sees (needs only config.json and the tokenizer files); a text too long for
    one utterance as the pieces say speaks, each with its prompt (--json: {"pieces": [{text, shape, prompt}]})."""
    from ..checkpoint import load_checkpoint
    from ..plan import make_plan
    from ..request import check_request
    from ..text import PromptBuilder, load_tokenizer
    from ..voices import Voice

    text = text_of(text)
    ckpt = load_checkpoint(model, weights=False, codec=False)
    if ckpt.tokenizer_dir is None:
        raise CheckpointError(f"{ckpt.path} has no tokenizer.json; the prompt needs the checkpoint's tokenizer files")
    builder = PromptBuilder(load_tokenizer(ckpt.tokenizer_dir), ckpt.config)
    if (ref_text is None) != (ref_codes is None):
        raise PromptError("voice-clone prompts need both --ref-text and --ref-codes")
    voice = None  # a one-off voice of the given transcript and codes (checked by the prompt builder)
    if ref_codes is not None:
        voice = Voice(_read_codes(ref_codes), ref_text, ckpt.codec_config.sample_rate, 0.0, "", "")
    # as say speaks it: a text too long for one utterance in pieces, each with its prompt
    plan = make_plan(check_request(text), voice, builder, ckpt.config, ckpt.generation, "")
    pieces = [(piece.text, piece.prompt) for piece in plan.pieces]
    if as_json:
        shown = [{"text": t, "shape": list(ids.shape), "prompt": ids.tolist()} for t, ids in pieces]
        out.print_json(
            json.dumps({k: v for k, v in shown[0].items() if k != "text"} if len(shown) == 1 else {"pieces": shown})
        )
        return
    for n, (piece, ids) in enumerate(pieces, 1):
        if len(pieces) > 1:
            out.print(f"piece {n} of {len(pieces)}: {piece!r}", highlight=False)
        out.print(f"prompt [{ids.shape[0]}, {ids.shape[1]}]; row 0:", highlight=False)
        out.print(" ".join(str(int(i)) for i in ids[0]), highlight=False)


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
