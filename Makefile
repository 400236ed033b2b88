# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# An index pip also looks at, e.g. https://download.pytorch.org/whl/cpu for torch's CPU build
# (2.13.0+cpu satisfies constraints.txt's torch==2.13.0); empty: pip's configured indexes only.
TORCH_INDEX ?=

.PHONY: install demo test bench gpu-test clean

# Reinstall when the dependency list changes. -c constraints.txt pins the versions (torch 2.13.0);
# which torch build pip picks depends on its indexes: PyPI's Linux wheel is the multi-GB CUDA build,
# PyTorch's CPU index (TORCH_INDEX) or a local wheel (pip's find-links) the CPU build. README.md.
# tbmem/census/_gcwalk.c and the snapshot reader's compiled parts (tbmem/snapshot/_creader.h, _creader.c,
# _pickle_run.c, _pair.c) are compiled by the install (optional C extensions, setup.py): rebuilt
# when they change.
# The CPU allocation recorder (tbmem/snapshot/_cpu_alloc_recorder.cpp) needs torch's headers, so it is
# compiled after the install, into ~/.cache/tbmem (tbmem.snapshot.native); without a C++ compiler CPU
# snapshots use the slower dispatch-mode recorder.
# pip is not quiet: on a fresh clone the install takes 2-3 minutes, and its lines (Collecting ...,
# the download bars, Installing ...) show that it is going.
$(STAMP): pyproject.toml setup.py constraints.txt tbmem/census/_gcwalk.c tbmem/snapshot/_creader.h \
          tbmem/snapshot/_creader.c tbmem/snapshot/_pickle_run.c tbmem/snapshot/_pair.c \
          tbmem/snapshot/_cpu_alloc_recorder.cpp
	@echo "== creating $(VENV) and installing tbmem with its dependencies (2-3 minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e '.[all,dev]'
	@echo "== compiling the CPU snapshot recorder (about 4 s)"
	-$(BIN)/python -m tbmem.snapshot.native
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python run.py --config-name=burgers_quick_test trainer=synthetic_with_memory
	$(BIN)/python run.py --config-name=burgers_physical_quick_test trainer=physical_with_memory
	@echo
	@echo "View the runs:   $(BIN)/tensorboard --logdir runs --host 127.0.0.1"
	@echo "                 then http://127.0.0.1:6006/?smoothing=0 (?smoothing=0: lines unsmoothed)"
	@echo "Summarise them:  $(BIN)/tbmem report runs"

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

gpu-test: $(STAMP)
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
