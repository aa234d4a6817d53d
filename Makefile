# SPDX-License-Identifier: Apache-2.0
# `make test` (CI, no GPU) and `make demo` are the README's two commands; both set up
# everything they need in .venv. gpu-test and bench run on a GPU machine with the Python
# that has PyTorch, Triton and CuPy (PYTHON=python3 there), installing clc into it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BUILD := build/examples
NVCC ?= nvcc

.PHONY: install test-packages test schemas demo gpu-demo gpu-install gpu-test bench bench-colocate clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py \
		$(wildcard shim/LAYERS shim/*.h shim/*/*.c shim/*/*.h shim/*/*.py clc/demo/*.c)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# The packages tests/slurm runs a real cluster with, where missing and the machine allows it;
# before install, so that the SPANK plugin is built against spank.h.
test-packages:
	sh tests/slurm/install-packages.sh

test: test-packages install
	$(VENV)/bin/clang-format --dry-run --Werror shim/*.h shim/*/*.c shim/*/*.h
	$(PY) -m ruff check .
	$(PY) -m pytest tests

# The policy format's JSON schema is built from the loader's key tables (clc/policy/keys.py);
# tests/unit/test_policy_schema.py fails until the shipped file is written again.
schemas: install
	$(PY) -m clc.policy.schema > clc/schemas/policy-1.schema.json.new
	mv clc/schemas/policy-1.schema.json.new clc/schemas/policy-1.schema.json

$(BUILD)/vecadd: examples/vecadd.cu
	mkdir -p $(BUILD)
	$(NVCC) -O2 -arch=sm_90 -o $@ $<

# Without a usable GPU, the same two runs over clc's stand-in driver (clc demo --no-gpu).
demo: install
	@if $(VENV)/bin/clc doctor; then $(MAKE) gpu-demo; else \
	  echo "clc: no usable NVIDIA GPU here: clc demo --no-gpu runs a sample program over clc's stand-in driver instead"; \
	  $(VENV)/bin/clc demo --no-gpu; fi

gpu-demo: $(BUILD)/vecadd
	$(VENV)/bin/clc-run --policy policies/audit.yaml -o $(BUILD)/vecadd.clc --force -- $(BUILD)/vecadd
	$(VENV)/bin/clc-run --policy policies/deny-example.yaml -o $(BUILD)/vecadd-deny.clc --force -- $(BUILD)/vecadd

gpu-install:
	$(PYTHON) -m pip install -q --no-build-isolation --no-deps -e .

gpu-test: gpu-install
	$(PYTHON) -m pytest -m gpu tests/gpu -v -rs

bench: gpu-install
	$(PYTHON) benchmarks/bench_launch.py
	$(PYTHON) benchmarks/bench_wrap.py

# An hour or more: three PyTorch services beside two training jobs, under each way of sharing
# the GPU (needs PyTorch; MPS configurations where its daemon starts). A first look at a
# machine: make bench-colocate COLOCATE_ARGS=--quick
COLOCATE_ARGS ?=
bench-colocate: gpu-install
	$(PYTHON) benchmarks/bench_colocate.py $(COLOCATE_ARGS)

clean:
	rm -rf build $(VENV) *.egg-info clc/libclc_preload.so clc/libclc_spank.so clc/clc-slurm-exec clc/demo/demo_app clc/demo/libcuda.so.1 clc/runtime/_bridge*.so clc/runtime/_bridge.c .pytest_cache
