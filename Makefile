# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# An index pip also looks at, e.g. https://download.pytorch.org/whl/cpu for torch's CPU build
# (2.13.0+cpu satisfies constraints.txt's torch==2.13.0); empty: pip's configured indexes only.
TORCH_INDEX ?=

.PHONY: install install-demo demo test test-all bench gpu-test clean tensorboard report

# Two installs, two stamps: `make demo` installs what the demo runs (tbmem, torch, TensorBoard and the
# trainers' PhiFlow/Hydra: the `demo` extra); `make test` adds the test stack on top (`all,dev`:
# pytest, playwright, JupyterLab, W&B, MLflow, moto, ...). Each reinstalls when the dependency list changes.
# -c constraints.txt pins the versions (torch 2.13.0); which torch build pip picks depends on its indexes:
# PyPI's Linux wheel is the multi-GB CUDA build, PyTorch's CPU index (TORCH_INDEX) or a local wheel (pip's
# find-links) the CPU build. README.md.
# tbmem/_internal/census/_gcwalk.c and the snapshot reader's compiled parts (tbmem/_internal/snapshot/_creader.h, _creader.c,
# _pickle_run.c, _pair.c) are compiled by the install (optional C extensions, setup.py): rebuilt
# when they change.
# The CPU allocation recorder (tbmem/_internal/snapshot/_cpu_alloc_recorder.cpp) needs torch's headers, so it is
# compiled after the install, into ~/.cache/tbmem (`tbmem snapshot build-recorder`); without a C++ compiler CPU
# snapshots use the slower dispatch-mode recorder.
# Each phase says what it does and how long it usually takes (scripts/phase.py; the times are those of
# benchmarks/install.json): pip is quiet for most of a phase, while it unpacks the wheels it collected
# ("Installing collected packages: ..."; torch alone is 15,000 files), and phase.py says every 20 s that it
# is still going. --no-build-isolation: tbmem is built with the venv's setuptools (phase 2), not in a second
# environment pip would make for the build. --no-compile: Python compiles the modules a program imports on first use instead of pip
# compiling all of them (200 MB of .pyc, most of the quiet time).
PIP := $(BIN)/python -m pip install --no-compile --progress-bar on -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
PHASE := $(PYTHON) scripts/phase.py
PIP_PHASE := $(PHASE) --quiet-note "pip is quiet while it resolves, builds and unpacks"
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml setup.py constraints.txt tbmem/_internal/census/_gcwalk.c tbmem/_internal/snapshot/_creader.h \
          tbmem/_internal/snapshot/_creader.c tbmem/_internal/snapshot/_pickle_run.c tbmem/_internal/snapshot/_pair.c \
          tbmem/_internal/snapshot/_cpu_alloc_recorder.cpp
	@echo "== make demo: 4 install phases, then the two trainings (about 120 s of CPU and 1.14 GB the first time; README.md)"
	@$(PHASE) "1/4" "creating $(VENV)" 10 -- $(PYTHON) -m venv $(VENV)
	@$(PIP_PHASE) "2/4" "installing torch 2.13.0 (the CPU build: 190 MB, 750 MB unpacked) and setuptools" 25 -- $(PIP) torch 'setuptools>=68' wheel
	@$(PIP_PHASE) "3/4" "installing tbmem (compiling its C extensions) with TensorBoard, PhiFlow, SciPy and Hydra" 35 -- $(PIP) --no-build-isolation -e '.[demo]'
	@$(PHASE) "4/4" "compiling the CPU snapshot recorder against torch's headers" 8 -- $(BIN)/tbmem snapshot build-recorder || true
	touch $@

# make test's install: make demo's, then the test stack
$(STAMP): $(DEMO_STAMP)
	@echo "== make test's install: the test stack on top of make demo's (about 116 s of CPU and 0.82 GB more the first time)"
	@$(PIP_PHASE) "1/2" "installing the test stack: pytest, playwright, JupyterLab, pandas, W&B, MLflow, moto" 120 -- $(PIP) --no-build-isolation -e '.[all,dev]'
	@$(PHASE) "2/2" "registering the notebook kernel" 3 -- $(BIN)/python -m ipykernel install --sys-prefix --name python3
	touch $@

# make report's: make demo's, then the analysis extra `tbmem report` reads runs with (pandas; the test stack has it)
REPORT_STAMP := $(VENV)/.installed-report
$(REPORT_STAMP): $(DEMO_STAMP)
	@$(PIP_PHASE) "1/1" "installing what tbmem report reads runs with: pandas (the analysis extra)" 10 -- $(PIP) --no-build-isolation -e '.[analysis]'
	touch $@

install: $(STAMP)

install-demo: $(DEMO_STAMP)

# The trainers' own "View the run with" line is left out here: the demo ends with one command for both runs.
demo: export TBMEM_DEMO = 1
demo: $(DEMO_STAMP)
	$(BIN)/python run.py --config-name=burgers_quick_test trainer=synthetic_with_memory
	$(BIN)/python run.py --config-name=burgers_physical_quick_test trainer=physical_with_memory
	@echo
	@echo "View the runs:   make tensorboard   (the same as $(BIN)/tensorboard --logdir runs --host 127.0.0.1; Ctrl-C stops it)"
	@echo "                 then open http://127.0.0.1:6006/#tbmem: the Memory tab, every record drawn unsmoothed"
	@echo "                 TensorBoard smooths its own tabs (0.6: a memory step becomes a ramp). Unsmoothed:"
	@echo "                 Time Series: http://127.0.0.1:6006/?smoothing=0#timeseries (the address reaches Time Series only)"
	@echo "                 Scalars: drag its Smoothing slider to 0"
	@echo "Summarise them:  make report        (the first time it adds pandas, the analysis extra; then the same as $(BIN)/tbmem report runs)"

# The demo's two closing commands, on what make demo made. TB_PORT: another port where 6006 is taken.
TB_PORT ?= 6006
tensorboard:
	$(BIN)/tensorboard --logdir runs --host 127.0.0.1 --port $(TB_PORT)

report: $(REPORT_STAMP)
	$(BIN)/tbmem report runs

# Test tiers (tests/slow.txt): make test is the fast tier and one end-to-end run of each trainer (about 6 minutes
# on 2 cores), in TEST_WORKERS processes (pytest-xdist; a test file stays in one, tests/conftest.py's groups, so
# its module's server or browser starts once; `auto`: one per CPU, 0: none); make test-all is every test, in one
# process (CI's .ci/run).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -m "not gpu and (not slow or e2e)" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

gpu-test: $(STAMP)
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
