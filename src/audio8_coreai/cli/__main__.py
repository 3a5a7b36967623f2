"""``python -m audio8_coreai.cli``: the ``audio8`` command."""

from .app import app

app()
