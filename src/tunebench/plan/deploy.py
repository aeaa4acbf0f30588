"""Deployment sizing of a tuned model on watsonx.ai (watsonx.ai 'Creating customized hardware specifications') and its hardware-specification body.

Seed 002 ("Creating customized hardware specifications", watsonx.ai docs):

    GPU memory  = (params_B x bytes per param + adapters x adapter size GB) x 1.5
                  bytes per param: 2 (non-quantized LoRA), 1 (8-bit), 0.5 (4-bit QLoRA)
    GPUs        = ceil(GPU memory / GPU memory per GPU)          ("1 GPU = 80 GB")
    CPUs        = GPUs + 1
    CPU memory  = GPU memory

Worked examples (watsonx.ai 'Creating customized hardware specifications'; the tests): 10 B, 2 adapters of 0.125 GB -> 30.375 GB ~ 31 GB (none),
7.875 ~ 8 GB (4-bit), 15.375 ~ 16 GB (8-bit; the seed's text multiplies 2 x 0.128 there but
states 15.375, which is 2 x 0.125).
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import math
import os
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from tunebench.errors import InputError, has_control_characters
from tunebench.inputs import Options, Printable, Text, parse

BYTES_PER_PARAM = {"none": 2.0, "8bit": 1.0, "4bit": 0.5}
OVERHEAD = 1.5  # "+ 50 % additional memory" (watsonx.ai 'Creating customized hardware specifications')
DEFAULT_GPU_MEMORY_GB = 80.0  # "1GPU = 80 GB" (watsonx.ai 'Creating customized hardware specifications')
DEFAULT_NAME = "custom_hw_spec"  # the watsonx.ai hardware-specification guide's example body
DEFAULT_DESCRIPTION = "Custom hardware specification for foundation models"


@dataclass(frozen=True)
class DeploySpec:
    """Seed 002's sizing and the hardware-specification request body."""

    params_b: float
    quantization: str
    adapters: int
    adapter_size_gb: float
    gpu_memory_per_gpu_gb: float
    gpu_memory_gb: float  # the formula's exact value
    num_gpus: int
    num_cpus: int
    cpu_memory_gb: int  # GPU memory rounded up to whole GB ("30.375 ~= 31 GB")
    name: str
    description: str

    @property
    def hardware_spec(self) -> dict[str, Any]:
        """The JSON body of POST /v2/hardware_specifications, exactly the watsonx.ai hardware-specification guide's shape."""
        return {
            "name": self.name,
            "description": self.description,
            "nodes": {
                "cpu": {"units": str(self.num_cpus)},
                "mem": {"size": f"{self.cpu_memory_gb}Gi"},
                "gpu": {"num_gpu": self.num_gpus},
            },
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_memory_gb": self.gpu_memory_gb,
            "num_gpus": self.num_gpus,
            "num_cpus": self.num_cpus,
            "cpu_memory_gb": self.cpu_memory_gb,
            "hardware_spec": self.hardware_spec,
            "params_b": self.params_b,
            "quantization": self.quantization,
            "adapters": self.adapters,
            "adapter_size_gb": self.adapter_size_gb,
            "gpu_memory_per_gpu_gb": self.gpu_memory_per_gpu_gb,
            "gpu_memory_gb_rounded": self.cpu_memory_gb,
        }


class Sizing(Options):
    """The inputs of the formula (named as deploy-spec's options)."""

    # upper bounds ~100x past today's largest (1-2 T parameter models, 180 GB GPUs): a typo, not a plan
    params_b: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)]
    quantization: Literal["none", "8bit", "4bit"]  # BYTES_PER_PARAM's keys
    adapters: Annotated[int, Field(ge=0, le=1_000_000)]
    adapter_size_gb: Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]
    gpu_memory_gb: Annotated[float, Field(gt=0, le=100_000, allow_inf_nan=False)]
    name: Text | None = None
    description: Printable | None = None


def deploy_spec(
    params_b: float,
    quantization: str = "none",
    adapters: int = 1,
    adapter_size_gb: float = 0.125,
    gpu_memory_gb: float = DEFAULT_GPU_MEMORY_GB,
    name: str | None = None,
    description: str | None = None,
) -> DeploySpec:
    """Size a deployment by the watsonx.ai hardware-specification guide's formula; InputError names a bad field."""
    parse(
        Sizing,
        params_b=params_b,
        quantization=quantization,
        adapters=adapters,
        adapter_size_gb=adapter_size_gb,
        gpu_memory_gb=gpu_memory_gb,
        name=name,
        description=description,
    )
    memory = (params_b * BYTES_PER_PARAM[quantization] + adapters * adapter_size_gb) * OVERHEAD
    memory = round(memory, 9)  # 30.375, not 30.375000000000004
    gpus = max(1, math.ceil(memory / gpu_memory_gb))
    return DeploySpec(
        # the inputs as given
        params_b=params_b,
        quantization=quantization,
        adapters=adapters,
        adapter_size_gb=adapter_size_gb,
        gpu_memory_per_gpu_gb=gpu_memory_gb,
        # the formula's results
        gpu_memory_gb=memory,
        num_gpus=gpus,
        num_cpus=gpus + 1,
        cpu_memory_gb=math.ceil(memory),
        name=name or DEFAULT_NAME,
        description=description or DEFAULT_DESCRIPTION,
    )


def check_post_url(url: str) -> str:
    """url if the bearer token may be sent there: http(s) with a host, no credentials in it, and https
    unless the host is a loopback address (the token must not cross a network in clear text).
    ValueError says why not."""
    if has_control_characters(url) or any(ch.isspace() for ch in url):
        raise ValueError("the URL contains spaces or control characters")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the URL are not allowed; the token comes from --token-env")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(f"https is required for {parts.hostname} (http only for loopback hosts)")
    return url


def is_loopback(host: str) -> bool:
    """Whether host names this machine: localhost or an address in 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follow no redirect: the Authorization header must reach the given URL and nothing else."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 (urllib's signature)
        return None  # urllib then raises HTTPError with the 3xx response


MAX_REPLY_BYTES = 1 << 20  # a hardware-specification reply is a few kB of JSON


def _read_capped(resp: Any) -> bytes:
    """The reply's body, read a chunk at a time up to MAX_REPLY_BYTES (a bigger one is an error, not memory)."""
    chunks, size = [], 0
    while chunk := resp.read1(64 * 1024):
        size += len(chunk)
        if size > MAX_REPLY_BYTES:
            raise InputError(
                "--post", f"the reply is larger than {MAX_REPLY_BYTES // 1024} KiB: not a hardware spec reply"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _exchange(opener: Any, req: Any, url: str, timeout_s: float) -> tuple[int, bytes, str | None]:
    """(status, body, Location of a 3xx) of one request, within timeout_s in all: the socket's timeout
    bounds each read only, so a server that answers a byte at a time is cut off by a deadline (the
    request runs in a daemon thread; the command ends when the deadline passes)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            try:
                with opener.open(req, timeout=timeout_s) as resp:
                    box["reply"] = (resp.status, _read_capped(resp), None)
            except urllib.error.HTTPError as exc:
                location = exc.headers.get("Location") if 300 <= exc.code < 400 else None
                box["reply"] = (exc.code, _read_capped(exc), location)
        except InputError as exc:
            box["error"] = exc
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            box["error"] = InputError("--post", f"cannot reach {url}: {getattr(exc, 'reason', exc)}")

    worker = threading.Thread(target=run, name="deploy-spec-post", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise InputError("--post", f"no complete reply from {url} within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["reply"]


def post_hardware_spec(
    url: str, body: dict[str, Any], token_env: str = "TOKEN", timeout_s: float = 30.0
) -> dict[str, Any]:
    """POST the body to url with 'Authorization: Bearer $<token_env>' (the watsonx.ai hardware-specification guide's curl); the reply.

    Returns {"status": int, "ok": bool, "body": parsed JSON or text}. Sends only to the given URL:
    https unless the host is loopback, and redirects are not followed (a 3xx reply is returned, not
    ok, with its Location as "redirect"), so the token never reaches another origin.
    """
    try:
        check_post_url(url)
    except ValueError as exc:
        raise InputError("--post", str(exc)) from None
    token = os.environ.get(token_env)
    if not token:
        raise InputError("--token-env", f"environment variable {token_env} is not set (it must hold the bearer token)")
    if has_control_characters(token) or not token.isascii():  # an HTTP header value: one line of ASCII
        raise InputError(
            "--token-env",
            f"environment variable {token_env} holds a line break, a control or a "
            "non-ASCII character (its value is not shown)",
            allowed="one line of printable ASCII",
        )
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "Accept": "application/json"},
    )
    handlers: list[Any] = [_NoRedirects()]
    if is_loopback(urllib.parse.urlsplit(url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))  # this machine: never through a proxy
    opener = urllib.request.build_opener(*handlers)
    status, raw, redirect = _exchange(opener, req, url, timeout_s)
    text = raw.decode(errors="replace").replace(token, "***")  # a server that echoes the request shows no token
    try:
        parsed: Any = json.loads(text) if text else None
    except json.JSONDecodeError:
        parsed = text
    out: dict[str, Any] = {"status": status, "ok": 200 <= status < 300, "body": parsed}
    if redirect is not None:
        out["redirect"] = f"{redirect} (not followed: the token is sent to the given URL only)"
    return out
