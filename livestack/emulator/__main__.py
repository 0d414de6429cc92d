"""``python -m livestack.emulator``: see :mod:`livestack.emulator.cli`."""

from livestack.emulator.cli import main

main()
