# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# CPU wheels: a local wheel (pip find-links) or PyTorch's CPU index; plain `torch` from PyPI is a multi-GB CUDA build.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
export WANDB_SILENT := true

.PHONY: demo test lint format bench clean-venv

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_VERSION)" \
		|| $(PY) -m pip install -q "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX)
	$(PY) -m pip install -q -e ".[dev,deploy]"
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.demo default

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/lint-imports

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

bench: $(STAMP)
	$(PY) -m experiments.benchmark default

clean-venv:
	rm -rf $(VENV)
