"""The ``audio8`` command's typer app, its consoles, the error handler and the options several commands share.

Every expected failure (an :class:`.errors.Audio8Error`: bad text, a wrong checkpoint folder, an unwritable output,
an unknown device) prints one line saying what to do and exits with status 2; no tracebacks.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
import typer.core
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from ..errors import Audio8Error, ConfigError, PromptError
from ..settings import DEFAULTS

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Audio8-TTS-Preview-0.6b: speak text from the publisher's checkpoint.",
)
err = Console(stderr=True)
out = Console()


_OS_REMEDIES = {
    errno.ENAMETOOLONG: "use a shorter file name",
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space or write elsewhere",
    errno.EACCES: "write elsewhere or change its permissions",
    errno.EPERM: "write elsewhere or change its permissions",
    errno.EROFS: "the file system is read-only: write elsewhere",
    errno.ENOENT: "check the path",
}


def _os_error(e: OSError) -> str:
    """One line for an OSError: what failed, on which path (cut to 120 characters), and what to do."""
    name = str(e.filename) if e.filename is not None else ""
    where = f" ({name[:117] + '...' if len(name) > 120 else name})" if name else ""
    remedy = _OS_REMEDIES.get(e.errno or 0, "check the path and the disk")
    return f"{e.strerror or e}{where}: {remedy}"


def friendly(fn):
    """Turn the project's user-facing errors (Audio8Error) and the system's refusals (OSError: a file name too long,
    a full disk) into one 'error: ...' line and exit status 2; Ctrl-C into 'interrupted' and status 130, whatever
    error it became (:func:`listen_for_interrupts`)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out.soft_wrap, err.soft_wrap = not out.is_terminal, not err.is_terminal  # piped: whole lines, not 80 columns
        if _HEARD:  # while the command's modules loaded: what they left half made must not run
            raise _interrupted()
        try:
            return fn(*args, **kwargs)
        except Audio8Error as e:
            if _HEARD:
                raise _interrupted() from None
            # One line (greppable, paths never cut); the message escaped: "[1, 11, 32]" is text, not markup.
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            raise _interrupted() from None
        except BrokenPipeError:  # the reader of stdout went away (`... -o - | head`): nothing left to say
            raise typer.Exit(1) from None
        except OSError as e:  # the system refused a file or a device: a name too long, a full disk, a permission
            if _HEARD:
                raise _interrupted() from None
            err.print(f"[bold red]error:[/] {escape(_os_error(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except Exception:
            if not _HEARD:
                raise
            raise _interrupted() from None

    return wrapper


def _interrupted() -> typer.Exit:
    """The command's exit after an interruption (:func:`say_interrupted`)."""
    return typer.Exit(say_interrupted())


ENDING_SIGNALS = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}  # unwound as a Ctrl-C, then re-raised


def say_interrupted() -> int:
    """'interrupted', and the status to exit with (130), after a Ctrl-C. After a SIGTERM or SIGHUP, what the command
    held is already cleaned up (the unwinding did it): 'terminated' or 'hung up', then the process ends by the
    signal itself, as a process that handles none does (systemd counts that a clean stop, a status 143 a failure;
    uvicorn re-raises it so too)."""
    _SAID.append(True)
    if _HEARD and _HEARD[-1] in ENDING_SIGNALS:
        err.print(ENDING_SIGNALS[_HEARD[-1]])
        signal.signal(_HEARD[-1], signal.SIG_DFL)
        os.kill(os.getpid(), _HEARD[-1])
    err.print("interrupted")
    return 130


_HEARD: list[int] = []  # the signals heard since listen_for_interrupts (the command's own process only)
_SAID: list[bool] = []  # said_interrupted has said it


def interruption_unsaid() -> bool:
    """Whether a signal was heard (:func:`listen_for_interrupts`) that no :func:`say_interrupted` has said yet."""
    return bool(_HEARD) and not _SAID


def listen_for_interrupts() -> None:
    """Note each Ctrl-C (SIGINT), SIGTERM and SIGHUP from now on, raised as KeyboardInterrupt as by Python's own
    handler of SIGINT: a C extension's import it cuts short can leave the module half made, and a later import fail
    (numpy's RecursionError, "cannot load module more than once"), which :func:`friendly` then says as the
    interruption it is; and a SIGTERM (``timeout``, ``docker stop``, a CI cancel) or SIGHUP (the terminal closed)
    unwinds as a Ctrl-C does, so what a command left half made (a conversion's hidden folder, a partial audio file)
    is cleaned up, not left behind. A SIGHUP ignored already (``nohup``) stays ignored. The servers put their own
    handlers in place while they serve. The ``audio8`` command calls it before loading its modules; the main thread
    only (signals are its)."""

    def hear(signum: int, frame: object) -> None:
        _HEARD.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        for heard in (signal.SIGINT, *ENDING_SIGNALS):
            if heard != signal.SIGHUP or signal.getsignal(heard) is not signal.SIG_IGN:
                signal.signal(heard, hear)


class TextCommand(typer.core.TyperCommand):
    """A command whose argument is the text to speak: a text that begins with '-' and reads as text, not as one of
    the command's options ("-5 degrees", "-5", "- a list item"), is refused with its fix (``--`` before it) where
    click would say "No such option: -5"; a mistyped option (``--sede``) is left to click's own suggestion."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        if ctx.resilient_parsing:  # shell completion: nothing is said
            return super().parse_args(ctx, args)
        options = [p for p in self.params if isinstance(p, typer.core.TyperOption)]
        known = {name for p in options for name in (*p.opts, *p.secondary_opts)}
        valued = {name for p in options if not p.is_flag for name in p.opts}
        previous = None
        for arg in args:
            if arg == "--":
                break
            word = arg.lstrip("-")
            textlike = any(c.isspace() for c in arg.strip()) or not word or not word[0].isascii() or word[0].isdigit()
            unknown = arg.startswith("-") and arg != "-" and arg.split("=", 1)[0] not in known
            if previous not in valued and unknown and textlike:
                err.print(
                    f"[bold red]error:[/] the text {escape(repr(arg))} begins with '-', which marks an option: put "
                    f"-- before it, after any options ({ctx.command_path} -- {escape(repr(arg))})",
                    highlight=False,
                    soft_wrap=True,
                )
                raise typer.Exit(2)
            previous = arg
        return super().parse_args(ctx, args)


def described(group: BaseModel, field: str, lead: str = "", more: str = "") -> str:
    """The help of an option that sets ``group``'s ``field``: ``lead``, the field's description (settings.py; its
    "None: X" said "default: X"), ``more``. The option's default is the field's value, which ``--help`` shows."""
    text = str(type(group).model_fields[field].description).replace("None: ", "default: ")
    return f"{lead}{text if lead else text[0].upper() + text[1:]}{more}."


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Checkpoint folder (publisher layout) or hub id.")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
PrecisionOpt = Annotated[
    str | None,
    typer.Option(
        "--precision",
        help="Torch precision: fp32 (exact), bf16, fp16w (CPU: float16 weights, fp32 activations), bf16w (CUDA: "
        "bf16 weights, fp32 maths), int16 (16-bit fixed point), int12; the fast tier, not exact (int8 weights miss "
        "draws): int8-fp16w, int8-int8, also int8 and int8-int16; default on CPU fp16w for a bf16 checkpoint (the "
        "release) and int16 for an fp32 one, fp32 on CUDA. The codec stays fp32 on CPU.",
    ),
]
CudaGraphsOpt = Annotated[
    bool | None,
    typer.Option("--cuda-graphs/--no-cuda-graphs", help=described(DEFAULTS.torch, "cuda_graphs", "Torch on CUDA: ")),
]
CodecProcessOpt = Annotated[
    bool | None,
    typer.Option(
        "--codec-process/--no-codec-process", help=described(DEFAULTS.torch, "codec_process", "Torch on CPU: ")
    ),
]
VoicesOpt = Annotated[
    Path | None,  # a folder, absent or there (made on the first save), never a file: it listed no voices, silently
    typer.Option("--voices", file_okay=False, help="Voices folder (default: the per-user one)."),
]
BackendOpt = Annotated[str, typer.Option(help="torch, or coreai (runs the assets given with --assets).")]
AssetsOpt = Annotated[
    Path | None, typer.Option(help="Core AI asset folder written by `audio8 convert` (with --backend coreai).")
]


TextArg = Annotated[str, typer.Argument(help="The text to speak; - reads it from stdin (< FILE for a file).")]
MAX_STDIN_BYTES = 16 * 2**20  # text read from stdin (a book is about 1 MB): more is refused, not held


def text_of(text: str) -> str:
    """The TEXT argument, or stdin's text for ``-`` (UTF-8; bytes that are none are kept as surrogate escapes, which
    the text check names). A TEXT that is one word naming a file here is spoken as given, with a warning that says
    how to speak the file. Raises PromptError past MAX_STDIN_BYTES."""
    if text != "-":
        if _names_a_file(text):
            print_warnings([f"{text.strip()!r} is also a file here; to speak what it holds: - < {text.strip()}"])
        return text
    data = sys.stdin.buffer.read(MAX_STDIN_BYTES + 1)
    if len(data) > MAX_STDIN_BYTES:
        raise PromptError(
            f"the text on stdin is over {MAX_STDIN_BYTES // 2**20} MB: speak it in parts (split the file)"
        )
    return data.decode("utf-8-sig", "surrogateescape")  # -sig: a BOM (Windows editors write one) is no text


def _names_a_file(text: str) -> bool:
    """Whether ``text`` is one word naming a file here ("book.txt": meant as ``- < book.txt``?)."""
    if len(text.split()) != 1:
        return False
    try:
        return Path(text.strip()).is_file()
    except (OSError, ValueError):  # a name too long, a NUL in it: no file
        return False


def print_warnings(warnings) -> None:
    """Print each of ``warnings`` (strings) as one yellow 'warning:' line on stderr."""
    for w in warnings:
        err.print(f"[yellow]warning:[/] {w}", highlight=False)


def check_port(host: str, port: int) -> None:
    """Raise ConfigError unless ``host:port`` (a port the settings took) can be listened on now (serve and wyoming
    check before loading)."""
    import errno
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind((host, port))
    except OSError as e:
        in_use = e.errno in (errno.EADDRINUSE, errno.EACCES)  # taken, or a port below 1024 without root
        remedy = (
            "pick another --port, or stop what uses it"
            if in_use
            else "give --host an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for all)"
        )
        raise ConfigError(f"cannot listen on {host}:{port} ({e.strerror or e}): {remedy}") from None
