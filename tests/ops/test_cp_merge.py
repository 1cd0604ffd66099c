"""vllm_npu_ext.ops.cp_merge in one process: layouts, zero-copy views, the merge itself."""

from __future__ import annotations

import pytest
import torch
from support.scripts import load_script

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops
from vllm_npu_ext.ops.attention_update import MergeKernel, attention_update_reference
from vllm_npu_ext.ops.cp_merge import (
    cp_decode_merge,
    exchange,
    merge_cp_buffer,
    pack_out_lse,
    split_out_lse,
)

bench = load_script("benchmarks/bench_cp_merge.py")


def random_buffer(world, bs, heads, head_dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(world, bs, heads, head_dim + 1, generator=generator)
    buffer[..., head_dim] *= 3
    return buffer


@pytest.mark.parametrize("lse_shape", ["[bs, H]", "[bs, H, 1]"])
@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_pack_puts_head_block_j_in_slot_j_with_lse_last(dcp, lse_shape):
    bs, heads, head_dim = 3, 2, 8
    out = torch.randn(bs, dcp * heads, head_dim, dtype=torch.bfloat16)
    lse = torch.randn(bs, dcp * heads)
    buffer = pack_out_lse(out, lse if lse_shape == "[bs, H]" else lse.unsqueeze(-1), dcp)
    assert buffer.shape == (dcp, bs, heads, head_dim + 1) and buffer.dtype == torch.float32
    for block in range(dcp):
        heads_of_block = slice(block * heads, (block + 1) * heads)
        assert torch.equal(buffer[block, ..., :head_dim], out[:, heads_of_block].float())
        assert torch.equal(buffer[block, ..., head_dim], lse[:, heads_of_block])


@pytest.mark.parametrize(
    ("out_shape", "lse_shape", "dcp", "argument"),
    [((4, 6), (4, 6), 2, "out"), ((4, 6, 8), (4, 6, 8), 2, "lse"), ((4, 6, 8), (4, 6), 4, "dcp")],
)
def test_pack_rejects_bad_arguments(out_shape, lse_shape, dcp, argument):
    with pytest.raises(ValueError, match=f"^{argument}"):
        pack_out_lse(torch.zeros(out_shape), torch.zeros(lse_shape), dcp)


def test_split_returns_views_of_the_buffer():
    buffer = random_buffer(4, 3, 2, 16)
    lse, out = split_out_lse(buffer)
    assert lse.shape == (4, 6) and out.shape == (4, 6, 16)
    assert lse.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
    assert out.data_ptr() == buffer.data_ptr() and lse.data_ptr() == buffer[0, 0, 0, 16].data_ptr()
    assert torch.equal(out[2, 5], buffer[2, 2, 1, :16]) and lse[2, 5] == buffer[2, 2, 1, 16]


def test_split_rejects_a_buffer_not_contiguous_in_its_last_dims():
    buffer = random_buffer(2, 3, 4, 8).transpose(1, 2)
    with pytest.raises(ValueError, match="^buffer"):
        split_out_lse(buffer)


@pytest.mark.parametrize("world", [1, 2, 8, 16])
def test_merge_cp_buffer_matches_the_reference(world):
    buffer = random_buffer(world, 5, 3, 64, seed=world)
    buffer[1 % world, 2, :, 64] = float("-inf")  # a shard without keys for sequence 2
    merged = merge_cp_buffer(buffer)
    lse = buffer[..., 64].reshape(world, 15)
    out = buffer[..., :64].reshape(world, 15, 64)
    expected, _ = attention_update_reference(lse, out)
    assert merged.shape == (5, 3, 64)
    torch.testing.assert_close(merged, expected.view(5, 3, 64))


@pytest.mark.parametrize("world", [2, 8])
def test_merge_issues_no_copy_and_no_per_shard_view(world):
    buffer = random_buffer(world, 16, 8, 128)
    counts = bench.count_ops(lambda: merge_cp_buffer(buffer))
    assert counts["copies"] == 0 and counts["copy_bytes"] == 0
    assert counts["per_shard_views"] == 0


def test_vllm_ascend_list_path_is_counted_as_copying_and_unbinding():
    bs, sp, heads, head_dim = 4, 4, 8, 128
    theirs = random_buffer(sp * heads, head_dim + 1, bs, 0)[..., 0].permute(2, 0, 1)
    counts = bench.count_ops(lambda: bench.vllm_ascend_merge(theirs, head_dim, dcp=sp))
    assert counts["copies"] >= 1 and counts["per_shard_views"] == 2 * sp
    assert counts["copy_bytes"] == theirs.numel() * 4


def test_vllm_ascend_list_path_and_tensor_path_agree():
    case = bench.make_case(4, 8, torch.Generator().manual_seed(1))
    ours = merge_cp_buffer(case["ours"])
    theirs = bench.vllm_ascend_merge(case["theirs"], bench.HEAD_DIM, dcp=4)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours.double(), bench.reference(case), atol=1e-5, rtol=1e-5)


def test_exchange_without_groups_returns_the_buffer():
    buffer = random_buffer(1, 2, 3, 8)
    assert exchange(buffer) is buffer
    with pytest.raises(ValueError, match="^buffer"):
        exchange(random_buffer(2, 2, 3, 8))


def test_single_rank_decode_merge_returns_the_local_output():
    out, lse = torch.randn(3, 4, 32), torch.randn(3, 4, 1)
    torch.testing.assert_close(cp_decode_merge(out, lse), out)


def test_benchmark_prints_one_json_summary_last(capsys):
    summary = bench.main(["--sp", "2", "--bs", "4", "--repeats", "2"])
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith("{") and '"merge_ratios"' in last_line
    assert summary["tensor_merge_copies"] == 0 and summary["tensor_merge_per_shard_views"] == 0
    assert summary["max_error"] < 1e-5


# --- shards without keys ---------------------------------------------------------------
# A CP rank holds no key of a request while the request is shorter than the rank's first key
# (vllm-ascend `pcp_utils._get_cp_local_seq_lens`); FIA's result for zero keys is undefined,
# so every rank packs such a row as out 0, lse -inf, whatever the kernel wrote.

EMPTY_CASES = {
    # per sequence, the key count on each of 4 shards
    "one shard empty": [[3, 0, 2, 5], [4, 1, 1, 2]],
    "all shards empty": [[0, 0, 0, 0], [0, 0, 0, 0]],
    "mixed": [[5, 0, 0, 0], [0, 0, 0, 0], [2, 3, 1, 4], [0, 7, 0, 1]],
}


def partials_with_garbage(lengths, heads=2, head_dim=16, seed=0):
    """Per-shard partial attention of `len(lengths)` one-token queries over keys split as
    `lengths` [bs][world], where a shard without keys holds garbage (NaN out, an lse that
    would outweigh every real shard), and the exact attention over all keys (0 with no key)."""
    generator = torch.Generator().manual_seed(seed)
    bs, world = len(lengths), len(lengths[0])
    query = torch.randn(bs, heads, head_dim, generator=generator, dtype=torch.float64)
    out = torch.full((world, bs, heads, head_dim), float("nan"), dtype=torch.float64)
    lse = torch.full((world, bs, heads), 50.0, dtype=torch.float64)
    expected = torch.zeros(bs, heads, head_dim, dtype=torch.float64)
    for b, counts in enumerate(lengths):
        keys = torch.randn(sum(counts), heads, head_dim, generator=generator, dtype=torch.float64)
        values = torch.randn(sum(counts), heads, head_dim, generator=generator, dtype=torch.float64)
        scores = torch.einsum("hd,khd->hk", query[b], keys)
        if sum(counts):
            expected[b] = torch.einsum("hk,khd->hd", scores.softmax(-1), values)
        for w, shard in enumerate(torch.arange(sum(counts)).split(counts)):
            if len(shard):
                lse[w, b] = scores[:, shard].logsumexp(-1)
                out[w, b] = torch.einsum("hk,khd->hd", scores[:, shard].softmax(-1), values[shard])
    return out.float(), lse.float(), expected.float()


def pack_each_rank(out, lse, lengths, masked=True):
    """Every rank packs its partial (dcp 1) with its empty rows; the buffers gathered."""
    empty = torch.tensor(lengths) == 0  # [bs, world]
    return torch.cat([
        pack_out_lse(out[w], lse[w], 1, empty[:, w] if masked else None)
        for w in range(out.shape[0])
    ])  # fmt: skip


def merge_on_kernel(buffer, kernel):
    """`merge_cp_buffer` on the CPU reference, or under the emulator on our CANN operator
    (its AscendC source built for the host) or torch_npu's TensorList operator."""
    if kernel == "cpu":
        return merge_cp_buffer(buffer)
    with emulator.emulated(), emulated_cann_ops.emulated():
        emulator.reset_counts()
        emulated_cann_ops.calls.clear()
        merged = merge_cp_buffer(buffer, MergeKernel(kernel))
        calls = (
            emulator.calls["npu_attention_update"],
            emulated_cann_ops.calls[emulated_cann_ops.OP_NAME],
        )
    assert calls == ((1, 0) if kernel == "list" else (0, 1))
    return merged


@pytest.mark.parametrize("kernel", ["cpu", "custom", "list"])
@pytest.mark.parametrize("case", list(EMPTY_CASES))
def test_empty_shards_merge_to_the_attention_over_the_keys_that_exist(case, kernel):
    lengths = EMPTY_CASES[case]
    out, lse, expected = partials_with_garbage(lengths)
    buffer = pack_each_rank(out, lse, lengths)
    empty = torch.tensor(lengths) == 0
    assert torch.equal(buffer[..., -1].isneginf().all(-1), empty.T)
    assert torch.all(buffer[..., :-1][empty.T] == 0)
    merged = merge_on_kernel(buffer, kernel)
    every_shard_empty = empty.all(1)
    if kernel == "list":
        # torch_npu's kernel evaluates exp(-inf - -inf) literally: NaN where no shard has a
        # key (the CP patch zeroes those rows, tests/patches), exact everywhere else.
        assert merged[every_shard_empty].isnan().all()
        merged, expected = merged[~every_shard_empty], expected[~every_shard_empty]
    assert not merged.isnan().any()
    torch.testing.assert_close(merged, expected, atol=1e-5, rtol=1e-5)  # 0 for no key at all


def test_without_the_mask_an_empty_shard_s_garbage_reaches_the_result():
    lengths = EMPTY_CASES["one shard empty"]
    out, lse, expected = partials_with_garbage(lengths)
    merged = merge_cp_buffer(pack_each_rank(out, lse, lengths, masked=False))
    assert merged.isnan().any()


@pytest.mark.parametrize(
    ("empty", "message"),
    [(torch.zeros(3, dtype=torch.bool), "empty must be bool"), (torch.zeros(2), "empty must")],
)
def test_pack_rejects_an_empty_mask_of_the_wrong_shape_or_dtype(empty, message):
    with pytest.raises(ValueError, match=message):
        pack_out_lse(torch.randn(2, 4, 8), torch.randn(2, 4), 2, empty)


def test_decode_merge_passes_the_mask_to_the_pack():
    out, lse = torch.randn(3, 4, 32), torch.full((3, 4), 7.0)
    merged = cp_decode_merge(out, lse, empty=torch.tensor([False, True, False]))
    assert torch.all(merged[1] == 0)
    torch.testing.assert_close(merged[[0, 2]], out[[0, 2]])
