"""One self-contained HTML file: the figures (plotly.js inlined once), the table of results, the environment.

Nothing is fetched when the file opens: plotly.js is written into the first figure's <script>, the
sortable table is a few lines of plain JavaScript over the rows embedded as JSON.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd

from tunebench.report.data import ReportData
from tunebench.report.plots import Plot
from tunebench.spec.measured import shown_columns

TABLE_PAGE = 200  # rows the table shows at once (it sorts and filters all of them)
# Figure titles: at most TITLE_LINES lines of TITLE_CHARS characters (plotly's 17 px title font is ~8.5 px a
# character: 70 fit a figure 640 px wide, a phone turned sideways), each line TITLE_LINE_PX more top margin.
TITLE_CHARS, TITLE_LINES, TITLE_LINE_PX = 70, 2, 22
LEGEND_PER_LINE = 3  # legend entries a line holds in a figure ~640 px wide (each line one TITLE_LINE_PX more)
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}
LAYOUT = {"margin": {"t": 90, "b": 50}, "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "xanchor": "left", "x": 0},
          "hovermode": "closest"}  # fmt: skip

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.8em;border-bottom:1px solid #ddd}
figure{margin:1em 0 2em 0}figcaption{color:#444;font-size:.92em;max-width:60em}
.note{color:#666;font-style:italic}
table{border-collapse:collapse;font-size:.85em}th,td{border:1px solid #ddd;padding:2px 6px;text-align:left;white-space:nowrap}
#environment td{white-space:normal}
th{background:#f4f4f4;cursor:pointer;position:sticky;top:0}th.asc:after{content:" \\25b2"}th.desc:after{content:" \\25bc"}
#results-wrap{max-height:70vh;overflow:auto}td.num{text-align:right;font-variant-numeric:tabular-nums}
"""

# Sort on a header click (numbers as numbers, empty cells last), filter on every cell's text, page by page.
TABLE_JS = """
(function(){
  const data = JSON.parse(document.getElementById('results-data').textContent);
  for (const [i, texts] of Object.entries(data.codes)) {  // repeated texts were stored once: decode them
    for (const r of data.rows) if (r[i] !== null) r[i] = texts[r[i]];
  }
  const table = document.getElementById('results'), body = table.tBodies[0];
  const filter = document.getElementById('results-filter'), info = document.getElementById('results-info');
  const more = document.getElementById('results-more');
  let rows = data.rows, shown = PAGE, sortCol = -1, dir = 1;
  function esc(v){ return String(v).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'})[c]); }
  function render(){
    const out = [];
    for (const r of rows.slice(0, shown)) {
      out.push('<tr>' + r.map(v => v === null ? '<td></td>' :
        (typeof v === 'number' ? '<td class="num">' + v + '</td>' : '<td>' + esc(v) + '</td>')).join('') + '</tr>');
    }
    body.innerHTML = out.join('');
    info.textContent = Math.min(shown, rows.length) + ' of ' + rows.length + ' rows shown (' + data.rows.length + ' in all)';
    more.style.display = shown < rows.length ? '' : 'none';
  }
  function cmp(a, b){
    if (a === b) return 0; if (a === null) return 1; if (b === null) return -1;
    if (typeof a === 'number' && typeof b === 'number') return dir * (a - b);
    return dir * String(a).localeCompare(String(b), undefined, {numeric: true});
  }
  table.tHead.addEventListener('click', e => {
    const th = e.target.closest('th'); if (!th) return;
    const col = th.cellIndex; dir = (col === sortCol) ? -dir : 1; sortCol = col;
    for (const h of table.tHead.rows[0].cells) h.className = '';
    th.className = dir > 0 ? 'asc' : 'desc';
    rows = rows.slice().sort((x, y) => cmp(x[col], y[col])); render();
  });
  filter.addEventListener('input', () => {
    const q = filter.value.toLowerCase();
    rows = data.rows.filter(r => !q || r.some(v => v !== null && String(v).toLowerCase().includes(q)));
    if (sortCol >= 0) rows.sort((x, y) => cmp(x[sortCol], y[sortCol]));
    shown = PAGE; render();
  });
  more.addEventListener('click', () => { shown += PAGE; render(); });
  render();
})();
"""


def page(data: ReportData, sections: Sequence[tuple[str, Sequence[Plot]]], *, version: str) -> str:
    """The whole HTML document: header, figure sections, table of results, environment."""
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(data.title)}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(data.title)}</h1>",
        _summary(data, version),
    ]
    first = True
    for heading, plots in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        for plot in plots:
            parts.append(_figure(plot, first))
            first = first and plot.figure is None
    parts.append(_table(data))
    parts.append(_environment(data))
    parts.append("</body></html>")
    return "\n".join(parts)


def _summary(data: ReportData, version: str) -> str:
    frame = data.frame
    counts = frame.groupby(["source", "status"]).size().to_dict() if not frame.empty else {}
    text = ", ".join(f"{n:,} {source} {status}" for (source, status), n in sorted(counts.items())) or "no results"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    dims = ", ".join(data.dims) or "none"
    return (
        f"<p>Store <code>{html.escape(data.store_url)}</code>: {len(frame):,} results ({html.escape(text)}). "
        f"Swept dimensions: {html.escape(dims)}. Generated {when} by tunebench {html.escape(version)}.</p>"
    )


def _figure(plot: Plot, first: bool) -> str:
    caption = f"<figcaption>{html.escape(plot.caption)}</figcaption>"
    if plot.figure is None:
        return f"<figure id='{plot.key}' class='empty'><h3>{html.escape(plot.title)}</h3>{caption}</figure>"
    import plotly.io as pio

    title = fit_title(plot.title)
    entries = sum(1 for t in plot.figure["data"] if t.get("showlegend", True) and t.get("name"))
    legend_lines = max(1, math.ceil(entries / LEGEND_PER_LINE))  # the legend sits above the plot, below the title
    margin = {**LAYOUT["margin"], "t": LAYOUT["margin"]["t"] + TITLE_LINE_PX * (title.count("<br>") + legend_lines - 1)}
    figure = {
        "data": plot.figure["data"],
        "layout": {**LAYOUT, "margin": margin, "title": {"text": title}, **plot.figure["layout"]},
    }
    # validate=False: the figures are plain dicts in plotly.js's schema (validating 10,000s of values takes seconds)
    div = pio.to_html(
        figure,
        full_html=False,
        include_plotlyjs=bool(first),
        div_id=f"plot-{plot.key}",
        config=PLOTLY_CONFIG,
        validate=False,
    )
    return f"<figure id='{plot.key}' class='plot'>{div}{caption}</figure>"


def fit_title(text: str, width: int = TITLE_CHARS, lines: int = TITLE_LINES) -> str:
    """A figure title that fits: wrapped at blanks into lines of at most width characters (plotly's <br>),
    at most lines of them; a longer title is shortened in the middle with an ellipsis first. plotly centres
    a title and clips what passes either edge of the figure."""
    if len(text) > width * lines:
        keep = width * lines - 3  # the ellipsis and its blanks
        text = f"{text[: keep - keep // 2]} … {text[len(text) - keep // 2 :]}"
    out, line = [], ""
    for word in text.split(" "):
        while len(word) > width:  # a word longer than a line (a long id) is cut across lines
            if line:
                out.append(line)
                line = ""
            out.append(word[:width])
            word = word[width:]
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    out.append(line)
    return "<br>".join(out)


def table_columns(data: ReportData) -> list[str]:
    """The table's columns: who and what, the entity's values, every measured property (without the GPUs'
    where every row ran on the CPU: spec.measured.shown_columns), the reason, the result id."""
    frame = data.frame
    fixed = ["experiment_id", "actuator", "source", "status", "outcome"]
    entity = [
        c
        for c in frame.columns
        if c not in fixed
        and not c.startswith("_")
        and c not in ("request_id", "result_id", "base_id", "entity_id", "reason")
        and c not in data.properties
    ]
    gpus = frame["number_gpus"] if "number_gpus" in frame.columns else ()
    return [
        *fixed,
        *entity,
        *shown_columns(data.properties, gpus),
        "reason",
        "result_id",
    ]  # result_id: `report --series RESULT_ID`


def table_payload(data: ReportData) -> dict[str, Any]:
    """The table as JSON-ready columns and rows; a text column with repeated values is stored once per value
    (``codes[i]``: the column's distinct texts, its cells their positions), which keeps 10,000 rows small."""
    columns = [c for c in table_columns(data) if c in data.frame.columns]
    cells, codes = [], {}
    for i, name in enumerate(columns):
        values = _column(data.frame[name])
        texts = [v for v in values if isinstance(v, str)]
        distinct = list(dict.fromkeys(texts))
        if texts and len(distinct) * 4 < len(texts):
            position = {t: n for n, t in enumerate(distinct)}
            values = [position[v] if isinstance(v, str) else v for v in values]
            codes[i] = distinct
        cells.append(values)
    return {"columns": columns, "codes": codes, "rows": [list(r) for r in zip(*cells)]}


def _table(data: ReportData) -> str:
    payload = json.dumps(table_payload(data), separators=(",", ":")).replace("</", "<\\/")
    head = "".join(
        f"<th>{html.escape(c if c != 'experiment_id' else 'experiment')}</th>"
        for c in table_columns(data)
        if c in data.frame.columns
    )
    return (
        "<h2>Every result</h2><p>One row per stored result (entity x experiment x actuator). Click a header to sort, "
        "type to filter.</p><p><input id='results-filter' placeholder='filter' size='40'> <span id='results-info'>"
        f"</span></p><div id='results-wrap'><table id='results'><thead><tr>{head}</tr></thead><tbody></tbody></table>"
        "</div><button id='results-more'>more rows</button>"
        f"<script type='application/json' id='results-data'>{payload}</script>"
        f"<script>{TABLE_JS.replace('PAGE', str(TABLE_PAGE))}</script>"
    )


def _column(series: pd.Series) -> list[Any]:
    """A column's cells for JSON: numbers to 6 significant digits, NaN/None as null, the rest as text."""
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return [
            None if v != v else (int(v) if float(v).is_integer() and abs(v) < 2**53 else float(f"{v:.6g}"))
            for v in series.astype(float).tolist()
        ]
    return [v if type(v) is str else _cell(v) for v in series.tolist()]  # most cells are text already


def _cell(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value if value is None else int(value)
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    if isinstance(value, int):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str)
    return str(value)


def _environment(data: ReportData) -> str:
    if not data.environment:
        return "<h2>Where the results come from</h2><p class='note'>No results: nothing measured yet.</p>"
    cols = ["actuator", "rows", "results_read", "host", "executor", "device", "gpus", "versions", "calibration"]
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(e.get(c, '')))}</td>" for c in cols) + "</tr>" for e in data.environment
    )
    return (
        "<h2>Where the results come from</h2><p>Versions and hardware as the results' metadata records them "
        "(read from an evenly spaced sample of each actuator's results: 'results read' of 'rows'). The planner's "
        "rows name the calibration they were predicted with.</p>"
        f"<table id='environment'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    )
