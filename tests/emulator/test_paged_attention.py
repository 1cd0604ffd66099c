"""FIA on a paged KV cache, as vllm-ascend's decodes call it: the stand-in's result against
float64 attention over each request's own keys, with requests of unequal length (the only case
that tells per-request key counts from cumulative ones), and its contract checks.

The cache is written by the stand-in's ATB ReshapeAndCache at the slots of a shuffled block
table, as vllm-ascend writes it, and read back as `[num_blocks, block_size, N_kv * D]`.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from support.npu_inputs import BF16, MASK

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.operators import atb

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 1, 128, 128
KV_LENS = [300, 37, 129]  # unequal; cumulative [300, 337, 466] would read other keys
NUM_BLOCKS = 12
# bf16 output of float32 math against float64: half an ulp of bf16 on values within [-4, 4].
OUT_TOLERANCE = 2.0**-8 * 4
LSE_TOLERANCE = 1e-4


def paged_cache(kv_lens, generator):
    """Keys/values per request (`[L, N_kv, D]` bf16), a shuffled int32 block table, and the
    caches `[num_blocks, block_size, N_kv, D]` written by ATB ReshapeAndCache at its slots."""
    order = torch.randperm(NUM_BLOCKS, generator=generator).to(torch.int32)
    width = max(math.ceil(length / BLOCK) for length in kv_lens) + 1
    table = torch.full((len(kv_lens), width), NUM_BLOCKS - 1, dtype=torch.int32)
    key_cache = torch.zeros(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, dtype=BF16)
    value_cache = torch.zeros_like(key_cache)
    keys, values, used = [], [], 0
    for row, length in enumerate(kv_lens):
        count = math.ceil(length / BLOCK)
        table[row, :count] = order[used:used + count]
        used += count
        slots = table[row, torch.arange(length) // BLOCK] * BLOCK + torch.arange(length) % BLOCK
        keys.append(torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator).to(BF16))
        values.append(torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator).to(BF16))
        atb._npu_reshape_and_cache(
            key=keys[-1], value=values[-1], key_cache=key_cache, value_cache=value_cache,
            slot_indices=slots.to(torch.int32),
        )  # fmt: skip
    return keys, values, table, key_cache, value_cache


def reference(query, query_lens, keys, values, scale, causal):
    """float64 softmax attention per request over its own keys; (out [T, N, D], lse [T, N])."""
    outs, lses, start = [], [], 0
    group = HEADS // KV_HEADS
    for q_len, key, value in zip(query_lens, keys, values, strict=True):
        q = query[start:start + q_len].double()
        k = key.double().repeat_interleave(group, dim=1)
        v = value.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("snd,tnd->nst", q, k) * scale
        if causal:
            hidden = torch.arange(len(key))[None] > torch.arange(q_len)[:, None] + len(key) - q_len
            scores = scores.masked_fill(hidden, -math.inf)
        lses.append(torch.logsumexp(scores, dim=-1).transpose(0, 1))
        outs.append(torch.einsum("nst,tnd->snd", torch.softmax(scores, dim=-1), v))
        start += q_len
    return torch.cat(outs), torch.cat(lses)


def paged_call(query_lens, kv_lens, causal, seed=0):
    generator = torch.Generator().manual_seed(seed)
    keys, values, table, key_cache, value_cache = paged_cache(kv_lens, generator)
    query = torch.randn(sum(query_lens), HEADS, HEAD_DIM, generator=generator).to(BF16)
    kwargs = dict(
        num_heads=HEADS, num_key_value_heads=KV_HEADS, input_layout="TND", scale=HEAD_DIM**-0.5,
        softmax_lse_flag=True, block_table=table, block_size=BLOCK,
        actual_seq_lengths=np.cumsum(query_lens).tolist(), actual_seq_lengths_kv=list(kv_lens),
        atten_mask=MASK if causal else None, sparse_mode=3 if causal else 0,
    )  # fmt: skip
    cache_view = (NUM_BLOCKS, BLOCK, KV_HEADS * HEAD_DIM)
    args = (query, key_cache.view(cache_view), value_cache.view(cache_view))
    want = reference(query, query_lens, keys, values, HEAD_DIM**-0.5, causal)
    return args, kwargs, want


CASES = {
    # vllm-ascend's CP decode: one token per request, full attention, LSE out.
    "decode, no mask (CP decode)": ([1, 1, 1], KV_LENS, False),
    # its non-CP decode: sparse_mode 3 with the compressed mask; one query row sees every key.
    "decode, causal mask (non-CP decode)": ([1, 1, 1], KV_LENS, True),
    # chunked prefill over cached context: right-down causal over each request's keys.
    "several query tokens, causal": ([5, 1, 129], KV_LENS, True),
}


@pytest.mark.parametrize("case", CASES)
def test_paged_fia_attends_each_request_over_its_own_keys(case):
    query_lens, kv_lens, causal = CASES[case]
    args, kwargs, (want_out, want_lse) = paged_call(query_lens, kv_lens, causal)
    out, lse = emulator.npu_fused_infer_attention_score(*args, **kwargs)
    assert out.dtype == BF16 and out.shape == args[0].shape
    assert lse.dtype == torch.float32 and lse.shape == (sum(query_lens), HEADS, 1)
    assert (out.double() - want_out).abs().max().item() <= OUT_TOLERANCE
    assert (lse.squeeze(-1).double() - want_lse).abs().max().item() <= LSE_TOLERANCE


def test_unequal_lengths_tell_per_request_from_cumulative_key_counts():
    """The same batch with its key counts given cumulatively, [300, 337, 466]: request 0 is
    unchanged, requests 1 and 2 attend over other keys (the padding blocks of their table
    rows). So the reference comparison above fails for any implementation reading paged
    key counts cumulatively."""
    args, kwargs, (want_out, _) = paged_call([1, 1, 1], KV_LENS, False)
    kwargs["actual_seq_lengths_kv"] = np.cumsum(KV_LENS).tolist()
    out, _ = emulator.npu_fused_infer_attention_score(*args, **kwargs)
    error = (out.double() - want_out).abs().amax(dim=(1, 2))
    assert error[0] <= OUT_TOLERANCE and min(error[1:]) > 10 * OUT_TOLERANCE, error


@pytest.mark.parametrize(
    "lengths_as",
    [np.array, lambda v: np.array(v, dtype=np.int32), torch.tensor, tuple,
     lambda v: [np.int64(x) for x in v]],
    ids=["numpy int64", "numpy int32", "tensor", "tuple", "numpy items"],
)  # fmt: skip
def test_paged_fia_takes_the_integer_sequences_torch_binds(lengths_as):
    """vllm-ascend's CP decode passes a numpy array (vllm-ascend 0.23.0.post1
    `AscendAttentionCPImpl._forward_decode_pcp_dcp`); through the
    stand-in's torch_npu function and through torch's operator the result is the list's."""
    args, kwargs, _ = paged_call([1, 1, 1], KV_LENS, False)
    want = emulator.npu_fused_infer_attention_score(*args, **kwargs)
    kwargs["actual_seq_lengths_kv"] = lengths_as(KV_LENS)
    packet = torch.ops.npu.npu_fused_infer_attention_score
    for call in (emulator.npu_fused_infer_attention_score, packet):
        got = call(*args, **kwargs)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _change(**changes):
    def run():
        args, kwargs, _ = paged_call([1, 1, 1], KV_LENS, False)
        args = list(args)
        for index, name in enumerate(("query", "key", "value")):
            if name in changes:
                args[index] = changes.pop(name)(args[index])
        emulator.npu_fused_infer_attention_score(*args, **{**kwargs, **{
            name: value(kwargs) if callable(value) else value for name, value in changes.items()}})

    return run


REJECTIONS = {
    "block_size not the cache's": (_change(block_size=256), ValueError, "blocks of 128"),
    "int64 block table": (_change(block_table=lambda k: k["block_table"].long()), TypeError,
                          "int32"),
    "block table rows != requests": (_change(block_table=lambda k: k["block_table"][:2]),
                                     ValueError, "one row per sequence"),
    "block table too narrow": (_change(block_table=lambda k: k["block_table"][:, :2].clone()),
                               ValueError, "needs 3 blocks"),
    "block id outside the cache": (_change(block_table=lambda k: k["block_table"].index_fill(
        1, torch.tensor([0]), 99)), ValueError, "block 99"),
    "key counts != requests": (_change(actual_seq_lengths_kv=[300, 37]), ValueError,
                               "one key count per sequence"),
    "key counts missing": (_change(actual_seq_lengths_kv=None), ValueError, "required"),
    "negative key count": (_change(actual_seq_lengths_kv=[300, -1, 129]), ValueError,
                           "non-negative"),
    "float key counts": (_change(actual_seq_lengths_kv=np.array(KV_LENS, dtype=np.float32)),
                         TypeError, "sequence of integers"),
    "key counts as an iterator": (_change(actual_seq_lengths_kv=iter(KV_LENS)), TypeError,
                                  "sequence of integers"),
    "BSH layout": (_change(input_layout="BSH"), NotImplementedError, "'TND' only"),
    "4-D cache": (_change(key=lambda t: t.view(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM),
                          value=lambda t: t.view(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM)),
                  NotImplementedError, "not emulated"),
    "key and value shapes differ": (_change(value=lambda t: t[:-1].contiguous()), ValueError,
                                    "one shape"),
    "cache width != heads x D": (_change(num_key_value_heads=2, num_heads=4), ValueError,
                                 "last axis"),
    "float16 query on a bf16 cache": (_change(query=lambda t: t.half()), TypeError, "one dtype"),
    "scale left at 1.0": (_change(scale=1.0), ValueError, "scale"),
}  # fmt: skip


@pytest.mark.parametrize("name", REJECTIONS)
def test_paged_fia_refuses_what_its_contract_excludes(name):
    run, error, match = REJECTIONS[name]
    with pytest.raises(error, match=match):
        run()


@pytest.mark.parametrize(("block", "query_lens"), [(100, [1, 1, 1]), (64, [2, 1, 1])])
def test_paged_fia_block_size_limits(block, query_lens):
    """Decode: a multiple of 16 up to 512; several query tokens: of 128 (FIA's docstring, 约束说明,
    page attention场景, block_size, for Q_S = 1 and Q_S > 1)."""
    args, kwargs, _ = paged_call(query_lens, [40, 37, 20], False)
    cache = torch.zeros(8, block, KV_HEADS * HEAD_DIM, dtype=BF16)
    table = torch.arange(3 * 2, dtype=torch.int32).view(3, 2)
    with pytest.raises(ValueError, match="multiple of"):
        emulator.npu_fused_infer_attention_score(
            args[0], cache, cache, **{**kwargs, "block_size": block, "block_table": table}
        )


def test_paged_fia_out_overload_writes_what_the_default_returns():
    """vllm-ascend's full-graph decode capture calls `.out` with the max workspace
    (vllm-ascend 0.23.0.post1 `AscendAttentionCPImpl._forward_decode_pcp_dcp`): the same paged
    contract and results."""
    args, kwargs, _ = paged_call([1, 1, 1], KV_LENS, False)
    want = emulator.npu_fused_infer_attention_score(*args, **kwargs)
    workspace = emulator._npu_fused_infer_attention_score_get_max_workspace(*args, **kwargs)
    out = [torch.empty_like(want[0]), torch.empty_like(want[1])]
    emulator.npu_fused_infer_attention_score.out(*args, **kwargs, workspace=workspace, out=out)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


@pytest.mark.parametrize("causal", [False, True], ids=["CP decode", "causal decode"])
def test_a_decode_request_without_keys_gets_nan_and_the_others_their_attention(causal):
    """A CP rank that holds no key of a request yet still calls FIA for it (vllm-ascend passes
    the rank's key count, 0); what FIA writes there is not documented, so the stand-in writes
    NaN (out and LSE) and every other request is computed as usual."""
    kv_lens = [300, 0, 129]
    args, kwargs, (want_out, want_lse) = paged_call([1, 1, 1], kv_lens, causal)
    out, lse = emulator.npu_fused_infer_attention_score(*args, **kwargs)
    assert out[1].isnan().all() and lse[1].isnan().all()
    keep = [0, 2]
    assert (out[keep].double() - want_out[keep]).abs().max().item() <= OUT_TOLERANCE
    assert (lse[keep].squeeze(-1).double() - want_lse[keep]).abs().max().item() <= LSE_TOLERANCE


def test_several_query_tokens_without_keys_still_raise():
    args, kwargs, _ = paged_call([1, 128, 1], [300, 0, 129], True)
    with pytest.raises(ValueError, match="see no key"):
        emulator.npu_fused_infer_attention_score(*args, **kwargs)
