"""Values as tunebench writes them to JSON: strict JSON has no NaN or infinity, so a metric that
could not be computed is null (RFC 8259 section 6: "Numeric values that cannot be represented ... such as
Infinity and NaN are not permitted")."""

from __future__ import annotations

import math
from typing import Any


def finite(obj: Any) -> Any:
    """obj with every NaN or infinite float (in nested dicts, lists and tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
