"""The suite's skip policy (tests/conftest.py), run as real pytest subprocesses on sample test files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import HAVE_GPU

HERE = Path(__file__).parent

SAMPLES = {
    "test_plain_skip.py": "import pytest\n\ndef test_a():\n    pytest.skip('optional thing missing')\n",
    "test_import_skip.py": "import pytest\npytest.importorskip('no_such_module_tb')\n\ndef test_b():\n    pass\n",
    "test_skipif.py": "import pytest\n\n@pytest.mark.skipif(True, reason='never here')\ndef test_c():\n    pass\n",
    "test_gpu_sample.py": "import pytest\n\n@pytest.mark.gpu\ndef test_d():\n    assert False, 'ran'\n",
    "test_ok.py": "def test_e():\n    assert 1 + 1 == 2\n",
}


def pytest_in(tmp_path: Path, *files: str) -> subprocess.CompletedProcess:
    shutil.copy(HERE / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -ra\nmarkers =\n    gpu: needs an NVIDIA GPU\n")
    for name in files:
        (tmp_path / name).write_text(SAMPLES[name])
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
        "-c",
        str(tmp_path / "pytest.ini"),
        *files,
    ]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_skip_outside_the_gpu_marker_fails_and_names_its_reason(tmp_path):
    proc = pytest_in(tmp_path, "test_plain_skip.py", "test_skipif.py", "test_ok.py")
    assert proc.returncode == 1, proc.stdout
    # a skip in the call is a failure, a skipif (evaluated in setup) an error; nothing reads "skipped"
    assert proc.stdout.splitlines()[-1].startswith("1 failed, 1 passed, 1 error in ")
    assert "tests never skip silently): optional thing missing" in proc.stdout
    assert "tests never skip silently): never here" in proc.stdout


def test_a_module_skipping_at_import_is_a_collection_error(tmp_path):
    proc = pytest_in(tmp_path, "test_import_skip.py", "test_ok.py")
    assert proc.returncode != 0, proc.stdout
    assert "Interrupted: 1 error during collection" in proc.stdout  # pytest stops: nothing passes quietly
    assert "skipped at import" in proc.stdout and "no_such_module_tb" in proc.stdout


def test_gpu_tests_are_skipped_and_reported_only_without_a_gpu(tmp_path):
    proc = pytest_in(tmp_path, "test_gpu_sample.py", "test_ok.py")
    if HAVE_GPU:  # the gpu test runs (and its assert False fails)
        assert proc.returncode == 1 and "1 failed, 1 passed" in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 0, proc.stdout
        assert "1 passed, 1 skipped" in proc.stdout
        assert "SKIPPED [1] test_gpu_sample.py:3: needs an NVIDIA GPU" in proc.stdout  # -ra's summary
