"""Inputs that once ran without bound, answered within bounds: each capped input in a fresh process.

    python benchmarks/limits.py [--dir DIR]

For each case the console command runs as a real process (``python -m tunebench ...``); the table
shows its exit code, wall time, peak resident memory (the child's ru_maxrss, from os.wait4) and the
first line it printed. Target: every case answered in < 5 s and < 500 MB, with exit code 2 and one
line naming the field. Large files are sparse (their size is real, their blocks are not written), so
the cases cost no disk.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

LORA = "finetune_lora_benchmark-v1.0.0"
SMALL = ["model_name=smollm2-135m", "model_max_length=64", "number_gpus=0", "batch_size=1"]
GPU = ["model_name=llama3.1-8b", "model_max_length=2048", "number_gpus=8", "batch_size=8", "gpu_model=A100"]


class Flood(http.server.BaseHTTPRequestHandler):
    """An endless chunked reply (3 GiB pushed memory past 7 GB before the cap)."""

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"x" * 65536
        try:
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass

    def log_message(self, *args):
        pass


class Drip(http.server.BaseHTTPRequestHandler):
    """A reply a byte every 0.5 s (each read within the socket timeout, the whole never done)."""

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(100_000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            pass

    def log_message(self, *args):
        pass


def serve(handler: type) -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/v2/hardware_specifications"


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def files(d: Path) -> None:
    """The inputs the cases name."""
    sparse(d / "one_gb_line.csv", 2**30)  # a CSV of one 1 GB line (peaked at 5.2 GB before its error)
    sparse(d / "space_400mb.yaml", 400 * 2**20)  # ran past 75 s
    space = {
        "experiments": [{"id": LORA}],
        "actuator": {"name": "predict"},
        "entity_space": {
            "model_name": "smollm2-135m",
            "number_gpus": 0,
            "model_max_length": {"min": 1, "max": 10_000},
            "batch_size": {"min": 1, "max": 1000},
        },
    }
    (d / "ten_million.yaml").write_text(json.dumps(space))  # JSON is YAML
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 10**9,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
    }
    (d / "layers.json").write_text(json.dumps(cfg))
    import tunebench  # a store holding ado's CPU example (what show and report read)

    ado = Path(tunebench.__file__).parent / "plan/data/measurements/ado/ado_docs_example_smollm2_cpu_measurements.csv"
    subprocess.run(
        [sys.executable, "-m", "tunebench", "import", str(ado), "--store", str(d / "s.db")],
        check=True,
        capture_output=True,
    )


def cases(d: Path) -> list[tuple[str, list[str]]]:
    flood, drip = serve(Flood), serve(Drip)
    return [
        ("import: a CSV of one 1 GB line", ["import", str(d / "one_gb_line.csv"), "--store", str(d / "s.db")]),
        ("explore: a 400 MB space file", ["explore", str(d / "space_400mb.yaml")]),
        ("explore: a 10-million-point space", ["explore", str(d / "ten_million.yaml")]),
        (
            "show --space: a 10-million-point space",
            ["show", "--space", str(d / "ten_million.yaml"), "--store", str(d / "s.db")],
        ),
        (
            "report: a 10-million-point space",
            ["report", str(d / "ten_million.yaml"), "--store", str(d / "s.db"), "-o", str(d / "r.html")],
        ),
        (
            "plan: a config of 10^9 layers",
            [
                "plan",
                LORA,
                f"model_name={d / 'layers.json'}",
                "model_max_length=64",
                "number_gpus=1",
                "batch_size=1",
                "gpu_model=A100",
            ],
        ),
        ("launch-plan: number_nodes=100000", ["launch-plan", LORA, *GPU, "number_nodes=100000"]),
        ("recommend --max-gpus 1000000", ["recommend", LORA, *GPU, "--max-gpus", "1000000"]),
        ("run --cpu-processes 100000", ["run", LORA, *SMALL, "--cpu-processes", "100000"]),
        ("deploy-spec --params-b 1e30", ["deploy-spec", "--params-b", "1e30"]),
        (
            "deploy-spec --post: an endless reply",
            ["deploy-spec", "--params-b", "7", "--post", flood, "--token-env", "TB_T"],
        ),
        (
            "deploy-spec --post: a dripping reply, --timeout 3",
            ["deploy-spec", "--params-b", "7", "--post", drip, "--token-env", "TB_T", "--timeout", "3"],
        ),
    ]


def measure(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, float, float, str]:
    """(exit code, wall s, peak RSS MB, first line of stderr) of one command in a fresh process."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunebench", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd
    )
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, wall, usage.ru_maxrss / 1024, (err.strip().splitlines() or [""])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="where the input files go (default: a temporary directory)")
    args = parser.parse_args()
    d = args.dir or Path(tempfile.mkdtemp(prefix="tunebench-limits-"))
    d.mkdir(parents=True, exist_ok=True)
    files(d)
    env = {**os.environ, "TUNEBENCH_HOME": str(d / "home"), "TB_T": "token", "COLUMNS": "200"}
    worst_s, worst_mb, failed = 0.0, 0.0, 0
    print(f"{'case':52} {'rc':>3} {'wall s':>7} {'peak MB':>8}  first line")
    for name, argv in cases(d):
        rc, wall, mb, line = measure(argv, env, d)
        worst_s, worst_mb = max(worst_s, wall), max(worst_mb, mb)
        ok = rc == 2 and wall < 5 and mb < 500 and line.startswith("error: ")
        failed += not ok
        print(f"{name:52} {rc:>3} {wall:>7.2f} {mb:>8.0f}  {line[:110]}{'' if ok else '   <- NOT MET'}")
    print(
        f"\nworst: {worst_s:.2f} s, {worst_mb:.0f} MB; target < 5 s and < 500 MB, exit code 2: "
        f"{'met' if not failed else f'NOT MET ({failed} cases)'}"
    )
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
