"""The ``audio8`` command: say | prompt | parity | gate | bench | convert | make-checkpoint | serve | voice (add,
list, show, rm) | wyoming; a module per command group, each registering its commands on :data:`app` (the entry
point)."""

# ruff: noqa: I001, F401  (the imports register the commands; their order is the order `audio8 --help` lists them)
from . import say, prompt, measure, assets, checkpoint, serve, voices
from . import wyoming
from .app import app

__all__ = ["app"]
