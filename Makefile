# Quick start: `make run` (daemon on the embedded default: CPU, state under ./var/)
# and `make test` (whole suite). Both create .venv when it is missing.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,kernelcheck]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gated run

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check gated tests bench

bench: $(STAMP)
	$(BIN)/python bench/bench_step.py

clean:
	rm -rf $(VENV) var build *.egg-info
