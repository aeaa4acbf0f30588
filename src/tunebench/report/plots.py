"""The report's figures: one function per figure, each returning Plot(s) with a caption.

A figure is a plotly figure as a plain dict ({"data": [traces], "layout": {...}}, plotly.js's own
schema): building plotly.graph_objects validates every value and costs seconds for a report of
10,000 results. A figure with nothing to draw is a Plot whose ``figure`` is None and whose caption
says why. Above MAX_POINTS points a figure shows an evenly spaced subsample and its caption says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tunebench.report.data import CPU, SOURCES, ReportData
from tunebench.report.planner import boundary
from tunebench.spec.properties import PROPERTIES

MAX_POINTS = 1_500  # points per figure: ~150 kB of HTML each; more make the file heavy and the browser slow
MAX_BOUNDARY_GROUPS = 4  # OOM-boundary figures: the groups with the most points
MAX_STABILITY_BARS = 60
MEMORY = ("gpu_memory_peak_gib", "gpu_memory_reserved_peak_gib", "gpu_memory_allocated_peak_gib",
          "gpu_memory_utilization_peak")  # fmt: skip
THROUGHPUT = ("dataset_tokens_per_second", "train_tokens_per_second")
UNITS = {"gpu_memory_peak_gib": "GiB per GPU", "gpu_memory_reserved_peak_gib": "GiB per GPU",
         "gpu_memory_allocated_peak_gib": "GiB per GPU", "gpu_memory_utilization_peak": "% of GPU memory",
         "dataset_tokens_per_second": "tokens/s", "train_tokens_per_second": "tokens/s",
         "train_runtime": "s", "gpu_hours": "GPU-hours", "cost": "USD at catalog prices"}  # fmt: skip
COLORS = {"measured": "#1f77b4", "predicted": "#ff7f0e", "test": "#8c564b", "fits": "#2ca02c",
          "out of memory": "#d62728", "invalid by rule": "#7f7f7f", "invalid": "#9467bd",
          "failed": "#000000"}  # fmt: skip
# Marker symbols of the precisions a figure holds (data.precision), in the order of their names: bfloat16 and
# float32 runs of one source share its colour and differ in symbol.
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "cross", "x", "star-triangle-up", "hexagon", "pentagon")
MAX_TICKS = 12  # tick labels on an axis of integers: its values when they are this few, else evenly spaced ones
TEST_NOTE = (
    " Results of test actuators (noop, which measures nothing, and module:function actuators) are labelled "
    "'test', never 'measured'."
)
ERROR_SCALE = [[0.0, "#1a9850"], [0.2, "#91cf60"], [0.5, "#fee08b"], [1.0, "#d73027"]]  # |error| 0 .. 50 %
STABILITY = (("f_no_error", "no error", "#2ca02c"), ("f_gpu_oom", "GPU out of memory", "#d62728"),
             ("f_other_error", "other error", "#7f7f7f"))  # fmt: skip


@dataclass
class Plot:
    """A figure (None: nothing to draw) and the caption saying what it shows."""

    key: str
    title: str
    caption: str
    figure: Any | None = None


def _label(name: str) -> str:
    return f"{name} ({UNITS[name]})" if name in UNITS else name


def _subsample(frame: pd.DataFrame, limit: int | None = None) -> tuple[pd.DataFrame, str]:
    """At most limit (default MAX_POINTS) rows, evenly spaced; and the caption's note when rows were left out."""
    limit = MAX_POINTS if limit is None else limit
    if len(frame) <= limit:
        return frame, ""
    step = int(np.ceil(len(frame) / limit))
    kept = frame.iloc[::step]
    return kept, f" Showing {len(kept):,} of {len(frame):,} points (one in every {step}, evenly subsampled)."


def _text(value: Any) -> str:
    """A cell as text: missing values (None, NaN) as ''."""
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _hover(frame: pd.DataFrame, dims: list[str]) -> list[str]:
    """Short hover labels: the swept dimensions' values (not the long entity ids)."""
    names = [d for d in dims if d in frame.columns]
    cols = [[_text(v) for v in frame[d].tolist()] for d in names]
    if not cols:
        return frame["base_id"].tolist()
    return [", ".join(f"{n}={v}" for n, v in zip(names, vals)) for vals in zip(*cols)]


def _scatter(x: list, y: list, name: str, **kw: Any) -> dict[str, Any]:
    return {"type": "scatter", "x": x, "y": y, "name": name, "mode": "markers", **kw}


def _figure(traces: list[dict[str, Any]], xaxis: str, yaxis: str, **layout: Any) -> dict[str, Any]:
    return {
        "data": traces,
        "layout": {"xaxis": {"title": {"text": xaxis}}, "yaxis": {"title": {"text": yaxis}}, **layout},
    }


def _r(values: Any) -> list[Any]:
    """Numbers rounded to 5 significant digits (smaller HTML), NaN -> None."""
    out = []
    for v in pd.to_numeric(pd.Series(values), errors="coerce").tolist():
        out.append(None if v != v else float(f"{v:.5g}"))
    return out


def _symbols(frame: pd.DataFrame) -> dict[str, str]:
    """Precision -> marker symbol, for the precisions of frame's rows (SYMBOLS in the order of their names)."""
    names = sorted({str(p) for p in frame["precision"].dropna()}) if "precision" in frame.columns else []
    return {name: SYMBOLS[i % len(SYMBOLS)] for i, name in enumerate(names)}


def _by_precision(rows: pd.DataFrame, source: str, symbols: dict[str, str]) -> list[tuple[str, pd.DataFrame, str]]:
    """(trace name, rows, marker symbol) per precision of a source's rows; the name is the source alone when
    the figure holds one precision."""
    if len(symbols) <= 1 or "precision" not in rows.columns:
        return [(source, rows, next(iter(symbols.values()), "circle"))]
    return [
        (f"{source}, {name}", rows[rows["precision"] == name], symbol)
        for name, symbol in symbols.items()
        if (rows["precision"] == name).any()
    ]


def _on_gpus(frame: pd.DataFrame, what: str, holding: tuple[str, ...] = ()) -> tuple[pd.DataFrame, str]:
    """The rows of runs on GPUs, and the caption's note on the CPU runs left out (they have no GPU memory:
    drawn, they would sit at 0 GiB and lead every memory front); the note counts those holding every
    property of holding (what the figure would have drawn)."""
    if "number_gpus" not in frame.columns:
        return frame, ""
    gpus = pd.to_numeric(frame["number_gpus"], errors="coerce") > 0
    drawn = pd.Series(True, index=frame.index)
    for name in holding:
        drawn &= frame[name].notna() if name in frame.columns else False
    left = int((~gpus & drawn).sum())
    note = (
        f" {left:,} CPU result{'s are' if left > 1 else ' is'} left out of the {what}: a run without GPUs "
        "has no GPU memory."
        if left
        else ""
    )
    return frame[gpus], note


def is_integer(name: str) -> bool:
    """Whether a property takes integers (the spec's kind int): its axis gets integer ticks."""
    return name in PROPERTIES and PROPERTIES[name].kind == "int"


def integer_ticks(values: Any, log: bool = False) -> dict[str, Any]:
    """Axis settings that label integers in full: the values themselves when at most MAX_TICKS, else
    MAX_TICKS - 2 evenly spaced (geometrically on a log axis) integers, no 1.5 or 2.5 between them, no
    log axis's '2 5' shorthand for 2,000 and 5,000."""
    nums = sorted(
        {int(v) for v in pd.to_numeric(pd.Series(list(values)), errors="coerce").dropna() if v >= (1 if log else 0)}
    )
    if not nums:
        return {}
    if len(nums) > MAX_TICKS:
        spaced = (
            np.geomspace(nums[0], nums[-1], MAX_TICKS - 2) if log else np.linspace(nums[0], nums[-1], MAX_TICKS - 2)
        )
        nums = sorted({min(nums, key=lambda n, t=t: abs(n - t)) for t in spaced})
    return {"tickmode": "array", "tickvals": nums, "ticktext": [str(n) for n in nums]}


def _axis_values(frame: pd.DataFrame, dim: str) -> tuple[list[Any], dict[str, Any]]:
    """A dimension's values for an x axis and the axis settings: integers with integer ticks, numbers as
    they are, everything else (GPU models, dtypes, flags) as categories, a missing value named 'None'."""
    values = frame[dim].tolist()
    numeric = (
        PROPERTIES[dim].kind in ("int", "float")
        if dim in PROPERTIES
        else all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None)
    )
    if numeric:
        xs = [None if v is None or v != v else v for v in values]
        return xs, integer_ticks(xs) if is_integer(dim) else {}
    return ["None" if v is None or v != v else str(v) for v in values], {"type": "category"}


def predicted_vs_measured(data: ReportData, planned: pd.DataFrame) -> list[Plot]:
    """Predicted (x) against measured (y) peak memory and throughput, y = x drawn, error in the hover."""
    valid = data.frame[data.frame["status"] == "valid"]
    measured = valid[valid["source"] == "measured"]
    tests = int((valid["source"] == "test").sum())
    test_note = (
        (
            f" {tests:,} valid result{'s' if tests > 1 else ''} of test actuators (noop, module:function) "
            "are not measurements and are left out."
        )
        if tests
        else ""
    )
    out = []
    for kind, names in (("memory", MEMORY), ("throughput", THROUGHPUT)):
        key, title = f"predicted-vs-measured-{kind}", f"Predicted vs measured {kind}"
        pairs, name = _pairs(measured, planned, names, gpu_only=kind == "memory")
        if pairs is None:
            why = (
                "the store has no measurements yet (predictions only)"
                if measured.empty
                else f"no measured {kind} property ({', '.join(names)}) has a planner prediction"
            )
            out.append(Plot(key, title, f"Nothing to compare: {why}.{test_note}"))
            continue
        shown, note = _subsample(pairs)
        error = (shown[f"predicted_{name}"] - shown[name]) / shown[name] * 100
        hover = [f"{h}<br>error {e:+.1f}%" for h, e in zip(_hover(shown, data.dims), error.tolist())]
        shown = shown.assign(_hover=hover, _error=error)
        symbols = _symbols(shown)
        points = [
            _scatter(
                _r(part[f"predicted_{name}"]),
                _r(part[name]),
                label.replace("measured", "measurements", 1),
                text=part["_hover"].tolist(),
                hoverinfo="text+x+y",
                marker={
                    "color": _r(part["_error"].abs()),
                    "colorscale": ERROR_SCALE,
                    "cmin": 0,
                    "cmax": 50,
                    "colorbar": {"title": {"text": "|error| %"}},
                    "size": 8,
                    "symbol": symbol,
                    "showscale": i == 0,
                },
            )
            for i, (label, part, symbol) in enumerate(_by_precision(shown, "measured", symbols))
        ]
        top = float(max(pairs[name].max(), pairs[f"predicted_{name}"].max()))
        diagonal = _scatter(
            [0, top], [0, top], "prediction = measurement", mode="lines", line={"dash": "dash", "color": "#7f7f7f"}
        )
        fig = _figure([*points, diagonal], f"predicted {_label(name)}", f"measured {_label(name)}")
        all_err = ((pairs[f"predicted_{name}"] - pairs[name]) / pairs[name] * 100).abs()
        cpu = ""
        if kind == "memory" and "number_gpus" in valid.columns:
            cpu = _on_gpus(measured, "memory comparison", (name,))[1]
        caption = (
            f"The planner's prediction (made now, current calibration) against the measurement of {name} "
            f"for {len(pairs):,} measured entities; points on the dashed line are exact, colour is the "
            f"absolute error{', symbol the precision' if len(symbols) > 1 else ''}. Median |error| "
            f"{all_err.median():.1f}%, 90th percentile {all_err.quantile(0.9):.1f}%.{note}{cpu}"
            f"{test_note}"
        )
        out.append(Plot(key, title, caption, fig))
    return out


def _pairs(measured: pd.DataFrame, planned: pd.DataFrame, names: tuple[str, ...], gpu_only: bool):
    """(measured rows joined with their predictions, property) for the first property with pairs."""
    if measured.empty or planned.empty:
        return None, None
    joined = measured.join(planned, how="inner")
    if gpu_only and "number_gpus" in joined.columns:
        joined = joined[pd.to_numeric(joined["number_gpus"], errors="coerce") > 0]
    for name in names:
        if name in joined.columns and f"predicted_{name}" in joined.columns:
            pairs = joined[(joined[name] > 0) & joined[f"predicted_{name}"].notna()]
            if not pairs.empty:
                return pairs, name
    return None, None


def pareto(data: ReportData) -> Plot:
    """Throughput against peak memory per valid row, and the front of what no other row beats on both."""
    key, title = "pareto", "Throughput vs peak memory"
    valid, cpu = _on_gpus(data.frame[data.frame["status"] == "valid"], "memory axis")
    mem, rate = _best_pair(valid)
    if mem is not None and rate is not None:
        cpu = _on_gpus(data.frame[data.frame["status"] == "valid"], "memory axis", (mem, rate))[1]
    if mem is None or rate is None:
        return Plot(
            key, title, f"Nothing to draw: no valid result on GPUs has both a peak memory and a throughput.{cpu}"
        )
    traces, notes = [], []
    symbols = _symbols(valid[valid[mem].notna() & valid[rate].notna()])
    for source in SOURCES:
        rows = valid[(valid["source"] == source) & valid[mem].notna() & valid[rate].notna()]
        if rows.empty:
            continue
        front = pareto_front(rows[mem].to_numpy(float), rows[rate].to_numpy(float))
        shown, note = _subsample(rows)
        notes.append(note)
        for name, part, symbol in _by_precision(shown, source, symbols):
            traces.append(
                _scatter(
                    _r(part[mem]),
                    _r(part[rate]),
                    name,
                    text=_hover(part, data.dims),
                    legendgroup=source,
                    marker={"color": COLORS[source], "opacity": 0.6, "symbol": symbol},
                )
            )
        best = rows.iloc[front]
        traces.append(
            _scatter(
                _r(best[mem]),
                _r(best[rate]),
                f"Pareto front ({source}, {len(best)})",
                mode="lines+markers",
                line={"color": COLORS[source], "width": 3, "shape": "hv"},
                text=_hover(best, data.dims),
                marker={"size": 10, "symbol": "star"},
            )
        )
    fig = _figure(traces, f"peak {_label(mem)}", _label(rate))
    precisions = f" Symbols tell the precision ({', '.join(symbols)})." if len(symbols) > 1 else ""
    caption = (
        f"Each valid result's {rate} against its {mem}; the line joins the Pareto front: results that no "
        f"other result beats with both less memory and more throughput (measured, predicted and test "
        f"results have separate fronts).{precisions}{''.join(notes)}{cpu}"
    )
    return Plot(key, title, caption, fig)


def _best_pair(valid: pd.DataFrame) -> tuple[str | None, str | None]:
    """(memory, throughput) properties that the most measured rows hold both of (then the most rows of any source)."""
    best, score = (None, None), (0, 0)
    measured = valid["source"] == "measured"
    for mem in MEMORY:
        for rate in THROUGHPUT:
            if mem in valid.columns and rate in valid.columns:
                both = valid[mem].notna() & valid[rate].notna()
                if (int((both & measured).sum()), int(both.sum())) > score:
                    best, score = (mem, rate), (int((both & measured).sum()), int(both.sum()))
    return best


def pareto_front(memory: np.ndarray, rate: np.ndarray) -> list[int]:
    """Positions of the points with no other point at <= memory and > rate (or < memory and >= rate)."""
    order = np.lexsort((-rate, memory))  # by memory, then the best rate first
    front, best = [], -np.inf
    for i in order:
        if rate[i] > best:
            front.append(int(i))
            best = rate[i]
    return front


def oom_boundaries(data: ReportData) -> list[Plot]:
    """Outcome over (batch_size, model_max_length) per group (experiment, model, GPUs), planner's boundary on it."""
    frame = data.frame
    needed = {"batch_size", "model_max_length", "model_name", "number_gpus"}
    if frame.empty or not needed <= set(frame.columns):
        return [Plot("oom-boundary", "Out-of-memory boundary", "Nothing to draw: the store has no results.")]
    # what ran (measured or test rows, each labelled as such) where the store has any, else the predictions
    ran = frame["source"] != "predicted"
    rows = frame[(ran if ran.any() else ~ran) & frame["status"].isin(["valid", "invalid"])]
    group_cols = [c for c in ("experiment_id", "model_name", "number_gpus", "gpu_model") if c in rows.columns]
    texts = [[_text(v) for v in rows[c].tolist()] for c in group_cols]
    keys = pd.Series(
        [
            ", ".join(f"{c}={t}" for c, t in zip(group_cols, parts) if t and c != "experiment_id") + f" ({parts[0]})"
            for parts in zip(*texts)
        ],
        index=rows.index,
        dtype=object,
    )
    groups = keys.value_counts()
    groups = groups[groups >= 2].index[:MAX_BOUNDARY_GROUPS]
    if len(groups) == 0:
        return [
            Plot(
                "oom-boundary",
                "Out-of-memory boundary",
                "Nothing to draw: no model and GPU setting has two or more results.",
            )
        ]
    return [_boundary_plot(rows[keys == g], g, n, data.dims) for n, g in enumerate(groups)]


def _boundary_plot(rows: pd.DataFrame, group: str, n: int, dims: list[str]) -> Plot:
    traces = []
    shown, note = _subsample(rows)
    sources = [s for s in SOURCES if (rows["source"] == s).any()]
    for source in sources:
        for kind in ("fits", "out of memory", "invalid by rule", "invalid"):
            part = shown[(shown["outcome"] == kind) & (shown["source"] == source)]
            if not part.empty:
                symbol = "circle" if kind == "fits" else "x"
                traces.append(
                    _scatter(
                        _r(part["batch_size"]),
                        _r(part["model_max_length"]),
                        f"{source}: {kind}",
                        text=_hover(part, dims),
                        marker={
                            "color": COLORS[kind],
                            "size": 11,
                            "symbol": symbol if source != "test" else f"{symbol}-open",
                        },
                    )
                )
    first = rows.iloc[0]
    others = {k: v for k, v in first["_entity"].items() if k not in ("batch_size", "model_max_length")}
    batches = sorted({int(b) for b in pd.to_numeric(rows["batch_size"]).tolist() if b >= 1})  # 0 breaks a rule
    lengths = sorted({int(v) for v in pd.to_numeric(rows["model_max_length"]).tolist() if v >= 1})
    line = boundary(first["base_id"], first["_parameters"], others, batches, lengths)
    if line:
        traces.append(
            _scatter(
                [b for b, _ in line],
                [v for _, v in line],
                "planner: largest length that fits",
                mode="lines+markers",
                line={"color": "#ff7f0e", "width": 3, "dash": "dot", "shape": "hvh"},
            )
        )
    fig = _figure(traces, "batch_size", "model_max_length (tokens)")
    fig["layout"]["xaxis"].update(type="log", **integer_ticks(batches, log=True))
    fig["layout"]["yaxis"].update(type="log", **integer_ticks(lengths, log=True))
    oom = int((rows["outcome"] == "out of memory").sum())
    what = " and ".join(sources)
    test = TEST_NOTE if "test" in sources else ""
    caption = (
        f"{group}: the {what} outcome of each (batch_size, model_max_length) of this experiment, model and "
        f"GPU setting ({len(rows)} results, {oom} out of memory); the dotted line is the largest "
        f"model_max_length the planner predicts fits at each batch size (points above it are predicted "
        f"not to fit).{test}{note}"
    )
    return Plot(f"oom-boundary-{n}", f"Out-of-memory boundary: {group}", caption, fig)


def property_vs_dimensions(data: ReportData) -> list[Plot]:
    """One figure per measured property: its value against each swept dimension (one panel each)."""
    frame, dims = data.frame, data.dims
    if not dims:
        return [
            Plot(
                "property-vs-dimension",
                "Properties against swept dimensions",
                "Nothing to draw: no dimension takes more than one value among the results.",
            )
        ]
    out, constant = [], []
    for prop in data.properties:
        rows = frame[frame[prop].notna()] if prop in frame.columns else frame.iloc[0:0]
        cpu = ""
        if prop in MEMORY:  # GPU memory: a CPU run has none (its 0 would read as a perfect fit)
            rows, cpu = _on_gpus(rows, "figure", (prop,))
        values = pd.to_numeric(rows[prop], errors="coerce") if not rows.empty else rows
        if rows.empty or values.nunique(dropna=True) < 2:
            constant.append(prop)
            continue
        traces, notes = [], []
        axes = {dim: _axis_values(rows, dim)[1] for dim in dims}  # ticks of every row's values
        symbols = _symbols(rows)
        for source in SOURCES:
            part = rows[rows["source"] == source]
            if part.empty:
                continue
            shown, note = _subsample(part, max(1, MAX_POINTS // len(dims)))
            notes.append(note)
            for name, group, symbol in _by_precision(shown, source, symbols):
                y, hover = _r(group[prop]), _hover(group, dims)
                for col, dim in enumerate(dims, start=1):
                    x = _axis_values(group, dim)[0]
                    traces.append(
                        _scatter(
                            x,
                            y,
                            name,
                            legendgroup=name,
                            showlegend=col == 1,
                            text=hover,
                            xaxis=f"x{col if col > 1 else ''}",
                            yaxis="y",
                            marker={"color": COLORS[source], "opacity": 0.6, "symbol": symbol},
                        )
                    )
        fig = _figure(traces, dims[0], _label(prop))
        fig["layout"].update(_panels(dims, axes))
        precisions = f", precisions in their own symbols ({', '.join(symbols)})" if len(symbols) > 1 else ""
        caption = (
            f"{prop} of each result against each swept dimension ({', '.join(dims)}), measured, predicted "
            f"and test results in their own colours{precisions}. Runs without GPUs have gpu_model "
            f"{CPU}.{''.join(dict.fromkeys(notes))}{cpu}"
        )
        out.append(Plot(f"property-{prop}", f"{prop} against the swept dimensions", caption, fig))
    if constant:
        out.append(
            Plot(
                "property-constant",
                "Properties with one value",
                "Not drawn, the same value in every result: " + ", ".join(constant) + ".",
            )
        )
    return out


def _panels(dims: list[str], settings: dict[str, dict[str, Any]] | None = None, gap: float = 0.03) -> dict[str, Any]:
    """Side-by-side x axes sharing one y axis (what plotly's make_subplots writes), one per dimension, each
    with its settings (an axis's type and ticks: _axis_values). A categorical axis is typed explicitly:
    plotly guesses a type from the first trace on it, and a first trace of CPU runs (no gpu_model) made
    the gpu_model panel a number axis that drew none of the GPU models."""
    width = (1 - gap * (len(dims) - 1)) / len(dims)
    axes = {}
    for i, dim in enumerate(dims):
        start = i * (width + gap)
        axes[f"xaxis{i + 1 if i else ''}"] = {
            "domain": [start, start + width],
            "anchor": "y",
            "title": {"text": dim},
            "automargin": True,
            **(settings or {}).get(dim, {}),
        }
    return axes


def cost(data: ReportData, name: str = "cost") -> Plot:
    """The cost (or GPU-hours) of each run, GPU model against GPU model and method against method."""
    key, what = ("cost", "Cost") if name == "cost" else ("gpu-hours", "GPU-hours")
    title = f"{what} per run: GPU vs GPU, method vs method"
    frame = data.frame
    rows = frame[(frame["status"] == "valid") & frame[name].notna()] if name in frame.columns else frame.iloc[0:0]
    if rows.empty:
        return Plot(
            key,
            title,
            f"Nothing to draw: no result holds {name}. Predictions store gpu_hours for runs on "
            "GPUs and cost where there is a price (the GPU catalog's, or the predict "
            "actuator's price_per_gpu_hour option).",
        )
    traces = []
    for source in SOURCES:
        part = rows[rows["source"] == source]
        for col, dim in enumerate(("gpu_model", "method"), start=1):
            if not part.empty:
                traces.append(
                    {
                        "type": "box",
                        "x": part[dim].astype(str).tolist(),
                        "y": _r(part[name]),
                        "name": source,
                        "legendgroup": source,
                        "showlegend": col == 1,
                        "boxpoints": "all",
                        "jitter": 0.4,
                        "pointpos": 0,
                        "text": _hover(part, data.dims),
                        "marker": {"color": COLORS[source], "size": 5},
                        "line": {"color": COLORS[source]},
                        "xaxis": f"x{col if col > 1 else ''}",
                        "yaxis": "y",
                    }
                )
    fig = _figure(traces, "gpu_model", _label(name), boxmode="group")
    fig["layout"].update(
        _panels(["gpu_model", "method"], {"gpu_model": {"type": "category"}, "method": {"type": "category"}}, gap=0.08)
    )
    medians = "; ".join(
        f"{dim}: " + ", ".join(f"{k} {v:.3g}" for k, v in rows.groupby(dim)[name].median().items())
        for dim in ("gpu_model", "method")
    )
    unit = (
        "in USD at the GPU catalog's on-demand list price; in the currency of the predict actuator's "
        "price_per_gpu_hour option where a space gave one"
        if name == "cost"
        else "train_runtime x number_gpus / 3600"
    )
    caption = (
        f"The {name} of each of {len(rows):,} valid results ({unit}), by GPU model (left) and by method "
        f"(right): each point a run, the box its quartiles. Median per run: {medians}. Measured results "
        f"store no {name}; the planner's predictions do."
    )
    return Plot(key, title, caption, fig)


def stability(data: ReportData) -> Plot:
    """Per stability entity: the fractions of repetitions with no error, a GPU OOM, another error (stacked)."""
    key, title = "stability", "Stability: outcomes of repeated runs"
    frame = data.frame
    if "f_gpu_oom" not in frame.columns or frame["f_gpu_oom"].notna().sum() == 0:
        return Plot(
            key,
            title,
            "Nothing to draw: no result of the stability experiment "
            "(finetune_full_stability, properties f_gpu_oom, f_other_error, f_no_error).",
        )
    rows = frame[frame["f_gpu_oom"].notna()].sort_values(["f_gpu_oom", "f_other_error"], ascending=False)
    note = ""
    if len(rows) > MAX_STABILITY_BARS:
        note = f" Showing the {MAX_STABILITY_BARS} least stable of {len(rows)} entities."
        rows = rows.iloc[:MAX_STABILITY_BARS]
    labels = [h.split("<br>", 1)[-1] or e for h, e in zip(_hover(rows, data.dims), rows["entity_id"])]
    labels = [f"{i + 1}. {t}" for i, t in enumerate(labels)]  # unique, in order
    traces = [
        {
            "type": "bar",
            "y": labels,
            "x": _r(rows[name].fillna(0)),
            "name": label,
            "orientation": "h",
            "marker": {"color": color},
            "hovertext": rows["entity_id"].tolist(),
            "hoverinfo": "text+x",
        }
        for name, label, color in STABILITY
        if name in rows.columns
    ]
    fig = _figure(traces, "fraction of repetitions", "", barmode="stack", height=max(300, 24 * len(rows) + 140))
    fig["layout"]["xaxis"]["range"] = [0, 1]
    fig["layout"]["yaxis"].update(autorange="reversed", automargin=True)
    spread = rows["f_gpu_oom"].astype(float)
    caption = (
        f"For each of {len(rows)} entities of the stability experiment, the fraction of its repeated runs "
        f"that finished, ran out of GPU memory, or failed otherwise (least stable first). f_gpu_oom ranges "
        f"{spread.min():.2f}-{spread.max():.2f}: an entity between 0 and 1 sits on the memory edge, "
        f"where the same job sometimes fits.{note}"
    )
    return Plot(key, title, caption, fig)
