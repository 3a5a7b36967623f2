"""``audio8 make-checkpoint``: a checkpoint of random weights in the publisher's layout."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ..settings import DEFAULTS, override
from .app import app, described, err, friendly, out


class Size(StrEnum):
    tiny = "tiny"
    b06 = "0.6b"


@app.command("make-checkpoint")
@friendly
def make_checkpoint_cmd(
    directory: Annotated[Path, typer.Argument(help="New folder to write (must not exist or be empty).")],
    size: Annotated[Size, typer.Option(help="tiny (tests) or 0.6b (benchmarks, about 2.8 GB).")] = Size.tiny,
    seed: Annotated[
        int, typer.Option(help=described(DEFAULTS.measure, "checkpoint_seed", more=": same seed, same files"))
    ] = DEFAULTS.measure.checkpoint_seed,
) -> None:
    """Write a checkpoint with random weights in the publisher's exact layout."""
    from ..checkpoint import make_checkpoint

    seed = override(DEFAULTS.measure, names={"checkpoint_seed": "--seed"}, checkpoint_seed=seed).checkpoint_seed

    with err.status(f"writing a {size.value} checkpoint..."):
        path = make_checkpoint(directory, size.value, seed)
    out.print(f"wrote {path}", highlight=False)
