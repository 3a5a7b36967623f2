"""The ``audio8`` command: say | prompt | parity | gate | bench | convert | make-checkpoint | serve | voice (add,
list, show, rm) | wyoming; a module per command group, each registering its commands on :data:`app` (the entry
point). Importing it reads the settings (settings.py): a wrong ``AUDIO8_*`` variable ends the command with one
'error:' line naming it, and status 2."""

# ruff: noqa: I001, F401  (the imports register the commands; their order is the order `audio8 --help` lists them)
import os
import sys

from ..errors import ConfigError

# Run as the command (its script; python -m audio8_coreai.cli while the package loads; python -m audio8_coreai, whose
# __main__ loads it), not imported by a host process such as a test runner: Ctrl-Cs are noted from here on
# (app.listen_for_interrupts).
_PACKAGE_MAIN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "__main__.py")
_COMMAND = os.path.basename(sys.argv[0]) == "audio8" or sys.argv[0] in ("-m", _PACKAGE_MAIN)

try:  # the commands read the settings tree (their defaults): a wrong AUDIO8_* variable is said here, in one line
    if _COMMAND:
        from .app import listen_for_interrupts

        listen_for_interrupts()
    from . import say, prompt, measure, assets, checkpoint, serve, voices
    from . import wyoming
    from .app import app
except ConfigError as e:
    sys.stderr.write(f"error: {e}\n")
    raise SystemExit(2) from None
except KeyboardInterrupt:  # Ctrl-C (SIGTERM, SIGHUP) while the commands' modules load: said as a command's interruption
    _app = sys.modules.get(f"{__name__}.app")  # whose handler turns a SIGTERM into this, once it has loaded
    if _app is None:
        sys.stderr.write("interrupted\n")
        raise SystemExit(130) from None
    raise SystemExit(_app.say_interrupted()) from None


def main() -> None:
    """The ``audio8`` command (its script, ``python -m audio8_coreai``): :data:`app`, with a Ctrl-C, SIGTERM or SIGHUP
    that comes before a command's own handling of it (while its options are parsed) said as the interruption it
    is: typer ends such a one silently with 130 (older click: "Aborted!" and 1, or the KeyboardInterrupt itself)."""
    from .app import interruption_unsaid, say_interrupted

    try:
        app()
    except KeyboardInterrupt:
        raise SystemExit(say_interrupted()) from None
    except SystemExit as e:
        if e.code not in (0, None) and interruption_unsaid():
            raise SystemExit(say_interrupted()) from None
        raise


__all__ = ["app", "main"]
