"""The stand-in's host-backed `npu` device (vllm_npu_ext/emulator/device/host_npu), installed.

Installing renames torch's PrivateUse1 backend `npu` for the rest of the process, so these
tests run in a pytest process of their own: tests/emulator/test_npu_device.py starts it on each
stack's interpreter (torch 2.13 with vLLM 0.32, torch 2.11 with vLLM 0.23), and the main suites
do not collect this directory (tests/conftest.py). They need no vLLM and no vllm-ascend.
"""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext import emulator

emulator.install_stand_in()


@pytest.fixture(autouse=True)
def _seed_and_device():
    torch.manual_seed(0)
    torch.npu.set_device(0)
    yield
    torch.npu.set_device(0)
