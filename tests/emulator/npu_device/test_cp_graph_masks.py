"""The CP patch's empty-shard masks inside a full decode graph (patches/vllm_ascend_cp.py).

The patched pair is captured in one graph, as vllm-ascend's full decode graph holds it; between
replays only the wrapped CP builder `build` runs on the host (as before a replay on the device)
and writes the step's masks into device memory. A replay must follow the key counts of its own
step, not those of the capture, whatever FIA wrote for a rank without keys (here NaN, an lse of
50), and add no task to the graph with our merge.

One rank runs the pair (CP group of one, key counts `[bs, 1, 1]`): a request it holds no key of
has no key anywhere, so it merges to 0 (which ranks' counts make a row empty is
tests/patches/test_vllm_ascend_cp.py's).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy
import pytest
import torch

from vllm_npu_ext.emulator.operators import npu_ext_cann
from vllm_npu_ext.ops.attention_update import MergeKernel
from vllm_npu_ext.patches import vllm_ascend_cp

HEADS, HEAD_DIM = 4, 64


@pytest.fixture
def cp_rank(monkeypatch):
    """One rank, masks possible, none reserved yet."""
    npu_ext_cann.install_on_npu()
    coordinators = (
        SimpleNamespace(world_size=1, rank_in_group=0, device_group=None),
        SimpleNamespace(world_size=1, rank_in_group=0, device_group=None),
    )
    monkeypatch.setattr(vllm_ascend_cp, "cp_group_coordinators", lambda: coordinators)
    monkeypatch.setattr(vllm_ascend_cp, "_device_groups", lambda: (None, None))
    monkeypatch.setattr(vllm_ascend_cp, "_graph_masks", None)
    monkeypatch.setattr(vllm_ascend_cp, "_decode_shards_can_be_empty", True)


def build_step(lengths):
    """vllm-ascend's CP builder `build` as the patch wraps it, for a step with these key counts
    (`[bs, pcp, dcp]`; None: a step without decodes)."""
    decode = None if lengths is None else SimpleNamespace(
        num_computed_tokens_of_pcp_dcp=numpy.asarray(lengths)
    )  # fmt: skip
    build = vllm_ascend_cp._refreshing_masks(lambda self, metadata: metadata)
    return build(None, SimpleNamespace(decode_meta=decode))


def fia_results(bs, garbage_rows, generator):
    """FIA's `[bs, dcp*H, D]` out and `[bs, dcp*H, 1]` lse (one DCP block here), with garbage
    in the rows of requests without keys."""
    out = torch.randn(bs, HEADS, HEAD_DIM, generator=generator).bfloat16()
    lse = torch.randn(bs, HEADS, 1, generator=generator)
    out[garbage_rows], lse[garbage_rows] = float("nan"), 50.0
    return out, lse


def capture_pair(bs, out, lse):
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        merged = vllm_ascend_cp.npu_attention_update(
            HEAD_DIM, vllm_ascend_cp.process_attn_out_lse(out, lse)
        )
    return graph, merged


@pytest.mark.parametrize("kernel", ["custom", "list"])
def test_a_replay_masks_the_requests_of_its_own_step(cp_rank, monkeypatch, kernel):
    monkeypatch.setattr(vllm_ascend_cp, "_merge_kernel", MergeKernel(kernel))
    generator = torch.Generator().manual_seed(0)
    bs = 4
    vllm_ascend_cp._reserve_graph_masks(bs, torch.device("npu"))  # the eager warm-up's
    out, lse = (t.to("npu") for t in fia_results(bs, [], generator))
    graph, merged = capture_pair(bs, out, lse)
    # Steps after the capture: this rank empty for one request, for all, for mixed ones, for
    # none; a step of 3 requests in the 4-row graph (its padding row has no key anywhere).
    steps = {
        "one empty": [5, 0, 7, 2],
        "all empty": [0, 0, 0, 0],
        "mixed": [0, 3, 0, 2],
        "none empty": [5, 3, 7, 2],
        "padded": [5, 0, 7],
    }
    for name, counts in steps.items():
        lengths = [[[count]] for count in counts]
        empty = [row for row in range(bs) if row >= len(counts) or counts[row] == 0]
        new_out, new_lse = fia_results(bs, empty, generator)
        build_step(lengths)
        out.copy_(new_out)
        lse.copy_(new_lse)
        graph.replay()
        result = merged.cpu()
        assert not result.isnan().any(), name
        expected = new_out.float()
        expected[empty] = 0.0
        torch.testing.assert_close(result, expected, msg=name)
    graph.reset()


def test_our_merge_keeps_the_graph_s_task_count_the_tensor_list_one_adds_fills(
    cp_rank, monkeypatch
):
    """With our merge the lse is written through torch.where in place of its copy: as many
    tasks as the graph without masks. torch_npu's TensorList kernel reads a shard's out at
    weight 0, so there the out rows and the all-empty rows are filled too (2 tasks)."""
    bs, generator = 4, torch.Generator().manual_seed(1)
    out, lse = (t.to("npu") for t in fia_results(bs, [], generator))
    tasks = {}
    for kernel, masks in (("custom", False), ("custom", True), ("list", False), ("list", True)):
        monkeypatch.setattr(vllm_ascend_cp, "_merge_kernel", MergeKernel(kernel))
        monkeypatch.setattr(vllm_ascend_cp, "_decode_shards_can_be_empty", masks)
        vllm_ascend_cp._reserve_graph_masks(bs, torch.device("npu"))
        graph, _ = capture_pair(bs, out, lse)
        tasks[kernel, masks] = list(graph.operators)
        graph.reset()
    assert len(tasks["custom", True]) == len(tasks["custom", False])
    assert "aten.where.self_out" in tasks["custom", True]
    assert "aten.where.self_out" not in tasks["custom", False]
    assert len(tasks["list", True]) == len(tasks["list", False]) + 2


def test_without_masks_reserved_the_graph_merges_what_fia_wrote(cp_rank, caplog):
    """No eager step reserved masks for this size: the capture warns and goes on unmasked."""
    bs, generator = 2, torch.Generator().manual_seed(2)
    out, lse = (t.to("npu") for t in fia_results(bs, [], generator))
    graph, merged = capture_pair(bs, out, lse)
    assert "aten.where.self_out" not in graph.operators
    assert vllm_ascend_cp._graph_masks is None
    graph.reset()


def test_masks_are_reserved_once_and_kept_while_a_graph_reads_them(cp_rank):
    npu = torch.device("npu")
    vllm_ascend_cp._reserve_graph_masks(8, npu)
    first = vllm_ascend_cp._graph_masks
    vllm_ascend_cp._reserve_graph_masks(4, npu)  # smaller: the same
    assert vllm_ascend_cp._graph_masks is first and first.capacity == 8
    vllm_ascend_cp._reserve_graph_masks(16, npu)  # larger, none captured: grown
    grown = vllm_ascend_cp._graph_masks
    assert grown is not first and grown.capacity == 16
    assert vllm_ascend_cp.graph_masks(8, npu)[0].shape == (8,)  # read by a capture
    vllm_ascend_cp._reserve_graph_masks(32, npu)
    assert vllm_ascend_cp._graph_masks is grown
    assert vllm_ascend_cp.graph_masks(32, npu) == (None, None, None)  # too small: none


def test_the_builder_writes_masks_only_once_a_graph_reads_them(cp_rank):
    npu = torch.device("npu")
    vllm_ascend_cp._reserve_graph_masks(3, npu)
    holder = vllm_ascend_cp._graph_masks
    build_step([[[1]], [[1]]])
    assert holder.masks.cpu().all()  # not captured yet: left as allocated
    vllm_ascend_cp.graph_masks(3, npu)
    build_step([[[1]], [[0]]])
    assert holder.masks.cpu().tolist() == [[False, True, True], [False, True, True]]
    build_step(None)  # a step without decodes
    assert holder.masks.cpu().all()


@pytest.mark.parametrize(
    "dcp, pcp, interleave, possible",
    [(2, 1, 1, False), (1, 2, 1, False), (2, 2, 1, True), (4, 1, 1, True), (2, 1, 2, True),
     (1, 1, 1, False)],
)  # fmt: skip
def test_masks_only_where_a_decode_step_can_leave_a_rank_without_keys(
    dcp, pcp, interleave, possible
):
    parallel = SimpleNamespace(
        decode_context_parallel_size=dcp,
        prefill_context_parallel_size=pcp,
        cp_kv_cache_interleave_size=interleave,
    )
    config = SimpleNamespace(parallel_config=parallel)
    assert vllm_ascend_cp.decode_shards_can_be_empty(config) is possible
    assert vllm_ascend_cp.decode_shards_can_be_empty(None) is True
