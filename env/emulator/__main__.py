"""``python -m env.emulator``: see :mod:`env.emulator.cli`."""

from env.emulator.cli import main

main()
