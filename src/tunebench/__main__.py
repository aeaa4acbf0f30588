"""``python -m tunebench``: the same command as ``tunebench``."""

from tunebench.cli import main

if __name__ == "__main__":
    main()
