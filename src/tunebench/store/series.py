"""A measurement's time series in the store: one compressed blob per result, read back in long format.

``Result.series`` (tunebench.worker.series: per GPU, per process, per training step) is written with its
result into the ``series`` table as zlib-compressed JSON (ENCODING), keyed by the result's id. Listings
(``show``, ``report``'s table, ``export``) never read or join that table, so they cost the same with or
without series; one result's series is one primary-key read and one decompression.

    from tunebench.store import Store
    from tunebench.store.series import read_series
    frame = read_series(Store("runs.db"), 7)   # columns series, step, time_s, value

A result without series (a prediction, an import, a run that never started) reads as an empty frame.
"""

from __future__ import annotations

import csv
import json
import math
import zlib
from typing import IO, TYPE_CHECKING, Any

from sqlalchemy import Connection, insert, select

from tunebench.store.schema import series as series_table

if TYPE_CHECKING:
    import pandas as pd

    from tunebench.store.reads import Reads

ENCODING = "zlib+json"  # the series table's format column: zlib (RFC 1950) over UTF-8 JSON
COLUMNS = ("series", "step", "time_s", "value")  # the long format
ZLIB_LEVEL = 6  # zlib's default: within ~5% of level 9's size, several times faster


class UnknownResult(LookupError):
    """No result with this id in the store."""

    def __init__(self, result_id: int, ids: tuple[int, int, int] | None):
        self.result_id = result_id
        self.ids = ids  # (smallest id, largest id, count) of the store's results; None: it has none
        super().__init__(f"no result {result_id}")

    def allowed(self) -> str:
        """The ids the store holds, for the one-line error."""
        if self.ids is None:
            return "none: the store has no results yet"
        low, high, count = self.ids
        return (
            f"one of the store's {count:,} result ids, {low}..{high} (the result_id column of "
            "`tunebench show --repeats --format csv`)"
        )


def encode(series: dict[str, Any]) -> bytes:
    """The blob of a series dict (NaN and infinities kept: a diverged loss is a measurement too)."""
    text = json.dumps(series, separators=(",", ":"), default=str)
    return zlib.compress(text.encode(), ZLIB_LEVEL)


def decode(data: bytes, encoding: str = ENCODING) -> dict[str, Any]:
    if encoding != ENCODING:
        raise ValueError(f"series stored as {encoding!r}, which this tunebench cannot read (it reads {ENCODING})")
    return json.loads(zlib.decompress(bytes(data)))


def points(series: dict[str, Any]) -> int:
    """Values in every series of a series dict."""
    return sum(len(s.get("value") or ()) for s in (series.get("series") or {}).values())


def insert_series(conn: Connection, result_id: int, series: dict[str, Any]) -> None:
    """Store a result's series (in the transaction that stores the result)."""
    conn.execute(
        insert(series_table).values(result_id=result_id, format=ENCODING, points=points(series), data=encode(series))
    )


def stored_series(conn: Connection, result_id: int) -> dict[str, Any] | None:
    """The series dict stored for a result; None when it has none."""
    row = conn.execute(
        select(series_table.c.format, series_table.c.data).where(series_table.c.result_id == result_id)
    ).first()
    return None if row is None else decode(row.data, row.format)


def long_frame(series: dict[str, Any] | None) -> pd.DataFrame:
    """A series dict in long format: one row per value, columns series (e.g. gpu0.compute_utilization,
    process.cpu_percent, train.loss), step (training step, nullable Int64: None for sampled series),
    time_s (float s since the run's first sample) and value (float); ordered by series name, then time."""
    import pandas as pd

    names, steps, times, values = [], [], [], []
    for name in sorted((series or {}).get("series") or {}):
        entry = series["series"][name]
        n = len(entry["value"])
        names += [name] * n
        steps += entry.get("step") or [None] * n
        times += entry["time_s"]
        values += entry["value"]
    return pd.DataFrame(
        {
            "series": pd.Series(names, dtype=object),
            "step": pd.Series(steps, dtype="Int64"),
            "time_s": pd.Series(times, dtype=float),
            "value": pd.Series(values, dtype=float),
        }
    )


def read_series(store: Reads, result_id: int) -> pd.DataFrame:
    """The time series of one stored result in long format (``long_frame``); UnknownResult when the store has
    no result with that id; an empty frame for a result without series (``frame.attrs``: result_id,
    warmup_end_s: the time_s where the auto-stop warm-up ended, None without one; gpus: [{series, id, node}])."""
    data = store.series_of(result_id)
    frame = long_frame(data)
    frame.attrs.update(
        result_id=int(result_id), warmup_end_s=(data or {}).get("warmup_end_s"), gpus=(data or {}).get("gpus") or []
    )
    return frame


def summary(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per series of a long frame: points, first and last time_s, min, mean, max and last value
    (what `show --series` prints at the terminal; csv and json hold every point)."""
    out = []
    for name, part in frame.groupby("series", sort=True):
        values = part["value"]
        out.append(
            {
                "series": name,
                "points": len(part),
                "from_s": float(part["time_s"].iloc[0]),
                "to_s": float(part["time_s"].iloc[-1]),
                "min": _finite(values.min()),
                "mean": _finite(values.mean()),
                "max": _finite(values.max()),
                "last": _finite(values.iloc[-1]),
            }
        )
    return out


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """A long frame's rows as JSON-ready dicts (step None for sampled series; a non-finite value None)."""
    import pandas as pd

    steps = [None if v is pd.NA else int(v) for v in frame["step"].tolist()]
    return [
        {"series": name, "step": step, "time_s": t, "value": v if math.isfinite(v) else None}
        for name, step, t, v in zip(frame["series"].tolist(), steps, frame["time_s"].tolist(), frame["value"].tolist())
    ]


def write(frame: pd.DataFrame, fmt: str, out: IO[str]) -> None:
    """Every point of a long frame as csv (a header line, an empty step for sampled series, floats in
    shortest repr) or json (a list of records)."""
    rows = records(frame)
    if fmt == "json":
        json.dump(rows, out, indent=1)
        out.write("\n")
        return
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(["" if v is None else v for v in (r["series"], r["step"], r["time_s"], r["value"])] for r in rows)


def no_series_reason(info: dict[str, Any]) -> str:
    """Why a result (Reads.result_info) has no time series, in one line."""
    head = f"result {info['result_id']} ({info['actuator']}, {info['status']}) has no time series"
    if info["actuator"] == "predict":
        return f"{head}: a prediction samples nothing (the planner's numbers are its properties)"
    if info["actuator"] == "import":
        return f"{head}: imported results keep only their properties"
    if info["status"] != "valid":
        return f"{head}: it never trained (invalid by a rule, or it failed before its first sample)"
    return f"{head}: it was recorded without one (by an older tunebench, or an actuator that keeps none)"


def _finite(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
