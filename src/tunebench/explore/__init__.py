"""Exploring entity spaces: space files and their points (grid, random, optimize), the explorer loop and run_space.

    from tunebench.explore import explore, load_space, Settings

Names are imported on first use (PEP 562), so ``tunebench show`` does not pay for the explorer.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Settings": "tunebench.explore.explorer",
    "Summary": "tunebench.explore.explorer",
    "explore": "tunebench.explore.explorer",
    "run_space": "tunebench.explore.run",
    "Space": "tunebench.explore.space",
    "load_space": "tunebench.explore.space",
    "parse_space": "tunebench.explore.space",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
