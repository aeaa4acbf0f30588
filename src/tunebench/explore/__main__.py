"""``python -m tunebench.explore ARGS`` is ``tunebench ARGS`` (explore, show, import, export, ...)."""

import sys

from tunebench.cli import main

if __name__ == "__main__":
    sys.exit(main())
