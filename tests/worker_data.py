"""Training data for the worker tests: reference-style records of varied length (no data set needed)."""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = "market shares rose after the company reported strong quarterly earnings while analysts expected".split()


def write_data(path: Path, n: int = 48, seed: int = 0, words: list[str] = WORDS) -> Path:
    """Reference-style records {"output": "### Input:\\n... \\n\\n### Response: ..."} of varied length."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            prompt = " ".join(rng.choice(words) for _ in range(rng.randint(3, 20)))
            response = " ".join(rng.choice(words) for _ in range(rng.randint(2, 40)))
            f.write(json.dumps({"output": f"### Input:\n{prompt}\n\n### Response: {response}"}) + "\n")
    return path
