# docintel: `make demo` runs the pipeline on the bundled demo corpus; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_OUT ?= demo-out

.PHONY: demo test lint install clean

$(BIN)/docintel: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/docintel

demo: install
	rm -rf $(DEMO_OUT)
	$(BIN)/docintel run data/demo/documents.parquet $(DEMO_OUT)

test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache
