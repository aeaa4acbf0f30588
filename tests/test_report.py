"""`tunebench report`: the HTML file opened in a real browser (Debian's Chromium driven by playwright).

Stores are real: `tunebench explore` with the planner and with a test actuator, `tunebench import` of
CSV rows (see report_data.py). Chromium is /usr/bin/chromium (`.ci/run` installs it); a missing
browser fails these tests, it never skips them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import report_data

from tunebench.cli import main

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip

# every figure: its plotly SVG, the points its traces hold and the points drawn in the DOM
FIGURES_JS = """() => Array.from(document.querySelectorAll('figure')).map(f => {
  const gd = f.querySelector('.js-plotly-plot');
  const traces = gd ? gd.data : [];
  return {id: f.id, plot: f.classList.contains('plot'), caption: f.querySelector('figcaption').textContent,
          svgs: gd ? gd.querySelectorAll('.main-svg').length : 0,
          points: traces.reduce((n, t) => n + (t.x || []).filter(v => v !== null).length, 0),
          drawn: gd ? gd.querySelectorAll('.scatterlayer .point, .barlayer .point, .scatterlayer .js-line').length : 0,
          names: traces.map(t => t.name), texts: traces.map(t => t.text || []),
          lines: traces.filter(t => (t.mode || '').includes('lines')).map(t => ({name: t.name, y: t.y}))};
})"""


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("report-mixed")
    return tmp, report_data.mixed_store(tmp)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1280, "height": 900},
        )
        yield context
        context.close()


def open_report(browser, path: Path):
    """The page, its console errors and every request that was not for a local file."""
    page = browser.new_page()
    errors: list[str] = []
    remote: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: None if r.url.startswith(("file:", "data:", "blob:")) else remote.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_function("() => window.Plotly !== undefined && document.querySelectorAll('.main-svg').length > 0")
    page.wait_for_timeout(300)
    return page, errors, remote


def report(store: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tunebench.cli", "report", *args, "--store", store, "-o", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def table_data(path: Path) -> dict:
    text = path.read_text()
    payload = json.loads(re.search(r"id='results-data'>(.*?)</script>", text, re.S).group(1).replace("<\\/", "</"))
    for i, texts in payload["codes"].items():
        for row in payload["rows"]:
            if row[int(i)] is not None:
                row[int(i)] = texts[row[int(i)]]
    return payload


def test_report_of_a_mixed_store_renders_every_plot_in_chromium(mixed, browser, tmp_path):
    tmp, store = mixed
    out = tmp_path / "report.html"
    done = report(store, out)
    assert done.returncode == 0, done.stderr
    assert f"report -> {out}" in done.stdout
    text = out.read_text()
    assert text.count("* plotly.js v") == 1  # the bundle inlined once, for the first figure
    page, errors, remote = open_report(browser, out)
    figures = {f["id"]: f for f in page.evaluate(FIGURES_JS)}
    expected = {"predicted-vs-measured-memory", "predicted-vs-measured-throughput", "pareto", "oom-boundary-0",
                "oom-boundary-1", "stability", "property-dataset_tokens_per_second",
                "property-train_tokens_per_second", "property-gpu_memory_utilization_peak",
                "series-utilisation", "series-memory", "series-loss"}  # fmt: skip
    assert expected <= {k for k, f in figures.items() if f["plot"]}, sorted(figures)
    for f in figures.values():
        assert f["caption"].strip(), f["id"]
        if f["plot"]:  # rendered, with data, points drawn
            assert f["svgs"] > 0 and f["points"] > 0 and f["drawn"] > 0, f
    assert {k for k, f in figures.items() if not f["plot"]} <= {"property-constant"}
    assert errors == [] and remote == []
    # the time series of the latest result that has them (the test actuator's made-up ones), drawn as sampled,
    # and the planner's predicted peak over the memory curve
    memory = figures["series-memory"]
    assert [t["name"] for t in memory["lines"]][0] == "process.rss_gib"
    (peak,) = [t["y"] for t in memory["lines"] if t["name"].startswith("planner: predicted peak")]
    assert peak[0] == peak[1] > 0
    (loss,) = figures["series-loss"]["lines"]
    assert loss["name"] == "train.loss" and loss["y"] == [4.0, 2.0, float(f"{4 / 3:.6g}"), 1.0, 0.8]
    # the planner's boundary is drawn over the measured A100 outcomes, and it has a value somewhere
    a100 = next(f for f in figures.values() if f["id"].startswith("oom-boundary") and "A100" in f["caption"])
    line = next(t for t in a100["lines"] if t["name"] == "planner: largest length that fits")
    assert any(v is not None for v in line["y"])
    assert {"measured: fits", "measured: out of memory"} <= set(a100["names"])
    # the imported A100 rows were measured = predicted x 0.8..1.2: |error| <= 25 % (1/0.8 - 1); the test
    # actuator's made-up CPU throughputs are compared too, and are far off
    for key in ("predicted-vs-measured-throughput", "predicted-vs-measured-memory"):
        texts = figures[key]["texts"][0]
        errors_gpu = [abs(float(re.search(r"error ([-+\d.]+)%", t).group(1))) for t in texts if "number_gpus=1" in t]
        assert len(errors_gpu) == 15 and max(errors_gpu) <= 25.0 and max(errors_gpu) >= 10.0, (key, errors_gpu)
    assert "for 24 measured entities" in figures["predicted-vs-measured-throughput"]["caption"]
    assert "for 15 measured entities" in figures["predicted-vs-measured-memory"]["caption"]
    # the table: every row, sortable, filterable
    total = len(table_data(out)["rows"])
    assert total == 30 + 12 + 30 + 4
    assert page.locator("#results-info").text_content().endswith(f"({total} in all)")
    headers = page.locator("#results thead th").all_text_contents()
    col = headers.index("batch_size") + 1
    page.locator("#results thead th", has_text="batch_size").click()
    asc = [int(v) for v in page.locator(f"#results tbody td:nth-child({col})").all_text_contents()]
    assert asc == sorted(asc) and asc[0] == 1
    page.locator("#results thead th", has_text="batch_size").click()
    desc = [int(v) for v in page.locator(f"#results tbody td:nth-child({col})").all_text_contents()]
    assert desc == sorted(desc, reverse=True) and desc[0] == 64
    page.fill("#results-filter", "stability")
    assert page.locator("#results tbody tr").count() == 4
    # versions and hardware: the planner's calibration, the test actuator's host
    environment = page.locator("#environment").text_content()
    assert "predict" in environment and "fms-acceleration" in environment and os.uname().nodename in environment
    page.fill("#results-filter", "")
    shot = os.environ.get("TUNEBENCH_REPORT_SCREENSHOT")  # e.g. docs/report-screenshot.png
    page.screenshot(path=shot or str(tmp_path / "report.png"), full_page=True,
                    clip={"x": 0, "y": 0, "width": 1280, "height": 3400})  # the first figures
    page.close()


def test_a_store_of_predictions_only_still_gives_a_report(browser, tmp_path):
    store = report_data.predicted_store(tmp_path)
    out = tmp_path / "predicted.html"
    assert main(["report", "--store", store, "-o", str(out)]) == 0
    page, errors, remote = open_report(browser, out)
    figures = {f["id"]: f for f in page.evaluate(FIGURES_JS)}
    drawn = {k for k, f in figures.items() if f["plot"] and f["points"] > 0 and f["drawn"] > 0}
    assert {"pareto", "oom-boundary-0", "property-dataset_tokens_per_second"} <= drawn
    assert "no measurements yet" in figures["predicted-vs-measured-throughput"]["caption"]
    assert not figures["stability"]["plot"]
    assert "predicted: out of memory" in figures["oom-boundary-0"]["names"]
    assert errors == [] and remote == []
    page.close()


def test_report_of_a_space_holds_its_points_only(mixed, tmp_path):
    tmp, store = mixed
    out = tmp_path / "space.html"
    assert main(["report", str(tmp / "testing.yaml"), "--store", store, "-o", str(out)]) == 0
    table = table_data(out)
    actuator = table["columns"].index("actuator")
    assert len(table["rows"]) == 12 and {r[actuator] for r in table["rows"]} == {report_data.OOM_ACTUATOR}
    outcome = table["columns"].index("outcome")
    assert sorted(r[outcome] for r in table["rows"]).count("out of memory") == 3  # batch_size 8 > max_batch 4


def test_large_figures_are_subsampled_and_say_so(mixed, monkeypatch):
    from tunebench.report import build_report, plots
    from tunebench.store import Store

    monkeypatch.setattr(plots, "MAX_POINTS", 8)
    with Store(mixed[1]) as store:
        text = build_report(store)
    # the A100 boundary group (30 results) and the throughput comparison (24 pairs), each down to 8 points
    assert "(30 results, 15 out of memory)" in text
    assert "Showing 8 of 30 points (one in every 4, evenly subsampled)." in text
    assert "for 24 measured entities" in text and "Showing 8 of 24 points (one in every 3, evenly subsampled)." in text
    plot = re.search(r"plot-predicted-vs-measured-throughput.*?Plotly.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", text, re.S)
    assert len(json.loads(plot.group(1))[0]["x"]) == 8


def test_planner_boundary_is_the_largest_length_predicted_to_fit():
    from tunebench.plan import predict_many
    from tunebench.report.planner import boundary
    from tunebench.spec.experiments import get_experiment

    base = "finetune_full_benchmark-v1.0.0"
    values = {"model_name": report_data.MODEL, "number_gpus": 1, "gpu_model": report_data.GPU}
    line = dict(boundary(base, {}, values, report_data.BATCHES, report_data.LENGTHS))
    experiment = get_experiment(base)

    def fits(batch: int, length: int) -> bool:
        (result,) = predict_many([(experiment, {**values, "batch_size": batch, "model_max_length": length})])
        return bool(result.metadata["fits"])

    for batch in report_data.BATCHES:
        top = line[batch]
        for length in report_data.LENGTHS:  # lengths the grid holds: exact
            assert fits(batch, length) == (top is not None and length <= top), (batch, length, top)
        if top is not None and top < max(report_data.LENGTHS):  # the grid's step is 7.4 %: 8 % more does not fit
            assert fits(batch, top) and not fits(batch, int(top * 1.08) + 1), (batch, top)
    assert line[1] == 8192 and line[32] is None  # everything fits at batch 1, nothing at 32
    assert 512 < line[16] < 1024 and line[16] != 512  # between two observed lengths: the finer grid found it


def test_pareto_front():
    import numpy as np

    from tunebench.report.plots import pareto_front

    memory = np.array([10.0, 20.0, 15.0, 30.0, 10.0, 40.0])
    rate = np.array([100.0, 300.0, 90.0, 250.0, 120.0, 400.0])
    assert pareto_front(memory, rate) == [4, 1, 5]  # 10 GiB/120, 20/300, 40/400


@pytest.mark.parametrize(
    ("status", "reasons", "expected"),
    [("valid", [], "fits"), ("invalid", ["GPU out of memory: CUDA out of memory"], "out of memory"),
     ("invalid", ["out of GPU memory (probability 1.00): predicted peak 90 GiB"], "out of memory"),
     ("invalid", ["rule 1: batch_size 6 is not divisible by number_gpus 4"], "invalid by rule"),
     ("failed", [], "failed")],
)  # fmt: skip
def test_outcome(status, reasons, expected):
    from tunebench.report.data import outcome

    assert outcome(status, reasons, None) == expected


@pytest.mark.parametrize(
    ("args", "field"),
    [(["--store", "{tmp}/missing.db"], "--store"), (["{tmp}/nope.yaml", "--store", "{store}"], "SPACE"),
     (["--store", "{store}", "-o", "{tmp}/no/such/dir/r.html"], "--output")],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_writes_nothing(mixed, tmp_path, args, field):
    args = [a.format(tmp=tmp_path, store=mixed[1]) for a in args]
    out = subprocess.run([sys.executable, "-m", "tunebench.cli", "report", *args, *(["-o", str(tmp_path / "r.html")]
                          if "-o" not in args else [])], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "missing.db").exists()


def test_importing_tunebench_does_not_import_plotly():
    code = ("import sys, tunebench, tunebench.cli; "
            "import tunebench.report, tunebench.report.cli; print('plotly' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_an_empty_store_gives_a_report_that_says_so(tmp_path):
    from tunebench.store import Store

    Store(f"sqlite:///{tmp_path / 'empty.db'}").close()
    out = tmp_path / "empty.html"
    assert main(["report", "--store", str(tmp_path / "empty.db"), "-o", str(out)]) == 0
    text = out.read_text()
    assert "0 results (no results)" in text and "class='plot'" not in text
    assert text.count("Nothing to draw") == 5 and "the store has no measurements yet" in text
    assert "no result of this report has time series" in text
    assert table_data(out)["rows"] == []
