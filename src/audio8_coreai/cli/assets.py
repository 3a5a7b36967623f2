"""``audio8 convert``: a checkpoint into Core AI assets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..checkpoint import DEFAULT_MODEL
from ..settings import DEFAULTS, override
from .app import ModelOpt, app, described, err, friendly, out


@app.command()
@friendly
def convert(
    model: ModelOpt = DEFAULT_MODEL,
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out", help="New folder for the assets (absent or empty), or an asset folder to complete with --part."
        ),
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
    if context is not None and ckpt.tokenizer_dir is not None and "dualar" in (part or PARTS):
        _note_short_context(ckpt, context)
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
    made = [p for p in PARTS if p in (part or PARTS)]
    sizes = ", ".join(
        f"{p}.aimodel {sum(f.stat().st_size for f in (path / f'{p}.aimodel').rglob('*') if f.is_file()) / 1e6:.1f} MB"
        for p in made
    )
    held = [p for p in PARTS if p not in made and (path / f"{p}.aimodel").is_dir()]
    more = f" (beside {', '.join(f'{p}.aimodel' for p in held)})" if held else ""
    out.print(f"wrote {path} in {time.perf_counter() - t0:.0f} s: {sizes}{more}", highlight=False)


def _note_short_context(ckpt, context: int) -> None:
    """Say when ``context`` cannot hold a short sentence's prompt and ``DEFAULTS.speech.min_voice_frames`` of speech:
    such assets replay parity fixtures (short prompts) but refuse every text."""
    from ..model.frame import PREFILL_WIDTH
    from ..text import PromptBuilder, load_tokenizer

    if not (PREFILL_WIDTH <= context <= ckpt.config.max_seq_len and context % PREFILL_WIDTH == 0):
        return  # a context convert refuses: its error says so, no note before it
    needs = PromptBuilder(load_tokenizer(ckpt.tokenizer_dir), ckpt.config).plain("Hello.").shape[1]
    needs += DEFAULTS.speech.min_voice_frames
    if context < needs:
        least = -(-needs // PREFILL_WIDTH) * PREFILL_WIDTH
        err.print(
            f"note: --context {context} holds no text and its speech (a short sentence's prompt and "
            f"{DEFAULTS.speech.min_voice_frames} frames take {needs}): these assets can replay parity fixtures, "
            f"not speak; give --context {least} or more to speak",
            highlight=False,
        )
