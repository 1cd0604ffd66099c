"""The NPU tier: the emulator tier's parity cases with real torch_npu on an Ascend device.

    pytest -m npu tests/selfcheck/test_npu_tier.py

Every test here is marked `npu`; tests/conftest.py deselects them unless `-m` mentions npu,
so a CPU run reports them as deselected (never passed, never skipped). torch_npu is imported
only inside fixtures, so collection works anywhere. Cases and comparisons are the shared ones
of `vllm_npu_ext.selfcheck.parity_tables` / `parity_cases`: the fused operator runs on the NPU,
the reference on the CPU in float32, under the tolerances of `vllm_npu_ext.selfcheck.tolerances`.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vllm_npu_ext.selfcheck.parity_tables import UNIT_CASES, qwen3_cases
from vllm_npu_ext.selfcheck.plan import FULL, TINY_MODELS

pytestmark = pytest.mark.npu

ALL_KERNELS = ("list", "custom")
DEVICE_CASES = [c for c in UNIT_CASES if c.kwargs.get("kernel") != "custom"]
QWEN3_CASES = qwen3_cases(update_kernels=("list",))
CUSTOM_OP_CASES = [
    c
    for c in UNIT_CASES + qwen3_cases(update_kernels=("custom",))
    if c.kwargs.get("kernel") == "custom"
]


@pytest.fixture(scope="module")
def torch_npu():
    """The real torch_npu module; the test fails (not skips) when there is no usable NPU."""
    from vllm_npu_ext import bootstrap
    from vllm_npu_ext.ops import dispatch

    bootstrap.apply(log=False)  # for the engine processes these tests start
    if not dispatch.npu_available():
        pytest.fail("the npu tier needs torch_npu and a usable Ascend NPU; none found here")
    return dispatch.npu_ops_for_device(torch.device("npu"))


def _assert_parity_on_device(torch_npu, case) -> None:
    for parity in case.run(torch_npu, "npu"):
        assert parity.actual.device.type == "npu", f"{case}: {parity.output} came back on the CPU"
        parity.assert_close()


@pytest.mark.parametrize("case", DEVICE_CASES, ids=str)
def test_fused_op_matches_cpu_reference_on_device(torch_npu, case):
    _assert_parity_on_device(torch_npu, case)


@pytest.mark.parametrize("case", QWEN3_CASES, ids=str)
def test_fused_op_matches_cpu_reference_at_qwen3_embedding_shapes(torch_npu, case):
    _assert_parity_on_device(torch_npu, case)


@pytest.mark.npu_custom_op
@pytest.mark.parametrize("case", CUSTOM_OP_CASES, ids=str)
def test_custom_attention_update_matches_cpu_reference(torch_npu, case):
    from vllm_npu_ext.cann_ops.binding import custom_kernel_available

    if not custom_kernel_available(torch.device("npu")):
        pytest.fail(
            "NpuExtAttentionUpdate is not installed: build and install vllm_npu_ext/cann_ops "
            "(its README), or leave these cases out with -m 'npu and not npu_custom_op'"
        )
    _assert_parity_on_device(torch_npu, case)


TINY_RUN_IDS = [f"{name}-{dtype}" for name, dtype in FULL.tiny_runs]


@pytest.mark.parametrize(("name", "dtype"), FULL.tiny_runs, ids=TINY_RUN_IDS)
def test_tiny_model_npu_path_matches_hf(torch_npu, tmp_path, name, dtype):
    """The engine's NPU path, forward_packed under every fusion configuration, vs HF: head_dim
    32 (npu_fusion_attention) and, in bfloat16, head_dim 128 (npu_fused_infer_attention_score)."""
    from vllm_npu_ext.selfcheck.model_check import check_model
    from vllm_npu_ext.tiny_model import make_tiny_model

    tiny = make_tiny_model(tmp_path / name, **TINY_MODELS[name])
    results = check_model(name, tiny, dtype, emulate=False, workdir=tmp_path)
    failed = [r.line() for r in results if r.failed]
    assert not failed, "\n".join(failed + [d for r in results for d in r.details])
    assert any(r.fields.get("check") == "engine-vs-hf" for r in results)


def test_selfcheck_command_passes_on_device(torch_npu, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_NPU_EXT_SELFCHECK_EMULATE"}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_npu_ext.cli", "selfcheck", "--quick",
         "--parts", "ops,bench,doctor", "--workdir", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "emulated" not in done.stdout
    assert done.stdout.splitlines()[-1].startswith("SUMMARY PASS")
