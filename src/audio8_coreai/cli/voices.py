"""``audio8 voice add | list | show | rm``: the stored cloned voices."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ..checkpoint import DEFAULT_MODEL
from ..errors import VoiceError
from ..settings import DEFAULTS
from .app import DeviceOpt, ModelOpt, VoicesOpt, app, err, friendly, out, print_warnings

voice_app = typer.Typer(
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Cloned voices: add (register a clip by name), list, show, rm (remove).",
)
app.add_typer(voice_app, name="voice")


@voice_app.command("add")
@friendly
def voice_add(
    name: Annotated[str, typer.Argument(help="The new voice's name (letters, digits, space, '_', '-', '.').")],
    audio: Annotated[
        Path,
        typer.Option(
            "--audio",
            help="The clip: 0.5-30 s of the speaker alone (wav, flac, ogg, mp3; any sample rate and channels).",
        ),
    ],
    text: Annotated[str, typer.Option("--text", "--transcript", help="What the clip says, word for word.")],
    model: ModelOpt = DEFAULT_MODEL,
    voices: VoicesOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a voice of the same name.")] = False,
    device: DeviceOpt = "auto",
) -> None:
    """Register a voice: encode the clip with the model's codec and store it with its transcript."""
    from ..audio import read_reference
    from ..text import check_text
    from ..tts import TTS
    from ..voices import VoiceStore

    store = VoiceStore(voices)
    store.check_new(name, force)  # fail before loading a model
    if name == DEFAULTS.wyoming.voice:  # as Wyoming matches it: exactly
        print_warnings(
            [
                f"audio8 wyoming lists the model's own voice as {DEFAULTS.wyoming.voice!r} (wyoming.voice), so a voice "
                "of that name cannot be picked there; give it another name to use it with Home Assistant"
            ]
        )
    check_text(text, "reference text", "ref_text")
    print_warnings(read_reference(audio)[1].warnings)
    with err.status("loading the model..."):
        tts = TTS.load(model, device=device)
    with err.status("encoding the clip..."):  # its warnings printed above, before loading
        voice = tts.register_voice(name, audio, text, store=store, replace=force, warn=False)
    out.print(
        f"voice {voice.name!r}: {voice.duration_s:.2f} s at {voice.sample_rate} Hz -> {voice.frames} frames, "
        f"saved to {store.path(voice.name)}",
        highlight=False,
        markup=False,
    )


@voice_app.command("list")
@friendly
def voice_list(
    voices: VoicesOpt = None, as_json: Annotated[bool, typer.Option("--json", help="Print the voices as JSON.")] = False
) -> None:
    """List the stored voices (a damaged file is listed with what is wrong)."""
    from ..voices import VoiceStore

    store = VoiceStore(voices)
    entries: list[tuple[str, object]] = []
    for name in store.names():
        try:
            entries.append((name, store.load(name)))
        except VoiceError as e:
            entries.append((name, e))
    if as_json:
        out.print_json(
            json.dumps(
                [
                    {"name": n, "error": str(v)} if isinstance(v, VoiceError) else {**v.meta(), "frames": v.frames}
                    for n, v in entries
                ]
            )
        )
        return
    if not entries:
        out.print(
            f"no voices in {store.root}; add one with: audio8 voice add NAME --audio CLIP --text TRANSCRIPT",
            highlight=False,
            markup=False,
        )
    for _, v in entries:
        if isinstance(v, VoiceError):
            out.print(f"[red]damaged:[/] {escape(str(v))}", highlight=False)  # its text is not markup
        else:
            words = _shown(v.transcript if len(v.transcript) <= 50 else v.transcript[:49] + "…")
            out.print(
                f'{v.name}  {v.duration_s:.1f} s, {v.frames} frames, {v.sample_rate} Hz, {v.created}  "{words}"',
                highlight=False,
                markup=False,
            )


@voice_app.command("show")
@friendly
def voice_show(
    name: Annotated[str, typer.Argument(help="The voice's name.")],
    voices: VoicesOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the voice (codes included) as JSON.")] = False,
) -> None:
    """Show one voice: transcript, source clip, duration, frames, checkpoint fingerprint, created."""
    from ..voices import VoiceStore

    store = VoiceStore(voices)
    v = store.load(name)
    if as_json:  # one line, as prompt --json: indented, the codes took a line each (6,500 for 30 s)
        sys.stdout.write(json.dumps({**v.meta(), "frames": v.frames, "codes": v.codes.tolist()}) + "\n")
        return
    rows = [
        ("name", v.name),
        ("transcript", _shown(v.transcript)),
        ("source", _shown(v.source) or "-"),
        ("source audio", f"{v.duration_s:.2f} s at {v.sample_rate} Hz"),
        ("codes", f"[{v.codes.shape[0]}, {v.frames}] ({v.frames} frames)"),
        ("checkpoint", v.fingerprint),
        ("created", v.created),
        ("file", str(store.path(v.name))),
    ]
    rows += [("warning", w) for w in v.warnings]
    for key, value in rows:
        out.print(f"{key:13s} {value}", highlight=False, markup=False)


@voice_app.command("rm")
@friendly
def voice_rm(name: Annotated[str, typer.Argument(help="The voice to remove.")], voices: VoicesOpt = None) -> None:
    """Remove a stored voice."""
    from ..voices import SUFFIX, VoiceStore

    path = VoiceStore(voices).remove(name)
    out.print(f"removed voice {path.name.removesuffix(SUFFIX)!r} ({path})", highlight=False, markup=False)


def _shown(text: str) -> str:
    """``text`` for a terminal: each character that is not printable (a control such as ESC, which could retitle
    or clear the terminal, a bidi override, a line break) as its escape; a voice file's fields are anyone's text."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
