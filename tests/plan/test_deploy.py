"""deploy-spec: seed 002's formula, its worked examples, the hardware-spec body, --post."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

import pytest
from cli_app import invoke_plan as invoke

from tunebench.errors import InputError
from tunebench.plan.deploy import deploy_spec


@pytest.mark.parametrize(
    ("quantization", "exact", "rounded"),
    [("none", 30.375, 31), ("4bit", 7.875, 8), ("8bit", 15.375, 16)],  # seed 002's three worked examples
)
def test_seed_002_worked_examples(quantization, exact, rounded):
    spec = deploy_spec(10, quantization, adapters=2, adapter_size_gb=0.125)
    assert spec.gpu_memory_gb == exact
    assert spec.cpu_memory_gb == rounded
    assert (spec.num_gpus, spec.num_cpus) == (1, 2)
    res = invoke(
        "deploy-spec",
        "--params-b",
        "10",
        "--quantization",
        quantization,
        "--adapters",
        "2",
        "--adapter-size-gb",
        "0.125",
        "--json",
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["gpu_memory_gb"] == exact and out["cpu_memory_gb"] == rounded
    assert out["hardware_spec"] == {
        "name": "custom_hw_spec",
        "description": "Custom hardware specification for foundation models",
        "nodes": {"cpu": {"units": "2"}, "mem": {"size": f"{rounded}Gi"}, "gpu": {"num_gpu": 1}},
    }


def test_many_gpus_and_cpus_for_a_large_model():
    spec = deploy_spec(70, "none", adapters=4, adapter_size_gb=0.5, gpu_memory_gb=80, name="big")
    assert spec.gpu_memory_gb == (140 + 2) * 1.5 == 213
    assert spec.num_gpus == 3 and spec.num_cpus == 4 and spec.hardware_spec["nodes"]["gpu"]["num_gpu"] == 3
    assert spec.hardware_spec["name"] == "big"


def test_model_from_the_catalog():
    res = invoke("deploy-spec", "--model", "llama3.1-8b", "--quantization", "4bit", "--adapters", "1", "--json")
    out = json.loads(res.stdout)
    assert out["params_b"] == pytest.approx(8.030261248)
    assert out["gpu_memory_gb"] == pytest.approx((8.030261248 * 0.5 + 0.125) * 1.5)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--params-b", "10", "--quantization", "2bit"], "--quantization"),
        (["--quantization", "none"], "--model"),
        (["--params-b", "10", "--model", "llama3.1-8b"], "--model"),
        (["--params-b", "-1"], "--params-b"),
        (["--model", "nope"], "model_name"),
    ],
)
def test_input_errors(args, field):
    res = invoke("deploy-spec", *args)
    assert isinstance(res.exception, InputError), res.output
    assert res.exception.field == field


class _Recorder(BaseHTTPRequestHandler):
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server API)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Recorder.seen.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        reply = json.dumps({"metadata": {"asset_id": "hw-1"}}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_post_sends_the_body_with_a_bearer_token_to_a_local_server():
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/v2/hardware_specifications?space_id=s1"
        res = invoke(
            "deploy-spec",
            "--params-b",
            "10",
            "--adapters",
            "2",
            "--post",
            url,
            "--token-env",
            "TB_TEST_TOKEN",
            "--json",
            env={"TB_TEST_TOKEN": "secret-1"},
        )
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["post"]["status"] == 201 and out["post"]["body"]["metadata"]["asset_id"] == "hw-1"
        path, auth, body = _Recorder.seen[-1]
        assert path == "/v2/hardware_specifications?space_id=s1" and auth == "Bearer secret-1"
        assert body == out["hardware_spec"]
    finally:
        server.shutdown()
        server.server_close()


def test_post_without_a_token_is_an_input_error():
    res = invoke(
        "deploy-spec",
        "--params-b",
        "10",
        "--post",
        "http://127.0.0.1:9/x",
        "--token-env",
        "TB_UNSET_TOKEN_X",
        env={"TB_UNSET_TOKEN_X": ""},
    )
    assert isinstance(res.exception, InputError) and res.exception.field == "--token-env"


class _Redirector(BaseHTTPRequestHandler):
    """Answers every POST with a redirect to the URL in the class attribute `to`."""

    to = ""
    code = 302
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Redirector.seen.append((self.path, self.headers.get("Authorization")))
        self.send_response(_Redirector.code)
        self.send_header("Location", _Redirector.to)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class _Thief(BaseHTTPRequestHandler):
    """Another origin: records whatever reaches it."""

    seen: list = []

    def _record(self):
        _Thief.seen.append((self.command, self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _record  # noqa: N815

    def log_message(self, *args):
        pass


def _serve(handler):
    server = HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_post_does_not_follow_a_redirect_to_another_origin(code):
    """Item 2: a redirect from the given URL to another origin must not receive the bearer token."""
    thief, origin = _serve(_Thief), _serve(_Redirector)
    _Thief.seen.clear()
    _Redirector.seen.clear()
    _Redirector.code, _Redirector.to = code, f"http://localhost:{thief.server_port}/steal"
    try:
        url = f"http://127.0.0.1:{origin.server_port}/v2/hardware_specifications"
        res = invoke(
            "deploy-spec",
            "--params-b",
            "10",
            "--post",
            url,
            "--token-env",
            "TB_TEST_TOKEN",
            "--json",
            env={"TB_TEST_TOKEN": "secret-2"},
        )
        assert res.exit_code == 1, res.output  # not ok: the spec was not created
        out = json.loads(res.stdout)
        assert out["post"]["status"] == code and out["post"]["ok"] is False
        assert "not followed" in out["post"]["redirect"]
        assert _Redirector.seen == [("/v2/hardware_specifications", "Bearer secret-2")]
        assert _Thief.seen == []  # the other origin got nothing at all, token or not
    finally:
        for server in (thief, origin):
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.com/v2/hardware_specifications", "https is required"),
        ("http://10.0.0.8/v2/hardware_specifications", "https is required"),
        ("https://user:pw@example.com/x", "credentials in the URL"),
        ("file:///etc/passwd", "not an http(s) URL"),
        ("https://", "not an http(s) URL"),
    ],
)
def test_post_needs_https_except_for_loopback(url, why):
    from tunebench.plan.deploy import post_hardware_spec

    with pytest.raises(InputError, match=re.escape(why)) as caught:
        post_hardware_spec(url, {"name": "x"}, token_env="PATH")
    assert caught.value.field == "--post"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "localhost", "[::1]"])
def test_loopback_hosts_may_use_http(host):
    from tunebench.plan.deploy import check_post_url

    assert check_post_url(f"http://{host}:8080/x") == f"http://{host}:8080/x"


class _Flood(BaseHTTPRequestHandler):
    """Replies 201 with an endless chunked body (what a hostile or broken server can send)."""

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


class _Drip(BaseHTTPRequestHandler):
    """Replies a byte at a time, each well within the socket timeout, never finishing."""

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(201)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        try:
            for _ in range(1000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _serving(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v2/hardware_specifications"
    finally:
        server.shutdown()
        server.server_close()


def test_an_endless_reply_is_cut_at_the_cap_in_bounded_memory():
    # a real process under a 1.5 GiB address-space limit: reading the whole reply would exceed it
    with _serving(_Flood) as url:
        env = {**os.environ, "TB_TEST_TOKEN": "t"}
        limit = lambda: resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))  # noqa: E731
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tunebench",
                "deploy-spec",
                "--params-b",
                "7",
                "--post",
                url,
                "--token-env",
                "TB_TEST_TOKEN",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            preexec_fn=limit,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --post: the reply is larger than 1024 KiB: not a hardware spec reply"
    ]


def test_a_reply_that_drips_is_cut_at_the_total_deadline():
    # a real process under bounded memory and CPU time: per-read timeouts alone would wait 1,000 x 0.2 s
    with _serving(_Drip) as url:
        env = {**os.environ, "TB_TEST_TOKEN": "t"}

        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))
            resource.setrlimit(resource.RLIMIT_CPU, (60, 60))

        start = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tunebench",
                "deploy-spec",
                "--params-b",
                "7",
                "--post",
                url,
                "--token-env",
                "TB_TEST_TOKEN",
                "--timeout",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            preexec_fn=limit,
        )
        elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(r"error: --post: no complete reply from \S+ within 2 s", proc.stderr.strip()), proc.stderr
    assert elapsed < 2 + 15  # the deadline, plus starting Python and importing tunebench


class _Echo(BaseHTTPRequestHandler):
    """Replies with the request's headers as its body (a debugging endpoint, or a hostile one)."""

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        reply = json.dumps({"headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def test_a_server_that_echoes_the_request_never_gets_the_token_printed():
    with _serving(_Echo) as url:
        res = invoke(
            "deploy-spec",
            "--params-b",
            "7",
            "--post",
            url,
            "--token-env",
            "TB_TEST_TOKEN",
            "--json",
            env={"TB_TEST_TOKEN": "s3cr3t-value-42"},
        )
    assert res.exit_code == 0, res.output
    assert "s3cr3t-value-42" not in res.output
    assert json.loads(res.stdout)["post"]["body"]["headers"]["Authorization"] == "Bearer ***"


@pytest.mark.parametrize("token", ["abc\nsecond-half", "abc\x01second-half", "abc\u00e9second-half"])
def test_a_token_that_is_not_one_line_of_ascii_is_refused_unshown(token):
    res = invoke(
        "deploy-spec",
        "--params-b",
        "7",
        "--post",
        "http://127.0.0.1:9/x",
        "--token-env",
        "TB_TEST_TOKEN",
        env={"TB_TEST_TOKEN": token},
    )
    assert isinstance(res.exception, InputError) and res.exception.field == "--token-env"
    assert "second-half" not in str(res.exception) and "second-half" not in res.output
