"""``python -m audio8_coreai.cli``: the ``audio8`` command."""

from . import main

main()
