"""The torch_npu stand-in's host-backed `npu` device (tests/emulator/npu_device), on this
stack's torch.

Installing the stand-in renames torch's PrivateUse1 backend for the rest of a process, so the
device's tests run in a pytest process of their own, started here: on the vLLM 0.32 stack
(torch 2.13) and the vLLM 0.23 one (torch 2.11), as each suite runs this file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NPU_DEVICE_RUN = "VLLM_NPU_EXT_TEST_NPU_DEVICE_RUN"


def test_the_npu_device_tests_pass_in_their_own_process():
    env = {**os.environ, NPU_DEVICE_RUN: "1"}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "npu_device")],
        cwd=HERE.parents[1], env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    summary = completed.stdout.strip().splitlines()[-1] if completed.stdout.strip() else ""
    assert completed.returncode == 0, completed.stdout[-8000:] + completed.stderr[-4000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 60, summary
    assert "failed" not in summary and "error" not in summary and "skipped" not in summary
