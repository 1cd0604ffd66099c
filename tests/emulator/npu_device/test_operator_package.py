"""Under VLLM_NPU_EXT_EMULATE=1 the stand-in also stands in for our built operator package
(VLLM_NPU_EXT_EMULATE_OPS, default 1): NpuExtAttentionUpdate's host-built AscendC kernel as the
npu device's kernel of `npu_ext_cann::npu_ext_attention_update`, one launch in a graph."""

from __future__ import annotations

import logging

import pytest
import torch

import vllm_npu_ext
from vllm_npu_ext.cann_ops import binding
from vllm_npu_ext.emulator.operators import npu_ext_cann
from vllm_npu_ext.ops.attention_update import attention_update_reference


@pytest.mark.parametrize("value, installs", [("1", 1), (None, 1), ("0", 0)])
def test_the_switch_decides_whether_vllm_processes_get_the_package(monkeypatch, value, installs):
    calls = []
    monkeypatch.setattr(npu_ext_cann, "install_on_npu", lambda: calls.append(1))
    if value is None:
        monkeypatch.delenv("VLLM_NPU_EXT_EMULATE_OPS", raising=False)
    else:
        monkeypatch.setenv("VLLM_NPU_EXT_EMULATE_OPS", value)
    vllm_npu_ext._log_emulated(logging.getLogger("test"))
    assert len(calls) == installs


def test_the_package_runs_on_the_npu_device_and_is_one_task_of_a_graph():
    npu_ext_cann.install_on_npu()
    assert binding.custom_kernel_available("npu")
    lse = torch.randn(2, 6, device="npu")
    out = torch.randn(2, 6, 8, device="npu")
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        merged, _ = torch.ops.npu_ext_cann.npu_ext_attention_update(lse, out, 0)
    assert graph.operators == ["npu_ext_cann.npu_ext_attention_update.default"]
    new_lse, new_out = torch.randn(2, 6), torch.randn(2, 6, 8)
    lse.copy_(new_lse)
    out.copy_(new_out)
    before = npu_ext_cann.calls[npu_ext_cann.OP_NAME]
    graph.replay()
    assert npu_ext_cann.calls[npu_ext_cann.OP_NAME] == before + 1
    expected, _ = attention_update_reference(new_lse, new_out)
    torch.testing.assert_close(merged.cpu(), expected, atol=1e-5, rtol=1e-5)
