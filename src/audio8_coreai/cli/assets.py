"""``audio8 convert``: a checkpoint into Core AI assets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..checkpoint import DEFAULT_MODEL
from ..settings import DEFAULTS, override
from .app import ModelOpt, app, described, friendly, out


@app.command()
@friendly
def convert(
    model: ModelOpt = DEFAULT_MODEL,
    out_dir: Annotated[
        Path, typer.Option("--out", help="New folder for the assets (must not exist or be empty).")
    ] = Path("assets"),
    precision: Annotated[
        str, typer.Option(help="fp32 (exact), fp16, or int8-fp16 (int8 slow-AR weights, fp16 elsewhere).")
    ] = "fp32",
    context: Annotated[
        int | None,
        typer.Option(help="KV slots for prompt + frames, a multiple of 32 (default: the model's max_seq_len)."),
    ] = None,
    decoder_frames: Annotated[
        int, typer.Option(help=described(DEFAULTS.coreai, "decoder_frames"))
    ] = DEFAULTS.coreai.decoder_frames,
    decoder_first_frames: Annotated[
        int, typer.Option(help=described(DEFAULTS.coreai, "decoder_first_frames", more=", for a stream's first chunk"))
    ] = DEFAULTS.coreai.decoder_first_frames,
    encoder_frames: Annotated[
        int, typer.Option(help=described(DEFAULTS.coreai, "encoder_frames"))
    ] = DEFAULTS.coreai.encoder_frames,
    part: Annotated[
        list[str] | None,
        typer.Option(help="Convert only this part (repeatable): dualar, codec_decoder, codec_encoder."),
    ] = None,
    greedy: Annotated[
        bool,
        typer.Option(
            help="Bake do_sample false into the frame graphs (argmax draws, the "
            "publisher's greedy path) instead of the checkpoint's sampling."
        ),
    ] = False,
) -> None:
    """Convert a checkpoint into Core AI assets (dualar, codec decoder, codec encoder .aimodel folders)."""
    import dataclasses
    import time

    from ..backends.coreai import PARTS
    from ..backends.coreai import convert as convert_assets
    from ..checkpoint import load_checkpoint
    from ..config import SamplingParams
    from ..precision import resolve_precision

    resolve_precision(precision, "coreai")  # before the checkpoint is read: names the Core AI precisions
    frames = override(
        DEFAULTS.coreai,
        decoder_frames=decoder_frames,
        decoder_first_frames=decoder_first_frames,
        encoder_frames=encoder_frames,
    )
    t0 = time.perf_counter()
    ckpt = load_checkpoint(model)
    sampling = SamplingParams.from_configs(ckpt.config, ckpt.generation)
    path = convert_assets(
        ckpt,
        out_dir,
        precision,
        context,
        sampling=dataclasses.replace(sampling, do_sample=False) if greedy else sampling,
        decoder_frames=frames.decoder_frames,
        decoder_first_frames=frames.decoder_first_frames,
        encoder_frames=frames.encoder_frames,
        parts=part or PARTS,
    )
    sizes = ", ".join(
        f"{p.name} {sum(f.stat().st_size for f in p.rglob('*') if f.is_file()) / 1e6:.1f} MB"
        for p in sorted(path.glob("*.aimodel"))
    )
    out.print(f"wrote {path} in {time.perf_counter() - t0:.0f} s: {sizes}", highlight=False)
