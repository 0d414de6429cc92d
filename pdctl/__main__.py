"""``python -m pdctl``."""

from pdctl.cli import main

main()
