"""The CP decode merge inside vllm-ascend's real `attention_cp`, patched by our import hook.

In gloo ranks started as vLLM workers start (the stand-in, vLLM's distributed environment with
the `hccl` backend, which the stand-in maps to gloo, vLLM's DCP/PCP groups, both packages'
general plugins), vllm-ascend's own `attention_cp` module is imported and our hook replaces
its merges on import. The decode pair as `AscendAttentionCPImpl._forward_decode_pcp_dcp` calls
it (`_process_attn_out_lse` then `_npu_attention_update`, names resolved in the module's
globals), running our CANN
operator (its AscendC kernel built for the host, `emulator.operators.npu_ext_cann`), is compared
with vllm-ascend's own unpatched pair (`common_cp`, through the emulated TensorList
`npu_attention_update`) and with an exact float64 log-sum-exp merge of every rank's partials.
"""

from __future__ import annotations

import math

import pytest
import torch
from support.cp_ranks import run_ranks

WORLD = 4
CONFIGS = [(2, 1), (1, 2), (2, 2)]  # (dcp, pcp); world 4 holds 2, 2 and 1 CP blocks
DTYPES = ["float32", "bfloat16", "float16"]
BATCH, HEADS, HEAD_DIM = 5, 4, 128
ATTENTION_CP = "vllm_ascend.attention.context_parallel.attention_cp"


def partials(rank: int, dcp: int, dtype: torch.dtype):
    """Rank `rank`'s FIA decode results: out `[bs, dcp*H, D]` in the query dtype, lse fp32
    `[bs, dcp*H, 1]`; odd ranks hold no key of sequence 1 (lse -inf there)."""
    generator = torch.Generator().manual_seed(1000 + rank)
    out = torch.randn(BATCH, dcp * HEADS, HEAD_DIM, generator=generator).to(dtype)
    lse = torch.randn(BATCH, dcp * HEADS, 1, generator=generator) * 3
    if rank % 2:
        lse[1] = -math.inf
    return out, lse


def exact_merge(rank: int, dcp: int, pcp: int, dtype: torch.dtype) -> torch.Tensor:
    """float64 merge over this rank's CP block, for the heads this rank owns after the
    all-to-all: block of `dcp*pcp` consecutive ranks, rank = pcp_rank * dcp + dcp_rank."""
    size = dcp * pcp
    first, dcp_rank = rank - rank % size, rank % dcp
    heads = slice(dcp_rank * HEADS, (dcp_rank + 1) * HEADS)
    outs, lses = [], []
    for other in range(first, first + size):
        out, lse = partials(other, dcp, dtype)
        outs.append(out[:, heads].double())
        lses.append(lse[:, heads].double())
    lse = torch.stack(lses)  # [n, bs, H, 1]
    weights = torch.softmax(lse, dim=0)
    return (weights * torch.stack(outs)).sum(0)


def prefill_merges(module, originals) -> dict:
    """`_npu_attn_out_lse_update` as `attention_cp` calls it (PCP's mask/nomask halves, a chunk
    with its context): ours (patched) and vllm-ascend's on the same bf16 partials, `[T, N, D]`
    out and fp32 `[T, N, 1]` lse, against a float64 merge; TensorList calls of each."""
    from vllm_npu_ext import emulator
    from vllm_npu_ext.emulator.operators import npu_ext_cann as cann_ops

    generator = torch.Generator().manual_seed(7)
    outs = [torch.randn(7, HEADS, HEAD_DIM, generator=generator).bfloat16() for _ in range(2)]
    lses = [torch.randn(7, HEADS, 1, generator=generator) * 3 for _ in range(2)]
    emulator.reset_counts()
    cann_ops.calls.clear()
    with cann_ops.emulated():
        ours = module._npu_attn_out_lse_update(lses[0], lses[1], outs[0], outs[1])
    ours_calls = (emulator.calls["npu_attention_update"], cann_ops.calls[cann_ops.OP_NAME])
    theirs = originals["_npu_attn_out_lse_update"](lses[0], lses[1], outs[0], outs[1])
    weights = torch.softmax(torch.stack(lses).double(), dim=0)
    exact = (weights * torch.stack(outs).double()).sum(0)
    return {"shapes": [list(ours.shape), list(theirs.shape)], "dtype": str(ours.dtype),
            "vs_original": (ours - theirs).abs().max().item(),
            "vs_exact": (ours.double() - exact).abs().max().item(),
            "ours_calls": list(ours_calls),
            "theirs_tensor_list_calls": emulator.calls["npu_attention_update"] - ours_calls[0]}


def rank_worker(rank: int, world: int) -> dict:
    from support.vllm_ascend_env import start_like_a_vllm_ascend_process
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    from vllm_npu_ext import emulator
    from vllm_npu_ext.emulator.operators import npu_ext_cann as cann_ops

    start_like_a_vllm_ascend_process()  # our general plugin installs the import hook
    parallel_state.init_distributed_environment(world, rank, "env://", rank, backend="hccl")
    import importlib

    from vllm_npu_ext.patches import vllm_ascend_cp
    from vllm_npu_ext.patches.vllm_ascend_cp import patching

    module = importlib.import_module(ATTENTION_CP)
    common = importlib.import_module(patching.COMMON_MODULE)
    originals = getattr(module, patching.ORIGINALS)
    merge = vllm_ascend_cp.active()
    results = {
        "patched_on_import": all(getattr(module, name).__self__ is merge
                                 for name in patching.TARGET_SIGNATURES),
        "originals_are_common_cp": all(originals[name] is getattr(common, name)
                                       for name in patching.TARGET_SIGNATURES),
        "prefill": prefill_merges(module, originals),
        "device_backend": torch.distributed.get_backend(
            parallel_state.get_world_group().device_group
        ),
    }
    for dcp, pcp in CONFIGS:
        with set_current_vllm_config(VllmConfig()):
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=dcp, prefill_context_model_parallel_size=pcp,
                decode_context_model_parallel_size=dcp, backend="hccl",
            )  # fmt: skip
        for name in DTYPES:
            dtype = getattr(torch, name)
            out, lse = partials(rank, dcp, dtype)
            emulator.reset_counts()
            cann_ops.calls.clear()
            with cann_ops.emulated():  # our CANN operator (its AscendC kernel built for the host)
                patched = module._npu_attention_update(
                    HEAD_DIM, module._process_attn_out_lse(out, lse)
                )
            patched_calls = emulator.calls["npu_attention_update"]
            original = originals["_npu_attention_update"](
                HEAD_DIM, originals["_process_attn_out_lse"](out, lse)
            )
            original_calls = emulator.calls["npu_attention_update"] - patched_calls
            exact = exact_merge(rank, dcp, pcp, dtype)
            results[f"dcp{dcp}_pcp{pcp}_{name}"] = {
                "shapes": [list(patched.shape), list(original.shape)],
                "dtypes": [str(patched.dtype), str(original.dtype)],
                "vs_original": (patched - original).abs().max().item(),
                "vs_exact": (patched.double() - exact).abs().max().item(),
                "original_vs_exact": (original.double() - exact).abs().max().item(),
                "tensor_list_calls": [patched_calls, original_calls],
                "our_operator_calls": cann_ops.calls[cann_ops.OP_NAME],
            }
        parallel_state.destroy_model_parallel()
    return results


@pytest.fixture(scope="module")
def rank_results(vllm_ascend_started, tmp_path_factory):
    # Each rank imports vLLM and vllm-ascend (about a minute of CPU time each on 2 cores).
    return run_ranks(rank_worker, WORLD, (), tmp_path_factory.mktemp("cp_ranks"), timeout_s=300)


def test_our_hook_patched_vllm_ascends_attention_cp_in_every_rank(rank_results):
    for result in rank_results:
        assert result["patched_on_import"] and result["originals_are_common_cp"]
        assert result["device_backend"] == "hccl"


def test_the_prefill_merge_is_ours_and_equals_vllm_ascends(rank_results):
    """PCP's and chunked context's merge of two partials: one call of our operator and no
    TensorList call (vllm-ascend's: one), the same fp32 result within fp32 rounding."""
    for result in rank_results:
        case = result["prefill"]
        assert case["shapes"] == [[7, HEADS, HEAD_DIM]] * 2 and case["dtype"] == "torch.float32"
        assert case["ours_calls"] == [0, 1] and case["theirs_tensor_list_calls"] == 1, case
        assert case["vs_original"] <= 1e-5 and case["vs_exact"] <= 1e-5, case


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("dcp", "pcp"), CONFIGS)
def test_patched_merge_equals_vllm_ascends_and_the_exact_merge(rank_results, dcp, pcp, dtype):
    for rank, result in enumerate(rank_results):
        case = result[f"dcp{dcp}_pcp{pcp}_{dtype}"]
        assert case["shapes"] == [[BATCH, HEADS, HEAD_DIM]] * 2, rank
        assert case["dtypes"] == ["torch.float32"] * 2, rank
        # Both merge the same fp32 partials in fp32: a few ulps of O(1) values.
        assert case["vs_original"] <= 1e-5, (rank, case)
        assert case["vs_exact"] <= 1e-5, (rank, case)
        assert case["original_vs_exact"] <= 1e-5, (rank, case)
        # ours: one call of our tensor-input operator, no tensor lists; vllm-ascend's pair:
        # one call of torch_npu's TensorList operator
        assert case["our_operator_calls"] == 1, (rank, case)
        assert case["tensor_list_calls"] == [0, 1], (rank, case)
