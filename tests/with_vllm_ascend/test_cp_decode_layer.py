"""One decode step of vllm-ascend's context-parallel attention layer, in gloo ranks, against
float64 attention over the whole sequence.

Every rank is started as a vLLM worker on Ascend (the stand-in, vLLM 0.23's distributed
environment over the stand-in's `hccl`, vLLM's DCP/PCP groups) and runs, for DCP 2, PCP 2 and
both, the pieces of vllm-ascend 0.23 that a decode step runs, as its runner calls them
(vllm-ascend 0.23.0.post1 `NPUModelRunner._prepare_inputs` and, in
`NPUModelRunner._build_attention_metadata`, `_get_block_table_and_slot_mapping`):

- its block table (`worker/block_table.py`), the same block ids on every rank, and its CP slot
  mapping (`BlockTable.compute_slot_mapping`: -1 for every token another rank stores);
- the context's keys and values written by its own ReshapeAndCache call
  (`DeviceOperator.reshape_and_cache`, `BaseDeviceAdaptor.reshape_and_cache`) at those slots;
- its `PCPManager` (`worker/pcp_utils.py`): batch info, the PCP token split and padded slot
  mapping, and `generate_pcp_metadata` (each rank's key counts per request);
- its metadata builder `AscendAttentionCPMetadataBuilder.build` on the
  `AscendCommonAttentionMetadata` the runner makes;
- `AscendAttentionCPImpl.forward`: the decode token's ReshapeAndCache, the query all-gather
  over DCP, paged FIA on this rank's shard with LSE, and the merge: ours (the patch, with our
  CANN operator's host-built AscendC kernel) or vllm-ascend's own pair (patch undone).

Sequences of 1024, 128, 777, 301, 2 and 3 tokens (unequal: per-request key counts; the last
two, shorter than the CP group of DCP 2 x PCP 2, leave ranks of it without a key), bf16, one KV
head, head_dim 128. The reference is float64 softmax attention over all keys; the rank's output
must be within bf16 rounding of it (the bound in `test_..._matches_float64_attention`). FIA's
result for a rank without keys is not documented: the stand-in writes NaN there
(`emulator/operators/attention_paged.py`), which our merge masks and vllm-ascend's own pair
passes on.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from support.cp_ranks import run_ranks

WORLD = 4
CONFIGS = [(2, 1), (1, 2), (2, 2)]  # (dcp, pcp); tp = dcp (vLLM: dcp <= tp // num_kv_heads)
MERGES = ("ours", "vllm-ascend")
SEQ_LENS = [1024, 128, 777, 301, 2, 3]  # with the decode token
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 1, 128, 128
LAYER = "model.layers.0.self_attn.attn"
ATTENTION_CP = "vllm_ascend.attention.context_parallel.attention_cp"


def sequence(index: int):
    """Request `index`'s keys, values `[L, 1, D]` and decode query `[4, D]`, bf16, the same on
    every rank (values in [-4, 4])."""
    generator = torch.Generator().manual_seed(100 + index)
    length = SEQ_LENS[index]
    keys, values = (torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator).clamp(-4, 4)
                    .bfloat16() for _ in range(2))  # fmt: skip
    query = torch.randn(HEADS, HEAD_DIM, generator=generator).bfloat16()
    return keys, values, query


def reference(heads: slice, cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention of each request's decode query over all its keys `[B, h, D]`, and
    the largest |partial output| over the CP ranks' key shards (token j on rank j % cp)."""
    outs, partials = [], []
    for index in range(len(SEQ_LENS)):
        keys, values, query = sequence(index)
        scores = query[heads].double() @ keys[:, 0].double().T * HEAD_DIM**-0.5
        outs.append(torch.softmax(scores, dim=-1) @ values[:, 0].double())
        shards = [torch.softmax(scores[:, r::cp_size], dim=-1) @ values[r::cp_size, 0].double()
                  for r in range(cp_size)]  # fmt: skip
        partials.append(torch.stack(shards).abs().amax(dim=0))
    return torch.stack(outs), torch.stack(partials)


# bf16 keeps 8 significant bits: rounding to it changes a value by at most 2^-8 of it.
BF16_ROUNDING = 2.0**-8
# fp32 arithmetic inside FIA and the merge (softmax, LSE weights), far below bf16 rounding.
FP32_SLACK = 1e-5


def config_for(model_dir: str, dcp: int, pcp: int):
    from support.vllm_ascend_env import engine_config

    return engine_config(
        model_dir, runner="generate", dtype="bfloat16", tensor_parallel_size=dcp,
        decode_context_parallel_size=dcp, prefill_context_parallel_size=pcp, block_size=BLOCK,
        cp_kv_cache_interleave_size=1, max_model_len=2048, max_num_seqs=len(SEQ_LENS),
        enable_prefix_caching=False, enforce_eager=True,
    )  # fmt: skip


def block_table_for(vllm_config, cp_size: int):
    """vllm-ascend's BlockTable with each request's blocks (ids shuffled, the same on every
    rank, as vLLM's scheduler gives every CP rank the same block ids)."""
    from vllm_ascend.worker.block_table import BlockTable

    per_request = [math.ceil(length / (BLOCK * cp_size)) for length in SEQ_LENS]
    table = BlockTable(BLOCK, len(SEQ_LENS), max(per_request), 4096, False, torch.device("cpu"))
    order = torch.randperm(sum(per_request), generator=torch.Generator().manual_seed(7)).tolist()
    for row, count in enumerate(per_request):
        table.add_row(order[:count], row)
        order = order[count:]
    table.block_table.copy_to_gpu(len(SEQ_LENS))
    return table, sum(per_request)


def slots(table, positions: list[list[int]]) -> torch.Tensor:
    """vllm-ascend's CP slot mapping of `positions` (per request), as the runner computes it
    before the PCP split (vllm-ascend 0.23.0.post1 `NPUModelRunner._prepare_inputs`)."""
    counts = torch.tensor([len(p) for p in positions])
    query_start = torch.cat([torch.zeros(1, dtype=torch.int32), counts.cumsum(0).int()])
    flat = torch.tensor([p for request in positions for p in request])
    table.compute_slot_mapping(len(positions), query_start, flat)
    return table.slot_mapping.cpu[: len(flat)].clone()


def write_context(table, caches) -> int:
    """Every request's context (all but its decode token) through vllm-ascend's own
    ReshapeAndCache call; returns how many slots were -1 (stored by another rank)."""
    from vllm_ascend.device.device_op import DeviceOperator

    context = [list(range(length - 1)) for length in SEQ_LENS]
    slot_mapping = slots(table, context)
    keys, values = zip(*(sequence(i)[:2] for i in range(len(SEQ_LENS))), strict=True)
    DeviceOperator.reshape_and_cache(
        key=torch.cat([k[:-1] for k in keys]), value=torch.cat([v[:-1] for v in values]),
        key_cache=caches[0], value_cache=caches[1], slot_mapping=slot_mapping,
    )  # fmt: skip
    return int((slot_mapping < 0).sum())


def decode_metadata(vllm_config, table, builder, dcp: int, pcp: int, pcp_rank: int, dcp_rank: int):
    """The decode step's metadata, through vllm-ascend's PCPManager and builder."""
    import numpy as np
    from vllm_ascend.attention.attention_v1 import AscendAttentionState
    from vllm_ascend.attention.utils import AscendCommonAttentionMetadata
    from vllm_ascend.worker.pcp_utils import PCPManager

    num_reqs = len(SEQ_LENS)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32)
    scheduled = np.ones(num_reqs, dtype=np.int32)
    computed = np.array(SEQ_LENS, dtype=np.int32) - 1
    manager = PCPManager(pcp, pcp_rank, dcp, dcp_rank, 4096, num_reqs, torch.device("cpu"),
                         vllm_config, use_async_scheduling=False)  # fmt: skip
    manager.initialize_slot_mapping()
    slot_mapping = slots(table, [[length - 1] for length in SEQ_LENS])
    manager.init_batch_info(scheduled, num_reqs, computed, computed)
    if pcp > 1:
        scheduled, _ = manager.update_tokens_for_pcp(scheduled, np.arange(4096))
        slot_mapping = manager.get_padded_slot_mapping(num_reqs, num_reqs, slot_mapping, 0)
    long_seq, block_table = manager.generate_pcp_metadata(
        num_reqs, torch.from_numpy(scheduled), SimpleNamespace(num_computed_tokens_cpu=computed),
        scheduled, table.block_table.gpu[:num_reqs], num_reqs, num_reqs,
    )  # fmt: skip
    query_start = torch.arange(num_reqs + 1, dtype=torch.int32)
    common = AscendCommonAttentionMetadata(
        query_start_loc=query_start, query_start_loc_cpu=query_start, seq_lens=seq_lens,
        _seq_lens_cpu=seq_lens, seq_lens_cpu_upper_bound=seq_lens, seq_lens_cpu=seq_lens,
        num_computed_tokens_cpu=torch.from_numpy(computed), num_reqs=num_reqs,
        num_actual_tokens=num_reqs, max_query_len=1, max_seq_len=max(SEQ_LENS),
        block_table_tensor=block_table, slot_mapping=slot_mapping,
        causal=True, is_prefilling=torch.zeros(num_reqs, dtype=torch.bool),
        num_input_tokens=num_reqs, attn_state=AscendAttentionState.DecodeOnly,
        prefill_context_parallel_metadata=long_seq,
    )  # fmt: skip
    return builder.build(0, common), long_seq.num_computed_tokens_of_pcp_dcp


def decode_step(module, builder, vllm_config, dcp: int, pcp: int, heads: slice) -> dict:
    """One decode step of the layer with the merge `module` holds now; what it computed."""
    from vllm.distributed import get_dcp_group, get_pcp_group
    from vllm_ascend.ascend_forward_context import set_ascend_forward_context

    from vllm_npu_ext.emulator import calls, reset_counts
    from vllm_npu_ext.emulator.operators import npu_ext_cann

    pcp_rank, dcp_rank = get_pcp_group().rank_in_group, get_dcp_group().rank_in_group
    table, blocks = block_table_for(vllm_config, dcp * pcp)
    caches = [torch.zeros(blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
              for _ in range(2)]  # fmt: skip
    skipped = write_context(table, caches)
    metadata, local_lens = decode_metadata(vllm_config, table, builder, dcp, pcp, pcp_rank,
                                           dcp_rank)  # fmt: skip
    impl = module.AscendAttentionCPImpl(heads.stop - heads.start, HEAD_DIM, HEAD_DIM**-0.5,
                                        KV_HEADS, None, None, "auto", None, "decoder", None)
    decode = [sequence(i) for i in range(len(SEQ_LENS))]
    query = torch.stack([q[heads] for _, _, q in decode])
    key, value = (torch.stack([s[part][-1] for s in decode]) for part in (0, 1))
    output = torch.empty_like(query)
    layer = SimpleNamespace(_k_scale_float=1.0, _v_scale_float=1.0, layer_name=LAYER)
    reset_counts()
    npu_ext_cann.calls.clear()
    with npu_ext_cann.emulated(), set_ascend_forward_context({LAYER: metadata}, vllm_config):
        impl.forward(layer, query, key, value, caches, metadata, output)
    want, partial = reference(heads, dcp * pcp)
    error = (output.double() - want).abs()
    bound = BF16_ROUNDING * (partial + want.abs()) + FP32_SLACK
    every_rank_has_keys = (local_lens > 0).reshape(len(SEQ_LENS), -1).all(axis=1)
    return {
        "row_error_to_bound": (error / bound).amax(dim=(1, 2)).tolist(),
        "every_rank_has_keys": every_rank_has_keys.tolist(),
        "output": output.float().tolist(), "paged_fia": calls["npu_fused_infer_attention_score"],
        "tensor_list_merges": calls["npu_attention_update"],
        "our_operator": npu_ext_cann.calls[npu_ext_cann.OP_NAME], "skipped_slots": skipped,
        "local_key_counts": local_lens[:, pcp_rank, dcp_rank].tolist(),
    }  # fmt: skip


def run_config(model_dir: str, dcp: int, pcp: int) -> dict:
    """vLLM's CP groups for (dcp, pcp), then the decode step with each merge."""
    import importlib

    from vllm.config import set_current_vllm_config
    from vllm.distributed import get_tp_group, parallel_state
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from vllm_npu_ext.patches import vllm_ascend_cp
    from vllm_npu_ext.patches.vllm_ascend_cp import patching

    vllm_config = config_for(model_dir, dcp, pcp)
    with set_current_vllm_config(vllm_config):
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=dcp, prefill_context_model_parallel_size=pcp,
            decode_context_model_parallel_size=dcp, backend="hccl",
        )  # fmt: skip
        module = importlib.import_module(ATTENTION_CP)
        per_rank = HEADS // dcp
        first = get_tp_group().rank_in_group * per_rank
        spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                                 dtype=torch.bfloat16)  # fmt: skip
        builder = module.AscendAttentionCPMetadataBuilder(spec, [LAYER], vllm_config,
                                                          torch.device("cpu"))  # fmt: skip
        results = {}
        for merge in MERGES:
            if merge == "ours":
                assert patching.patch(vllm_ascend_cp.active(), module)
            else:
                patching.unpatch(module)
            results[merge] = decode_step(module, builder, vllm_config, dcp, pcp,
                                         slice(first, first + per_rank))  # fmt: skip
        parallel_state.destroy_model_parallel()
    return results


def rank_worker(rank: int, world: int, model_dir: str) -> dict:
    from support.vllm_ascend_env import start_like_a_vllm_ascend_process
    from vllm.distributed import parallel_state

    start_like_a_vllm_ascend_process()
    parallel_state.init_distributed_environment(world, rank, "env://", rank, backend="hccl")
    return {f"dcp{dcp}_pcp{pcp}": run_config(model_dir, dcp, pcp) for dcp, pcp in CONFIGS}


@pytest.fixture(scope="module")
def rank_results(vllm_ascend_started, tmp_path_factory):
    from vllm_npu_ext.tiny_model import make_tiny_model

    model_dir = make_tiny_model(tmp_path_factory.mktemp("cp_layer") / "model", preset="cp")
    return run_ranks(rank_worker, WORLD, (str(model_dir),), tmp_path_factory.mktemp("ranks"),
                     timeout_s=300)  # fmt: skip


@pytest.mark.parametrize("merge", MERGES)
@pytest.mark.parametrize(("dcp", "pcp"), CONFIGS)
def test_cp_decode_layer_matches_float64_attention(rank_results, dcp, pcp, merge):
    """Each rank's bf16 output against float64 attention over the whole sequence, element by
    element within bf16 rounding: paged FIA computes each rank's partial output O_i in fp32
    and rounds it to bf16 (|error| <= 2^-8 |O_i|); the merge weighs them in fp32 with convex
    weights (<= 2^-8 max_i |O_i|); the merged output is rounded to bf16 (2^-8 |O|). Bound:
    2^-8 (max_i |O_i| + |O|) + 1e-5 for the fp32 softmax and LSE arithmetic."""
    cases = [result[f"dcp{dcp}_pcp{pcp}"][merge] for result in rank_results]
    ratios = [ratio for case in cases for ratio, full in
              zip(case["row_error_to_bound"], case["every_rank_has_keys"], strict=True)
              if full or merge == "ours"]  # fmt: skip
    print(f"DCP {dcp} PCP {pcp}, {merge} merge: worst |out - float64| at "
          f"{max(ratios):.2f} of the bound")  # fmt: skip
    assert max(ratios) <= 1.0


def test_a_request_of_which_ranks_hold_no_key_is_exact_with_our_merge_only(rank_results):
    """DCP 2 x PCP 2: requests of 2 and 3 tokens leave ranks of the group without a key (the
    case is there: the counts say so). Our merge sends those ranks' rows as 0 / -inf and is
    within the bound above on every row; vllm-ascend's pair merges what FIA wrote for them
    (NaN in the stand-in: undefined on the device) into the request's output on every rank."""
    short = [len(SEQ_LENS) - 2, len(SEQ_LENS) - 1]
    cases = [result["dcp2_pcp2"] for result in rank_results]
    assert all(not cases[0]["ours"]["every_rank_has_keys"][row] for row in short)
    assert sum(case["ours"]["local_key_counts"][short[0]] == 0 for case in cases) == 2
    for case in cases:
        assert all(case["ours"]["row_error_to_bound"][row] <= 1.0 for row in short)
        assert all(math.isnan(case["vllm-ascend"]["row_error_to_bound"][row]) for row in short)


@pytest.mark.parametrize(("dcp", "pcp"), CONFIGS)
def test_each_rank_attends_its_own_shard_per_request(rank_results, dcp, pcp):
    """Each rank's FIA gets its own key count per request (vllm-ascend's round-robin split,
    cp_kv_cache_interleave_size 1): the counts of a CP group add up to each sequence; the
    context write (-1 slots skipped) stored each context token on exactly one rank."""
    size, context = dcp * pcp, sum(SEQ_LENS) - len(SEQ_LENS)
    for first in range(0, WORLD, size):
        group = [rank_results[r][f"dcp{dcp}_pcp{pcp}"]["ours"] for r in range(first, first + size)]
        counts = [case["local_key_counts"] for case in group]
        assert [sum(request) for request in zip(*counts, strict=True)] == SEQ_LENS
        assert all(case["skipped_slots"] > 0 for case in group)
        assert sum(context - case["skipped_slots"] for case in group) == context


@pytest.mark.parametrize(("dcp", "pcp"), CONFIGS)
def test_our_merge_replaces_the_tensor_list_call_and_agrees_with_vllm_ascends(
    rank_results, dcp, pcp
):
    """One paged FIA call per step; ours merges with our operator and no TensorList call,
    vllm-ascend's pair with one TensorList call; their bf16 outputs agree to one bf16 ulp."""
    for result in rank_results:
        ours, theirs = result[f"dcp{dcp}_pcp{pcp}"]["ours"], result[f"dcp{dcp}_pcp{pcp}"][
            "vllm-ascend"]
        assert (ours["paged_fia"], ours["our_operator"], ours["tensor_list_merges"]) == (1, 1, 0)
        assert (theirs["paged_fia"], theirs["our_operator"], theirs["tensor_list_merges"]) == (
            1, 0, 1)
        full = torch.tensor(ours["every_rank_has_keys"])
        ours_out = torch.tensor(ours["output"])[full]
        theirs_out = torch.tensor(theirs["output"])[full]
        difference = (ours_out - theirs_out).abs()
        assert difference.max().item() <= 2**-8 * theirs_out.abs().max()
