"""``python -m tunebench``: the same command as ``tunebench``, exit code included."""

import sys

from tunebench.cli import main

if __name__ == "__main__":
    sys.exit(main())
