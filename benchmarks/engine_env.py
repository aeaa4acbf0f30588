"""Time to a ready fms-hf-tuning environment, and its size on disk.

For each version: a *fresh machine* (an empty uv cache and an empty engines folder: every package is
downloaded from the index) and a *warm* rebuild (the uv cache kept: what a second version, or a
rebuild after a broken environment, costs). Prints one line per build and a Markdown table.

    python benchmarks/engine_env.py [VERSION ...]      (default: 3.2.2 2.1.2)
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tunebench.engines import envs


def _build(version: str, engines: Path, cache: Path) -> tuple[float, float]:
    """(seconds to ready, GiB of the environment) of one build into engines with this uv cache."""
    os.environ["TUNEBENCH_ENGINES_DIR"], os.environ["UV_CACHE_DIR"] = str(engines), str(cache)
    shutil.rmtree(engines, ignore_errors=True)
    started = time.perf_counter()
    engine = envs.ensure(version)
    return time.perf_counter() - started, envs.disk_gib(engine.path)


def main(versions: list[str]) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunebench-engine-bench-") as tmp:
        for version in versions:
            cache = Path(tmp) / f"uv-cache-{version}"  # empty: nothing downloaded yet
            fresh_s, gib = _build(version, Path(tmp) / "engines", cache)
            cache_gib = envs.disk_gib(cache)
            warm_s, _ = _build(version, Path(tmp) / "engines", cache)
            print(
                f"{version}: fresh {fresh_s:.1f} s (downloaded {cache_gib:.2f} GiB into the uv cache), "
                f"warm rebuild {warm_s:.1f} s, environment {gib:.2f} GiB",
                flush=True,
            )
            rows.append((version, fresh_s, warm_s, gib, cache_gib))
    print("\n| fms-hf-tuning | fresh machine (s) | warm uv cache (s) | environment (GiB) | uv cache (GiB) |")
    print("|---|---|---|---|---|")
    for version, fresh_s, warm_s, gib, cache_gib in rows:
        print(f"| {version} | {fresh_s:.1f} | {warm_s:.1f} | {gib:.2f} | {cache_gib:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:] or ["3.2.2", "2.1.2"])
