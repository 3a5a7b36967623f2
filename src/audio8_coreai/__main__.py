"""``python -m audio8_coreai``: the ``audio8`` command."""

from .cli.app import app

app()
