"""The prepared device call of docs/benchmarks/gpu.md: benchmarks/gpu_wheels.txt carries every requirement of
tunebench that the device image lacks, pinned, and benchmarks/gpu_check.sh is a script bash can read."""

from __future__ import annotations

import re
import subprocess
import tomllib

from layout import REPO


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_the_wheels_cover_what_the_device_image_lacks():
    lines = (REPO / "benchmarks" / "gpu_wheels.txt").read_text().splitlines()
    (image,) = [line.split(":", 1)[1].split() for line in lines if line.startswith("# on the image:")]
    pinned = [line for line in lines if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+-]*", line) for line in pinned), pinned
    carried = {_name(line) for line in pinned}
    required = {_name(r) for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    assert required - set(image) - carried == set()  # each requirement is there or travels
    assert "bitsandbytes" in carried  # QLoRA's gpu tests
    assert len(carried) == len(pinned)  # one version of each: two stop the whole install


def test_the_check_script_is_valid_bash_and_writes_what_comes_back():
    script = REPO / "benchmarks" / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    outputs = set(re.findall(r"\$OUT/([A-Za-z0-9_.-]+)", text))
    assert outputs == {"env.txt", "pytest_gpu.log", "runs.jsonl", "runs.err"}  # at most 8 files come back
    assert "pytest -m gpu" in text and "--target /tmp/site .whl/*.whl" in text
