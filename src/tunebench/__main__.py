"""``python -m tunebench``: the same command as ``tunebench``, with the same exit codes."""

from tunebench.commands.main import main

if __name__ == "__main__":
    raise SystemExit(main())
