# The README's two commands: `make demo` and `make test`. Both work on a fresh clone with Python 3.11 + pip.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch lies on disk; installing it first stops pip from pulling a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	# verl for the plug-in tests, without its pins (it would downgrade transformers): only what
	# verl.trainer.ppo.core_algos imports. Users install it with `pip install satrl[verl]`.
	$(BIN)/pip install -q --no-deps verl==0.9.1
	$(BIN)/pip install -q "tensordict>=0.8.0,<=0.10.0,!=0.9.0" omegaconf hydra-core codetiming
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

test: $(STAMP) lint
	# SATRL_REQUIRE_EXTRAS=1: the Ray and verl tests must run, never skip. pytest exits 5 when it collects
	# no tests in a selection: not a failure.
	SATRL_REQUIRE_EXTRAS=1 $(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

demo: $(STAMP)
	$(BIN)/satrl demo --out runs/demo

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
