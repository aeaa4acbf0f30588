"""The HTML report of a store: ``tunebench report [SPACE] [--store URL] [-o report.html]``.

    from tunebench.report import write_report
    write_report(store, "report.html")              # every result of the store
    write_report(store, "report.html", space=path)  # the points of one space file

data.py reads the results into a tidy table, planner.py asks the planner for predictions and OOM
boundaries, plots.py draws one figure per function, timeseries.py draws one result's time series,
html.py assembles one self-contained file.
plotly is imported only here, when a report is made (``import tunebench`` does not import it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunebench.store import Store


def build_report(store: Store, *, space: str | Path | None = None, series: int | None = None) -> str:
    """The report of a store (or of the points of a space file) as one HTML document.

    series: the result whose time series the report draws (tunebench.store.series.UnknownResult if the
    store has no such result); None: the latest result of the report that has series."""
    from tunebench import __version__
    from tunebench.report import plots
    from tunebench.report.data import load, space_points
    from tunebench.report.html import page
    from tunebench.report.planner import predictions
    from tunebench.report.timeseries import pick_result, series_plots

    if space is not None:
        points, dims, title = space_points(Path(space))
        data = load(store, points=points, dims=dims, title=f"tunebench report — {title}")
    else:
        data = load(store)
    shown = pick_result(store, data.frame["result_id"].tolist(), series)  # before anything slow
    measured = data.frame[(data.frame["source"] == "measured") & (data.frame["status"] == "valid")]
    planned = predictions(measured, [*plots.MEMORY, *plots.THROUGHPUT]) if not measured.empty else None
    sections = [
        ("Predicted vs measured", plots.predicted_vs_measured(data, planned if planned is not None else _empty())),
        ("Throughput vs peak memory", [plots.pareto(data)]),
        ("Out-of-memory boundary", plots.oom_boundaries(data)),
        ("Each property against each swept dimension", plots.property_vs_dimensions(data)),
        ("Stability", [plots.stability(data)]),
        ("Cost", [plots.cost(data, "cost"), plots.cost(data, "gpu_hours")]),
        ("Time series of one result", series_plots(store, shown)),
    ]
    return page(data, sections, version=__version__)


def write_report(
    store: Store, output: str | Path, *, space: str | Path | None = None, series: int | None = None
) -> Path:
    """Write build_report's HTML to output; returns its path."""
    from tunebench.paths import write_atomic

    path = Path(output)
    write_atomic(path, build_report(store, space=space, series=series))
    return path


def _empty():
    import pandas as pd

    return pd.DataFrame()
