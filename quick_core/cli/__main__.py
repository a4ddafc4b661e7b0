"""``python -m quickzones.cli``: the same ``quick`` command (``python -m quickzones`` too)."""

from quickzones.cli import main

main()
