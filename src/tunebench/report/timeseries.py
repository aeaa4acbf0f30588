"""The report's time series of one result: utilisation and memory over time, the loss curve.

The result is the one asked for (``tunebench report --series RESULT_ID``), else the latest result of the
report that has series (tunebench.store.series). The memory figure carries the planner's predicted peak
memory (gpu_memory_peak_gib, GiB per GPU) as a horizontal line: the predict actuator's stored prediction
for the same experiment and entity where the store has one, else the planner run on the entity now.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from tunebench.report.planner import predicted_peak_gib
from tunebench.report.plots import MAX_POINTS, Plot, _figure, _scatter
from tunebench.store import Store
from tunebench.store.series import long_frame, no_series_reason

PEAK = "gpu_memory_peak_gib"  # the planner's peak memory per GPU in GiB, what nvidia-smi would show
UTILISATION = ("compute_utilization", "memory_utilization", "cpu_percent", "node_memory_percent")  # % series
MEMORY_GIB = ("memory_used_gib", "rss_gib")  # GiB series: a GPU's memory in use; on CPU runs, the process's
PREDICTED_LINE = {"dash": "dash", "color": "#ff7f0e", "width": 2}


def pick_result(store: Store, result_ids: list[int], asked: int | None) -> int | None:
    """The result to draw: the one asked for (UnknownResult if the store lacks it), else the latest of
    result_ids that has series; None when none has."""
    if asked is not None:
        store.result_info(asked)  # UnknownResult before anything is drawn
        return int(asked)
    with_series = set(store.series_result_ids()) & {int(r) for r in result_ids if pd.notna(r)}
    return max(with_series) if with_series else None


def series_plots(store: Store, result_id: int | None) -> list[Plot]:
    """The figures of one result's series (utilisation, memory, loss), or one Plot saying why there are none."""
    if result_id is None:
        return [
            Plot(
                "series",
                "Time series",
                "Nothing to draw: no result of this report has time series "
                "(measurements keep them; predictions and imported results have none).",
            )
        ]
    info = store.result_info(result_id)
    data = store.series_of(result_id)
    if not data:
        return [Plot("series", "Time series", f"Nothing to draw: {no_series_reason(info)}.")]
    frame = long_frame(data)
    who = f"result {result_id} ({info['actuator']}, {info['status']}): {info['entity_id']}"
    peak, source = predicted_peak_gib(store, info)
    return [
        utilisation_plot(frame, who, data.get("warmup_end_s")),
        memory_plot(frame, who, peak, source, data.get("warmup_end_s")),
        loss_plot(frame, who),
    ]


def _traces(frame: pd.DataFrame, suffixes: tuple[str, ...]) -> list[dict[str, Any]]:
    """One line per series whose name ends with one of suffixes (time_s against value), subsampled."""
    out = []
    for name, part in frame.groupby("series", sort=True):
        if str(name).rsplit(".", 1)[-1] in suffixes:
            part = _every(part)
            out.append(_scatter(_r(part["time_s"]), _r(part["value"]), str(name), mode="lines"))
    return out


def _every(part: pd.DataFrame) -> pd.DataFrame:
    """At most MAX_POINTS evenly spaced rows (the last one kept: where the run ended)."""
    if len(part) <= MAX_POINTS:
        return part
    keep = np.unique(np.linspace(0, len(part) - 1, MAX_POINTS).round().astype(int))
    return part.iloc[keep]


def _r(values: pd.Series) -> list[float | None]:
    """Numbers to 6 significant digits (smaller HTML), NaN as None."""
    return [None if math.isnan(v) else float(f"{v:.6g}") for v in values.astype(float).tolist()]


def _warmup(fig: dict[str, Any], warmup_end_s: float | None) -> None:
    if warmup_end_s is not None:
        fig["layout"]["shapes"] = [
            {
                "type": "line",
                "xref": "x",
                "yref": "paper",
                "x0": warmup_end_s,
                "x1": warmup_end_s,
                "y0": 0,
                "y1": 1,
                "line": {"dash": "dot", "color": "#7f7f7f"},
            }
        ]


def utilisation_plot(frame: pd.DataFrame, who: str, warmup_end_s: float | None = None) -> Plot:
    """GPU compute and memory utilisation, the process's CPU % and the node's memory % over time."""
    key, title = "series-utilisation", "Utilisation over time"
    traces = _traces(frame, UTILISATION)
    if not traces:
        return Plot(key, title, f"Nothing to draw: {who} has no utilisation series.")
    fig = _figure(traces, "time since the first sample (s)", "%")
    _warmup(fig, warmup_end_s)
    caption = (
        f"{who}: each GPU's compute and memory utilisation (NVML, %), the training process tree's CPU use "
        "(100 = one core) and the node's memory in use (%), as sampled; the measured gpu_* and cpu_* "
        "properties are their time-averages" + (" after the warm-up (dotted line)." if warmup_end_s else ".")
    )
    return Plot(key, title, caption, fig)


def memory_plot(
    frame: pd.DataFrame, who: str, peak: float | None, source: str, warmup_end_s: float | None = None
) -> Plot:
    """Memory in use over time (each GPU's, or the process's on a CPU run) and the predicted peak as a line."""
    key, title = "series-memory", "Memory over time"
    gpu = _traces(frame, ("memory_used_gib",))
    traces = gpu or _traces(frame, ("rss_gib",))
    if not traces:
        return Plot(key, title, f"Nothing to draw: {who} has no memory series.")
    what = "each GPU's memory in use (NVML)" if gpu else "the training process tree's resident memory (a CPU run)"
    if peak is not None:
        x = [min(t["x"][0] for t in traces), max(t["x"][-1] for t in traces)]
        traces.append(
            _scatter(
                x, [peak, peak], f"planner: predicted peak {peak:.3g} GiB ({source})", mode="lines", line=PREDICTED_LINE
            )
        )
    fig = _figure(traces, "time since the first sample (s)", "GiB")
    _warmup(fig, warmup_end_s)
    predicted = (
        f"; the dashed line is the planner's predicted peak memory per GPU ({PEAK}, {peak:.3g} GiB) from the {source}"
        if peak is not None
        else f"; no predicted peak: {source}"
    )
    if peak is not None and not gpu:
        predicted += (
            " (on a CPU the planner sizes the training state: weights, gradients, optimizer states and "
            "activations, not the interpreter and libraries that resident memory also counts)"
        )
    return Plot(key, title, f"{who}: {what}, in GiB{predicted}.", fig)


def loss_plot(frame: pd.DataFrame, who: str) -> Plot:
    """The training loss per step (and the learning rate on a second axis)."""
    key, title = "series-loss", "Loss curve"
    loss = frame[frame["series"] == "train.loss"]
    if loss.empty:
        return Plot(key, title, f"Nothing to draw: {who} logged no training loss.")
    loss = _every(loss)
    traces = [_scatter(loss["step"].astype(float).tolist(), _r(loss["value"]), "train.loss", mode="lines+markers")]
    rate = _every(frame[frame["series"] == "train.learning_rate"])
    if not rate.empty:
        traces.append(
            _scatter(
                rate["step"].astype(float).tolist(),
                _r(rate["value"]),
                "train.learning_rate",
                mode="lines",
                yaxis="y2",
                line={"dash": "dot"},
            )
        )
    fig = _figure(traces, "training step", "loss")
    fig["layout"]["yaxis2"] = {
        "title": {"text": "learning rate"},
        "overlaying": "y",
        "side": "right",
        "showgrid": False,
    }
    caption = f"{who}: the training loss the Trainer logged at each step (the learning rate dotted, right axis)."
    return Plot(key, title, caption, fig)
