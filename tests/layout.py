"""Where things are, for tests in any folder of tests/: the repository, its sources and the test data."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
SRC = REPO / "src"
DATA = TESTS / "data"
