# Two commands on a fresh clone (README): `make train` trains the default model, `make test` runs the suite. Each
# first makes .venv and installs what the project needs, once: again only when pyproject.toml or the torch build
# changes. torch 2.13.0 comes as TORCH says: cpu, the CPU-only build from PyTorch's own index (the default where no
# NVIDIA driver answers), or cuda, the build PyPI serves (CUDA on Linux; the default where nvidia-smi runs):
#   make test TORCH=cuda
# Overrides for the training run: make train ARGS="norm=layernorm train.time_budget=10m"
PYTHON ?= python3
TORCH ?= $(if $(shell command -v nvidia-smi),cuda,cpu)
CPU_INDEX := https://download.pytorch.org/whl/cpu
VENV := .venv

.PHONY: train test

train: $(VENV)/installed-$(TORCH)
	$(VENV)/bin/python train.py $(ARGS)

test: $(VENV)/installed-$(TORCH)
	WANDB_MODE=disabled $(VENV)/bin/python -m pytest -n 2

# the CPU index serves 2.13.0+cpu, which pip prefers to PyPI's 2.13.0 for torch==2.13.0
$(VENV)/installed-$(TORCH): pyproject.toml
	$(if $(wildcard $(VENV)/installed-$(if $(filter cpu,$(TORCH)),cuda,cpu)),rm -rf $(VENV))  # the other build: anew
	@echo "make: first set-up: $(VENV) with torch 2.13.0 ($(TORCH) build, about 200 MB for cpu, several GB for cuda), then the"
	@echo "make: project and its test and launcher extras (transformers, wandb, Hydra's plugins): a few minutes, once"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --progress-bar on torch==2.13.0 $(if $(filter cpu,$(TORCH)),--extra-index-url $(CPU_INDEX))
	$(VENV)/bin/pip install --progress-bar on -e ".[test,cluster]"
	rm -f $(VENV)/installed-*
	touch $@
