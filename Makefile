# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: install demo test bench gpu-test clean

# Reinstall when the dependency list changes. -c constraints.txt pins torch to the CPU build
# on this machine's disk (an unpinned torch pulls a multi-GB CUDA build).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[all,dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python run.py --config-name=burgers_quick_test trainer=synthetic_with_memory
	$(BIN)/python run.py --config-name=burgers_physical_quick_test trainer=physical_with_memory
	@echo
	@echo "View the runs:   $(BIN)/tensorboard --logdir runs --host 127.0.0.1"
	@echo "Summarise them:  $(BIN)/tbmem report runs"

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

gpu-test: $(STAMP)
	$(BIN)/python -m pytest -m gpu $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
