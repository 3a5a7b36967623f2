"""The ``audio8`` command: say | prompt | parity | gate | bench | convert | make-checkpoint | serve | voice (add,
list, show, rm) | wyoming; a module per command group, each registering its commands on :data:`app` (the entry
point). Importing it reads the settings (settings.py): a wrong ``AUDIO8_*`` variable ends the command with one
'error:' line naming it, and status 2."""

# ruff: noqa: I001, F401  (the imports register the commands; their order is the order `audio8 --help` lists them)
import os
import sys

from ..errors import ConfigError

# Run as the command (its script, or python -m audio8_coreai.cli while the package loads), not imported by a host
# process such as a test runner: Ctrl-Cs are noted from here on (app.listen_for_interrupts).
_COMMAND = os.path.basename(sys.argv[0]) == "audio8" or sys.argv[0] == "-m"

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
except KeyboardInterrupt:  # Ctrl-C while the commands' modules load: said as a command's interruption is
    sys.stderr.write("interrupted\n")
    raise SystemExit(130) from None

__all__ = ["app"]
