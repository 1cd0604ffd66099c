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


def test_the_merge_pairs_in_a_full_graph_ours_launches_fewer_tasks_and_needs_no_update():
    """`bench_cp_merge.py --decode-step --full-graph`: each pair captured in one graph, then
    replayed on new inputs. Both replay what they run eagerly; neither needs a task update
    between replays; with DCP from a batch of 4 on, ours launches fewer tasks (no permute
    copies), and at a batch of one as many."""
    from support.scripts import load_script

    bench = load_script("benchmarks/bench_cp_merge.py")
    rows = bench.full_graph_table(batches=(1, 4), configs=((1, 2), (2, 2)))
    for row in rows:
        ours, theirs = row["graphs"]["ours"], row["graphs"]["vllm_ascend"]
        assert ours["replay_vs_eager"] == 0 and theirs["replay_vs_eager"] == 0, row
        assert ours["task_updates_per_replay"] == theirs["task_updates_per_replay"] == 0, row
        assert ours["merge"] == theirs["merge"] == 1, row
        assert row["max_difference"] < 1e-5, row
        if row["bs"] == 1:
            assert ours["tasks"] == theirs["tasks"], row
        else:
            assert ours["tasks"] < theirs["tasks"] and ours["copies"] == 2, row
