"""The CP patch's graph masks in CP groups: 4 gloo ranks on the stand-in's `hccl`, each
capturing the patched decode pair (pack, all_to_all over DCP, all-gather over PCP, merge) in
one NPU graph and replaying it for steps whose requests leave some ranks, or all, without keys.

Layouts: DCP 2 (two groups) and PCP 2 x DCP 2 (one group), at cp_kv_cache_interleave_size 1
(vLLM's default) and 16; token t of a sequence is stored on CP rank (t // interleave) % (pcp x
dcp), rank = pcp_rank x dcp + dcp_rank (vllm-ascend 0.23.0.post1
`PCPManager._get_cp_local_seq_lens`). Each rank's FIA result is computed from its own keys
(float32 attention of all dcp x H heads over its shard, out rounded to bf16) and is garbage
where it holds none (NaN out, lse 50, as the stand-in's FIA leaves undefined rows). After the
merge, each rank must hold the float64 merge of its group's partials for its H heads (the
attention over every key of the request, up to the partials' bf16 rounding), within fp32
rounding, and 0 for a request no rank holds a key of. Both kernels: ours and torch_npu's
TensorList one.

Mutations run beside the real code and must give wrong results: `swap` (the rows of this rank
and of every rank exchanged in the masks), `stale` (the masks not rewritten after a capture:
every replay reads the capture's step).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from support.cp_ranks import run_ranks

WORLD, HEADS, HEAD_DIM, ROWS = 4, 2, 64, 4
LAYOUTS = [(2, 1, 1), (2, 1, 16), (2, 2, 1), (2, 2, 16)]  # (dcp, pcp, interleave)
KERNELS = ("custom", "list")
MUTATIONS = ("none", "swap", "stale")
# Steps per interleave, sequence lengths per request (a graph of ROWS rows; fewer requests
# leave padding rows, with no key anywhere). The first is the warm-up's (and the capture's).
STEPS = {
    1: [[9, 2, 3, 40], [2, 3, 5, 7], [100, 2], [4, 4, 4, 4]],
    16: [[9, 40, 3, 70], [2, 17, 33, 50], [16, 1, 100], [5, 5, 5, 5]],
}


def local_counts(length: int, world: int, interleave: int) -> list[int]:
    """Keys of a `length`-token sequence on each CP rank."""
    counts = [0] * world
    for token in range(length):
        counts[(token // interleave) % world] += 1
    return counts


def request(index: int, length: int, dcp: int):
    """Request `index`'s keys, values `[L, D]` and decode query `[dcp*H, D]` (the same on
    every rank)."""
    generator = torch.Generator().manual_seed(1000 * index + length)
    keys, values = (torch.randn(length, HEAD_DIM, generator=generator) for _ in range(2))
    return keys, values, torch.randn(dcp * HEADS, HEAD_DIM, generator=generator)


def partial(keys, values, query, shard):
    """FIA's result over the keys of `shard` (token indices): bf16 out `[dcp*H, D]`, fp32 lse
    `[dcp*H]`; None without keys."""
    if not shard:
        return None
    scores = (query @ keys[shard].T) * HEAD_DIM**-0.5
    return (torch.softmax(scores, -1) @ values[shard]).bfloat16(), torch.logsumexp(scores, -1)


def fia_step(lengths, rank, dcp, pcp, interleave):
    """This rank's FIA results for a step (`[ROWS, dcp*H, D]` bf16, `[ROWS, dcp*H, 1]` fp32),
    the per-rank key counts `[ROWS, pcp, dcp]` (padding rows: 0), and the float64 merge of
    the CP group's partials (as sent, bf16) for this rank's heads `[ROWS, H, D]` (0 where no
    rank holds a key)."""
    world, dcp_rank = dcp * pcp, rank % dcp
    heads = slice(dcp_rank * HEADS, (dcp_rank + 1) * HEADS)
    out = torch.full((ROWS, dcp * HEADS, HEAD_DIM), float("nan")).bfloat16()
    lse = torch.full((ROWS, dcp * HEADS, 1), 50.0)
    counts = torch.zeros(ROWS, pcp, dcp, dtype=torch.int64)
    expected = torch.zeros(ROWS, HEADS, HEAD_DIM, dtype=torch.float64)
    for row, length in enumerate(lengths):
        keys, values, query = request(row, length, dcp)
        counts[row] = torch.tensor(local_counts(length, world, interleave)).view(pcp, dcp)
        shards = [[t for t in range(length) if (t // interleave) % world == r]
                  for r in range(world)]  # fmt: skip
        partials = [p for p in (partial(keys, values, query, s) for s in shards) if p]
        mine = partial(keys, values, query, shards[rank % world])
        if mine is not None:
            out[row], lse[row, :, 0] = mine
        if partials:
            weights = torch.softmax(torch.stack([p[1] for p in partials]).double(), 0)
            outs = torch.stack([p[0] for p in partials]).double()
            expected[row] = (weights.unsqueeze(-1) * outs).sum(0)[heads]
    return out, lse, counts.numpy(), expected


def block_groups(rank: int, dcp: int, pcp: int):
    """This rank's (DCP group, PCP group) in a world of CP blocks of dcp x pcp ranks (every
    rank makes every group, in one order)."""
    size, mine = dcp * pcp, {}
    for first in range(0, WORLD, size):
        for p in range(pcp):
            ranks = [first + p * dcp + d for d in range(dcp)]
            group = dist.new_group(ranks)
            mine["dcp"] = group if rank in ranks else mine.get("dcp")
        for d in range(dcp):
            ranks = [first + p * dcp + d for p in range(pcp)]
            group = dist.new_group(ranks)
            mine["pcp"] = group if rank in ranks else mine.get("pcp")
    return mine["dcp"], mine["pcp"]


def run_layout(rank, dcp, pcp, interleave, kernel, mutation) -> dict:
    from vllm_npu_ext.ops.attention_update import MergeKernel
    from vllm_npu_ext.patches.vllm_ascend_cp import masks
    from vllm_npu_ext.patches.vllm_ascend_cp import merge as merge_module
    from vllm_npu_ext.patches.vllm_ascend_cp.kernel import KernelChoice
    from vllm_npu_ext.patches.vllm_ascend_cp.merge import CPMerge

    dcp_group, pcp_group = block_groups(rank, dcp, pcp)
    coordinators = (
        SimpleNamespace(world_size=dcp, rank_in_group=rank % dcp, device_group=dcp_group),
        SimpleNamespace(world_size=pcp, rank_in_group=(rank % (dcp * pcp)) // dcp,
                        device_group=pcp_group if pcp > 1 else None),
    )  # fmt: skip
    merge_module.cp_group_coordinators = lambda: coordinators
    if mutation == "swap":
        real = masks.rank_and_all_empty
        masks.rank_and_all_empty = lambda lengths, ranks: real(lengths, ranks)[::-1]
    config = SimpleNamespace(parallel_config=SimpleNamespace(
        decode_context_parallel_size=dcp, prefill_context_parallel_size=pcp,
        cp_kv_cache_interleave_size=interleave))  # fmt: skip
    merge = CPMerge(kernel=KernelChoice(MergeKernel(kernel)),
                    shards_can_be_empty=masks.decode_shards_can_be_empty(config),
                    graph_rows=ROWS)  # fmt: skip
    steps = STEPS[interleave]
    out, lse, counts, _ = fia_step(steps[0], rank, dcp, pcp, interleave)
    out, lse = out.to("npu"), lse.to("npu")
    merge_module.local_kv_lengths = lambda rows: counts  # the warm-up step's metadata
    merge.npu_attention_update(HEAD_DIM, merge.process_attn_out_lse(out, lse))  # eager
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        merged = merge.npu_attention_update(HEAD_DIM, merge.process_attn_out_lse(out, lse))
    if mutation == "stale":
        merge.refresh_graph_masks = lambda metadata: None
    errors = []
    for lengths in steps:
        new_out, new_lse, counts, expected = fia_step(lengths, rank, dcp, pcp, interleave)
        merge.refresh_after(lambda self, metadata: metadata)(None, SimpleNamespace(
            decode_meta=SimpleNamespace(num_computed_tokens_of_pcp_dcp=counts)))  # fmt: skip
        out.copy_(new_out)
        lse.copy_(new_lse)
        graph.replay()
        rows = len(lengths)
        error = (merged.cpu()[:rows].double() - expected[:rows]).abs().max().item()
        errors.append(error if math.isfinite(error) else float("inf"))
    dist.barrier()
    masked = "aten.where.self_out" in graph.operators
    graph.reset()
    return {"errors": errors, "masked": masked,
            "empty_here": [bool((fia_step(s, rank, dcp, pcp, interleave)[2][:, (rank % (dcp * pcp))
                            // dcp, rank % dcp] == 0)[:len(s)].any()) for s in steps]}  # fmt: skip


def rank_worker(rank: int, world: int) -> dict:
    from vllm_npu_ext.emulator.operators import npu_ext_cann
    from vllm_npu_ext.patches.vllm_ascend_cp import masks
    from vllm_npu_ext.patches.vllm_ascend_cp import merge as merge_module

    npu_ext_cann.install_on_npu()
    torch.npu.set_device(0)
    originals = (masks.rank_and_all_empty, merge_module.local_kv_lengths,
                 merge_module.cp_group_coordinators)  # fmt: skip
    results = {}
    for dcp, pcp, interleave in LAYOUTS:
        for kernel in KERNELS:
            for mutation in MUTATIONS:
                key = f"dcp{dcp}_pcp{pcp}_i{interleave}_{kernel}_{mutation}"
                results[key] = run_layout(rank, dcp, pcp, interleave, kernel, mutation)
                (masks.rank_and_all_empty, merge_module.local_kv_lengths,
                 merge_module.cp_group_coordinators) = originals  # fmt: skip
    return results


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    return run_ranks(rank_worker, WORLD, (), tmp_path_factory.mktemp("mask_ranks"),
                     timeout_s=240, backend="hccl")  # fmt: skip


def cases(rank_results, dcp, pcp, interleave, kernel, mutation):
    return [r[f"dcp{dcp}_pcp{pcp}_i{interleave}_{kernel}_{mutation}"] for r in rank_results]


FP32 = 1e-5  # the fp32 partials and merge against float64 attention (values O(1))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(("dcp", "pcp", "interleave"), LAYOUTS)
def test_every_replay_merges_its_own_step_exactly_on_every_rank(rank_results, dcp, pcp,
                                                                interleave, kernel):  # fmt: skip
    for rank, case in enumerate(cases(rank_results, dcp, pcp, interleave, kernel, "none")):
        print(f"DCP {dcp} PCP {pcp} interleave {interleave} {kernel}, rank {rank}: worst "
              f"error per step {case['errors']}, masks {case['masked']}")  # fmt: skip
        assert max(case["errors"]) <= FP32, (rank, case)


@pytest.mark.parametrize(("dcp", "pcp", "interleave"), LAYOUTS)
def test_graphs_carry_masks_exactly_where_a_decode_step_can_leave_a_rank_without_keys(
    rank_results, dcp, pcp, interleave
):
    """DCP 2 at interleave 1: every decode sequence (>= 2 tokens) has keys on both ranks, no
    mask in the graph; the others: masks, and steps with requests of no key on some ranks."""
    carried = (dcp * pcp - 1) * interleave >= 2
    for case in cases(rank_results, dcp, pcp, interleave, "custom", "none"):
        assert case["masked"] is carried
    somewhere = [any(step) for step in zip(*(c["empty_here"] for c in cases(
        rank_results, dcp, pcp, interleave, "custom", "none")), strict=True)]  # fmt: skip
    assert any(somewhere) is carried


@pytest.mark.parametrize("mutation", ["swap", "stale"])
@pytest.mark.parametrize(("dcp", "pcp", "interleave"), [x for x in LAYOUTS if x != (2, 1, 1)])
def test_masks_of_another_row_or_an_earlier_step_give_wrong_results(rank_results, dcp, pcp,
                                                                    interleave, mutation):
    """The mutations are caught: some rank's result is off by far more than rounding."""
    for kernel in KERNELS:
        errors = [max(c["errors"]) for c in cases(rank_results, dcp, pcp, interleave, kernel,
                                                  mutation)]  # fmt: skip
        assert max(errors) > 1e-2, (kernel, mutation, errors)
