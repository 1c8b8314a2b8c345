"""``python -m specdec_cli`` is ``specdec``."""
from specdec_cli.cli.main import main

main()
