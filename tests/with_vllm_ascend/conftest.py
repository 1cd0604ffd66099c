"""vllm-ascend 0.23.0.post1's own code, run with the plugin under the torch_npu stand-in.

These tests run only with vllm-ascend on the path (`make test-vllm-ascend`: the
`.venv-ascend/vllm-ascend` directory written by scripts/install_vllm_ascend.py, on PYTHONPATH),
in a pytest process whose vLLM platform is vllm-ascend's `NPUPlatform`. The stand-in is in
place before vLLM resolves the platform: `VLLM_NPU_EXT_EMULATE=1` makes our platform plugin
install it (`vllm_npu_ext.bootstrap.platform_plugin`), and this file installs it too, before
anything imports vLLM's platforms.

Nothing of vllm-ascend is mocked: its modules are imported and called as its platform and
worker do. What the stand-in cannot run (C++ kernels, the `acl` runtime, graph capture) is
named by the error it raises.
"""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

os.environ["VLLM_NPU_EXT_EMULATE"] = "1"
from vllm_npu_ext import emulator  # noqa: E402

emulator.install_stand_in()

PINNED_VERSION = "0.23.0.post1"


def pytest_configure(config):
    distribution = importlib.metadata.distribution("vllm-ascend")
    if distribution.version != PINNED_VERSION:
        raise pytest.UsageError(
            f"vllm-ascend {distribution.version} on the path; these tests need {PINNED_VERSION} "
            "as `make setup-ascend` installs it"
        )


@pytest.fixture(scope="session")
def vllm_ascend_started():
    """This process started as a vLLM process on Ascend (`start_like_a_vllm_ascend_process`)."""
    from support.vllm_ascend_env import start_like_a_vllm_ascend_process

    return start_like_a_vllm_ascend_process()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from vllm_npu_ext.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


def pytest_terminal_summary(terminalreporter):
    """The torch_npu / torch.npu names the code under test read in this process (evidence of
    what vllm-ascend needs from torch_npu on these paths; spawned ranks are not counted)."""
    from vllm_npu_ext.emulator.runtime import registry as _runtime
    from vllm_npu_ext.emulator.runtime import strict as _strict

    names = sorted(_strict.touched)
    operators = sorted(op for op, count in _runtime.calls.items() if count)
    terminalreporter.write_line(
        f"torch_npu stand-in: {len(names)} names read: {', '.join(names) or 'none'}"
    )
    terminalreporter.write_line(
        f"torch_npu stand-in: operators called (since the last count reset): "
        f"{', '.join(operators) or 'none'}"
    )
