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

from tunebench.commands.main import main

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
          drawn: gd ? gd.querySelectorAll('.scatterlayer .point, .barlayer .point, .boxlayer .point, .scatterlayer .js-line').length : 0,
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
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
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
    return subprocess.run(
        [sys.executable, "-m", "tunebench", "report", *args, "--store", store, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )


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
    expected = {
        "predicted-vs-measured-memory",
        "predicted-vs-measured-throughput",
        "pareto",
        "oom-boundary-0",
        "oom-boundary-1",
        "stability",
        "property-dataset_tokens_per_second",
        "property-train_tokens_per_second",
        "property-gpu_memory_utilization_peak",
        "series-utilisation",
        "series-memory",
        "series-loss",
    }
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
    # the test actuator's CPU results are tests, not measurements: only the 15 imported A100 rows are compared
    assert "for 15 measured entities" in figures["predicted-vs-measured-throughput"]["caption"]
    assert "9 valid results of test actuators" in figures["predicted-vs-measured-throughput"]["caption"]
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
    page.screenshot(
        path=shot or str(tmp_path / "report.png"), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": 3400}
    )  # the first figures
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
    # the A100 boundary group (30 results) and the throughput comparison (15 pairs), each down to 8 points
    assert "(30 results, 15 out of memory)" in text
    assert "Showing 8 of 30 points (one in every 4, evenly subsampled)." in text
    assert "for 15 measured entities" in text and "Showing 8 of 15 points (one in every 2, evenly subsampled)." in text
    plot = re.search(
        r"plot-predicted-vs-measured-throughput.*?Plotly.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", text, re.S
    )
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
    [
        ("valid", [], "fits"),
        ("invalid", ["GPU out of memory: CUDA out of memory"], "out of memory"),
        ("invalid", ["out of GPU memory (probability 1.00): predicted peak 90 GiB"], "out of memory"),
        ("invalid", ["rule 1: batch_size 6 is not divisible by number_gpus 4"], "invalid by rule"),
        ("failed", [], "failed"),
    ],
)
def test_outcome(status, reasons, expected):
    from tunebench.report.data import outcome

    assert outcome(status, reasons, None) == expected


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--store", "{tmp}/missing.db"], "--store"),
        (["{tmp}/nope.yaml", "--store", "{store}"], "SPACE"),
        (["--store", "{store}", "-o", "{tmp}/no/such/dir/r.html"], "--output"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(mixed, tmp_path, args, field):
    args = [a.format(tmp=tmp_path, store=mixed[1]) for a in args]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tunebench",
            "report",
            *args,
            *(["-o", str(tmp_path / "r.html")] if "-o" not in args else []),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), out.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "missing.db").exists()


def test_importing_tunebench_does_not_import_plotly():
    code = (
        "import sys, tunebench, tunebench.commands.main; "
        "import tunebench.report, tunebench.commands.report; print('plotly' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_an_empty_store_gives_a_report_that_says_so(tmp_path):
    from tunebench.store import Store

    Store(f"sqlite:///{tmp_path / 'empty.db'}").close()
    out = tmp_path / "empty.html"
    assert main(["report", "--store", str(tmp_path / "empty.db"), "-o", str(out)]) == 0
    text = out.read_text()
    assert "0 results (no results)" in text and "class='plot'" not in text
    assert text.count("Nothing to draw") == 7 and "the store has no measurements yet" in text  # cost: 2, series: 1
    assert "no result of this report has time series" in text
    assert table_data(out)["rows"] == []


# every trace of every figure: its name, type, marker symbol and values (what the reader sees per point)
TRACES_JS = """() => Object.fromEntries(Array.from(document.querySelectorAll('figure.plot')).map(f => {
  const gd = f.querySelector('.js-plotly-plot');
  return [f.id, gd.data.map(t => ({name: t.name, type: t.type, symbol: (t.marker || {}).symbol || null,
                                   x: t.x || [], y: t.y || [], xaxis: t.xaxis || 'x'}))];
}))"""
# every x axis of a figure: title, type, tick labels and the points drawn in its panel
AXES_JS = """(id) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot'); const out = {};
  for (const [k, ax] of Object.entries(gd._fullLayout)) if (/^[xy]axis\\d*$/.test(k)) out[ax.title.text] = {
    type: ax.type, ticks: Array.from(gd.querySelectorAll('g.' + ax._id + 'tick text')).map(t => t.textContent),
    points: gd.querySelectorAll('.subplot.' + ax._id + 'y .point').length};
  return out; }"""
# each figure's title against its drawing: the title's left and right edges and the figure's
TITLES_JS = """() => Array.from(document.querySelectorAll('figure.plot')).map(f => {
  const svg = f.querySelector('.main-svg').getBoundingClientRect(), t = f.querySelector('.gtitle').getBBox();
  const r = f.querySelector('.gtitle').getBoundingClientRect();
  return {id: f.id, text: f.querySelector('.gtitle').textContent, left: r.left - svg.left, right: svg.right - r.right};
})"""


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory, browser):
    """The report of a newcomer's store (report_data.newcomer_store) open in Chromium: (page, traces, text, html path)."""
    tmp = tmp_path_factory.mktemp("report-newcomer")
    store = report_data.newcomer_store(tmp)
    out = tmp / "newcomer.html"
    done = report(store, out)
    assert done.returncode == 0, done.stderr
    page, errors, remote = open_report(browser, out)
    assert errors == [] and remote == []
    yield page, page.evaluate(TRACES_JS), out.read_text(), out
    page.close()


def test_noop_results_are_labelled_test_never_measured(newcomer):
    page, traces, text, out = newcomer
    assert "4 test valid" in text and "4 measured valid" in text  # noop's 4, the 4 imported CPU runs
    boundary = {k: v for k, v in traces.items() if k.startswith("oom-boundary")}
    a100 = next(t for t in boundary.values() if any(x.get("name") == "test: fits" for x in t))
    assert not any(t["name"].startswith("measured") for t in a100)
    caption = page.locator("#predicted-vs-measured-throughput figcaption").text_content()
    assert "for 4 measured entities" in caption and "4 valid results of test actuators" in caption
    table = table_data(out)
    rows = [dict(zip(table["columns"], r)) for r in table["rows"]]
    assert {r["source"] for r in rows if r["actuator"] == "noop"} == {"test"}
    assert {r["source"] for r in rows if r["actuator"] == "measure"} == {"measured"}


def test_bf16_and_fp32_runs_differ_in_symbol(newcomer):
    _, traces, _, _ = newcomer
    for key in ("pareto", "property-dataset_tokens_per_second"):
        symbols = {t["name"]: t["symbol"] for t in traces[key] if t["name"].startswith("predicted, ")}
        assert set(symbols) == {"predicted, bfloat16", "predicted, float32"}, key
        assert len(set(symbols.values())) == 2, symbols


def test_the_gpu_model_panel_draws_every_gpu_and_the_cpu(newcomer):
    page, traces, _, _ = newcomer
    axes = page.evaluate(AXES_JS, "property-dataset_tokens_per_second")
    panel = axes["gpu_model"]
    rows = sum(
        len([v for v in t["y"] if v is not None])
        for t in traces["property-dataset_tokens_per_second"]
        if t["xaxis"] == "x"
    )  # every row is drawn once per panel
    assert panel["type"] == "category" and panel["points"] == rows == axes["batch_size"]["points"] > 70
    assert set(panel["ticks"]) == {*report_data.NEWCOMER_GPUS, "CPU"}


def test_integer_axes_label_integers_and_log_axes_full_numbers(newcomer):
    page, traces, _, _ = newcomer
    axes = page.evaluate(AXES_JS, "property-dataset_tokens_per_second")
    assert axes["batch_size"]["ticks"] == ["1", "2", "4"] and axes["number_gpus"]["ticks"] == ["0", "1"]
    assert axes["model_max_length"]["ticks"] == ["512", "1024", "2048", "4096"]
    for key in (k for k in traces if k.startswith("oom-boundary")):
        axes = page.evaluate(AXES_JS, key)
        assert axes["batch_size"]["type"] == "log" and axes["batch_size"]["ticks"] in (["1", "2"], ["1", "2", "4"])
        lengths = axes["model_max_length (tokens)"]["ticks"]
        assert lengths in (["512", "2048"], ["512", "1024"]), lengths


def test_log_axes_label_thousands_in_full(mixed, browser, tmp_path):
    out = tmp_path / "mixed.html"
    assert report(mixed[1], out).returncode == 0
    page, _, _ = open_report(browser, out)
    figures = page.evaluate(FIGURES_JS)
    a100 = next(f["id"] for f in figures if f["id"].startswith("oom-boundary") and "A100" in f["caption"])
    axes = page.evaluate(AXES_JS, a100)
    assert axes["model_max_length (tokens)"]["ticks"] == [str(n) for n in report_data.LENGTHS]
    assert axes["batch_size"]["ticks"] == [str(n) for n in report_data.BATCHES]
    page.close()


def test_titles_fit_in_a_narrow_window(newcomer, browser):
    page = browser.new_page()
    page.set_viewport_size({"width": 720, "height": 900})
    page.goto(newcomer[3].as_uri())
    page.wait_for_function("() => window.Plotly !== undefined && document.querySelectorAll('.gtitle').length > 3")
    page.wait_for_timeout(300)
    titles = page.evaluate(TITLES_JS)
    assert any("Out-of-memory boundary: model_name=smollm2-135m" in t["text"] for t in titles)
    for t in titles:
        assert t["left"] >= -1 and t["right"] >= -1, t  # nothing cut at either end
    page.close()


def test_cpu_runs_never_sit_at_0_gib_of_gpu_memory(newcomer):
    page, traces, _, _ = newcomer
    points = [t for t in traces["pareto"] if not t["name"].startswith("Pareto front")]
    assert points and all(x is not None and x > 0 for t in points for x in t["x"])
    assert all(x > 0 for t in traces["pareto"] for x in t["x"])  # nor on the front
    # the memory the most measured runs on GPUs hold: the CPU runs' 0 % utilization no longer chooses it
    assert "gpu_memory_peak_gib" in page.locator("#pareto figcaption").text_content()
    utilization = traces["property-gpu_memory_utilization_peak"]
    assert all(y is None or y > 0 for t in utilization for y in t["y"])
    assert (
        "4 CPU results are left out" in page.locator("#property-gpu_memory_utilization_peak figcaption").text_content()
    )


def test_cost_and_gpu_hours_are_drawn_gpu_against_gpu_and_method_against_method(newcomer):
    from tunebench.catalog import get_gpu

    page, traces, _, out = newcomer
    for key, name in (("cost", "cost"), ("gpu-hours", "gpu_hours")):
        boxes = traces[key]
        assert {t["type"] for t in boxes} == {"box"} and {t["name"] for t in boxes} == {"predicted"}
        assert set(boxes[0]["x"]) == set(report_data.NEWCOMER_GPUS) and set(boxes[1]["x"]) == {"full", "lora"}
        assert len(boxes[0]["y"]) == len(boxes[1]["y"]) > 40
        caption = page.locator(f"#{key} figcaption").text_content()
        assert "Median per run: gpu_model: NVIDIA-A100-SXM4-80GB" in caption and "method: full" in caption
    assert "USD at the GPU catalog's on-demand list price" in page.locator("#cost figcaption").text_content()
    table = table_data(out)
    for r in (dict(zip(table["columns"], r)) for r in table["rows"]):  # cost = GPU-hours x the GPU's list price
        if r["cost"] is not None:
            price = get_gpu(r["gpu_model"]).price_usd_per_gpu_hour
            assert r["cost"] == pytest.approx(r["gpu_hours"] * price, rel=1e-4), r


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (("float32", False, "no"), "float32"),
        ((None, False, None), "bfloat16"),
        (("float32", True, "no"), "float32 + bf16 AMP"),
        (("float32", False, "fp16"), "float32 + fp16 AMP"),
        (("bfloat16", True, "no"), "bfloat16"),
        (("float16", False, "fp16"), "float16"),
    ],
)
def test_precision_names_the_dtype_and_the_autocast(values, expected):
    from tunebench.report.data import precision

    assert precision(*values) == expected
