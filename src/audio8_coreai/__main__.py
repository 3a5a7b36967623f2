"""``python -m audio8_coreai``: the ``audio8`` command."""

from .cli import main

main()
