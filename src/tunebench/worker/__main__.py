"""``python -m tunebench.worker ARGS``: one measured fine-tuning run (see tunebench.worker)."""

import sys

from tunebench.worker.run import main

if __name__ == "__main__":
    sys.exit(main())
