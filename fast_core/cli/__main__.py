"""``python -m fast_core.cli``: the `fast` command, for environments whose scripts folder is not on PATH."""

from fast_core.cli import main

main()
