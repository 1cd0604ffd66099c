"""The CP patch's empty-shard masks inside full decode graphs (patches/vllm_ascend_cp/).

The patched pair is captured in one graph, as vllm-ascend's full decode graph holds it; between
replays only the wrapped CP builder `build` runs on the host (as before a replay on the device)
and writes the step's masks into device memory. A replay must follow the key counts of its own
step, not those of the capture, whatever FIA wrote for a rank without keys (here NaN, an lse of
50). The unit tests below run one rank; `test_cp_graph_masks_ranks.py` runs CP groups.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy
import pytest
import torch

from vllm_npu_ext.emulator.operators import npu_ext_cann
from vllm_npu_ext.ops.attention_update import MergeKernel
from vllm_npu_ext.patches.vllm_ascend_cp import masks
from vllm_npu_ext.patches.vllm_ascend_cp import merge as merge_module
from vllm_npu_ext.patches.vllm_ascend_cp.kernel import KernelChoice
from vllm_npu_ext.patches.vllm_ascend_cp.merge import CPMerge, GraphMasksMissing

HEADS, HEAD_DIM = 4, 64
NPU = torch.device("npu")


@pytest.fixture
def one_rank(monkeypatch):
    """A CP group of one, our CANN operator on the npu device."""
    npu_ext_cann.install_on_npu()
    single = (SimpleNamespace(world_size=1, rank_in_group=0, device_group=None),) * 2
    monkeypatch.setattr(merge_module, "cp_group_coordinators", lambda: single)

    def make(kernel="custom", shards_can_be_empty=True, graph_rows=0):
        return CPMerge(kernel=KernelChoice(MergeKernel(kernel)),
                       shards_can_be_empty=shards_can_be_empty, graph_rows=graph_rows)

    return make


def build_step(merge: CPMerge, lengths):
    """vllm-ascend's CP builder `build` as the patch wraps it, for a step with these key counts
    (`[bs, pcp, dcp]`; None: a step without decodes)."""
    decode = None if lengths is None else SimpleNamespace(
        num_computed_tokens_of_pcp_dcp=numpy.asarray(lengths))  # fmt: skip
    build = merge.refresh_after(lambda self, metadata: metadata)
    return build(None, SimpleNamespace(decode_meta=decode))


def fia_results(bs, garbage_rows, generator):
    """FIA's `[bs, dcp*H, D]` out and `[bs, dcp*H, 1]` lse (one DCP block here), with garbage
    in the rows of requests without keys."""
    out = torch.randn(bs, HEADS, HEAD_DIM, generator=generator).bfloat16()
    lse = torch.randn(bs, HEADS, 1, generator=generator)
    out[garbage_rows], lse[garbage_rows] = float("nan"), 50.0
    return out, lse


def capture_pair(merge, out, lse):
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        merged = merge.npu_attention_update(HEAD_DIM, merge.process_attn_out_lse(out, lse))
    return graph, merged


@pytest.mark.parametrize("kernel", ["custom", "list"])
def test_a_replay_masks_the_requests_of_its_own_step(one_rank, kernel):
    merge, generator, bs = one_rank(kernel), torch.Generator().manual_seed(0), 4
    merge.reserve_graph_masks(bs, NPU, kernel == "list")  # the eager warm-up's
    out, lse = (t.to("npu") for t in fia_results(bs, [], generator))
    graph, merged = capture_pair(merge, out, lse)
    # Steps after the capture: this rank empty for one request, for all, for mixed ones, for
    # none; a step of 3 requests in the 4-row graph (its padding row has no key anywhere).
    steps = {"one empty": [5, 0, 7, 2], "all empty": [0, 0, 0, 0], "mixed": [0, 3, 0, 2],
             "none empty": [5, 3, 7, 2], "padded": [5, 0, 7]}  # fmt: skip
    for name, counts in steps.items():
        empty = [row for row in range(bs) if row >= len(counts) or counts[row] == 0]
        new_out, new_lse = fia_results(bs, empty, generator)
        build_step(merge, [[[count]] for count in counts])
        out.copy_(new_out)
        lse.copy_(new_lse)
        graph.replay()
        result = merged.cpu()
        assert not result.isnan().any(), name
        expected = new_out.float()
        expected[empty] = 0.0
        torch.testing.assert_close(result, expected, msg=name)
    graph.reset()


def test_our_merge_keeps_the_graph_s_task_count_the_tensor_list_one_adds_a_fill(one_rank):
    """With our merge the lse is written through torch.where in place of its copy: as many
    tasks as the graph without masks. torch_npu's TensorList kernel reads a shard's out at
    weight 0, so there the out rows are zeroed too (1 task)."""
    bs, generator = 4, torch.Generator().manual_seed(1)
    out, lse = (t.to("npu") for t in fia_results(bs, [], generator))
    tasks = {}
    for kernel, carried in (("custom", False), ("custom", True), ("list", False),
                            ("list", True)):  # fmt: skip
        merge = one_rank(kernel, shards_can_be_empty=carried)
        merge.reserve_graph_masks(bs, NPU, kernel == "list")
        graph, _ = capture_pair(merge, out, lse)
        tasks[kernel, carried] = list(graph.operators)
        graph.reset()
    assert len(tasks["custom", True]) == len(tasks["custom", False])
    assert "aten.where.self_out" in tasks["custom", True]
    assert "aten.where.self_out" not in tasks["custom", False]
    assert len(tasks["list", True]) == len(tasks["list", False]) + 1


@pytest.mark.parametrize("reserved", [0, 2])
def test_a_graph_that_needs_masks_and_has_none_is_refused_naming_the_fix(one_rank, reserved):
    """Fail closed: no eager step reserved masks for this size (none, or fewer rows)."""
    merge, generator = one_rank(), torch.Generator().manual_seed(2)
    if reserved:
        merge.reserve_graph_masks(reserved, NPU, False)
    out, lse = (t.to("npu") for t in fia_results(4, [], generator))
    with pytest.raises(GraphMasksMissing, match="VLLM_NPU_EXT_CP_PATCH=0"):
        capture_pair(merge, out, lse)


def test_no_masks_where_no_decode_step_can_leave_a_rank_without_keys(one_rank):
    merge, generator = one_rank(shards_can_be_empty=False), torch.Generator().manual_seed(3)
    merge.reserve_graph_masks(4, NPU, False)
    assert merge.graph_masks is None
    out, lse = (t.to("npu") for t in fia_results(4, [], generator))
    graph, _ = capture_pair(merge, out, lse)
    assert "aten.where.self_out" not in graph.operators
    graph.reset()


def test_masks_are_reserved_for_the_largest_graph_and_kept_while_a_graph_reads_them(one_rank):
    merge = one_rank(graph_rows=8)
    merge.reserve_graph_masks(2, NPU, False)  # an eager step of 2 rows: 8 reserved
    first = merge.graph_masks
    assert first.capacity == 8
    merge.reserve_graph_masks(4, NPU, False)  # smaller: the same
    assert merge.graph_masks is first
    merge.reserve_graph_masks(16, NPU, False)  # larger, none captured: grown
    grown = merge.graph_masks
    assert grown is not first and grown.capacity == 16
    assert merge.graph_rows_for(8, NPU)[0].shape == (8,)  # read by a capture
    merge.reserve_graph_masks(32, NPU, False)
    assert merge.graph_masks is grown  # never reallocated once read


def test_the_builder_writes_masks_from_one_pinned_buffer_once_a_graph_reads_them(one_rank):
    merge = one_rank()
    merge.reserve_graph_masks(3, NPU, False)
    holder = merge.graph_masks
    assert holder.host.is_pinned() and holder.host.device.type == "cpu"
    host = holder.host.data_ptr()
    build_step(merge, [[[1]], [[1]]])
    assert holder.empty.cpu().all()  # not captured yet: left as allocated
    merge.graph_rows_for(3, NPU)
    build_step(merge, [[[1]], [[0]]])
    assert holder.empty.cpu().tolist() == [False, True, True]
    assert holder.fill.cpu()[1:].isneginf().all()
    build_step(merge, None)  # a step without decodes
    assert holder.empty.cpu().all()
    assert holder.host.data_ptr() == host  # the same host buffer every step


@pytest.mark.parametrize(
    "dcp, pcp, interleave, possible",
    [(2, 1, 1, False), (1, 2, 1, False), (2, 2, 1, True), (4, 1, 1, True), (2, 1, 2, True),
     (1, 1, 1, False)],
)  # fmt: skip
def test_masks_only_where_a_decode_step_can_leave_a_rank_without_keys(
    dcp, pcp, interleave, possible
):
    parallel = SimpleNamespace(decode_context_parallel_size=dcp,
                               prefill_context_parallel_size=pcp,
                               cp_kv_cache_interleave_size=interleave)  # fmt: skip
    config = SimpleNamespace(parallel_config=parallel)
    assert masks.decode_shards_can_be_empty(config) is possible
    assert masks.decode_shards_can_be_empty(None) is True
