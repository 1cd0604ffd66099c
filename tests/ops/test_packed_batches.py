"""Packed (TND) batch boundaries and last-token pooling."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.ops.pooling import last_token_pool


def test_packed_seqs_from_lengths():
    seqs = PackedSeqs.from_seq_lens([3, 1, 5])
    assert seqs.cu_seqlens == (0, 3, 4, 9)
    assert seqs.actual_seq_lengths == [3, 4, 9]  # torch_npu's form: no leading 0, last == T
    assert (seqs.num_tokens, seqs.num_seqs, seqs.max_seqlen) == (9, 3, 5)
    assert seqs.seq_lens == [3, 1, 5]
    assert seqs.cu_seqlens_tensor().dtype == torch.int32


def test_packed_seqs_from_vllm_query_start_loc_drops_empty_requests():
    seqs = PackedSeqs.from_query_start_loc(torch.tensor([0, 4, 4, 6], dtype=torch.int32))
    assert seqs.cu_seqlens == (0, 4, 6)
    assert all(type(c) is int for c in seqs.cu_seqlens)


def test_padding_rows_form_their_own_sequence():
    seqs = PackedSeqs.from_seq_lens([2, 3]).padded_to(8)
    assert seqs.cu_seqlens == (0, 2, 5, 8)
    assert PackedSeqs.from_seq_lens([2]).padded_to(2).cu_seqlens == (0, 2)
    with pytest.raises(ValueError, match="num_tokens"):
        PackedSeqs.from_seq_lens([2, 3]).padded_to(4)


@pytest.mark.parametrize(
    ("cu", "message"),
    [((0,), "at least 2"), ((1, 3), "start at 0"), ((0, 3, 3), "strictly increasing"),
     ((0, 2.0), "Python ints")],
)  # fmt: skip
def test_packed_seqs_rejects_bad_boundaries(cu, message):
    with pytest.raises(ValueError, match=message):
        PackedSeqs(cu)


def test_packed_seqs_rejects_device_tensor():
    with pytest.raises(ValueError, match="host"):
        PackedSeqs.from_query_start_loc(torch.zeros(2, device="meta"))


def test_last_token_pool_reads_each_sequence_end():
    hidden = torch.randn(9, 16)
    cu = PackedSeqs.from_seq_lens([3, 1, 5]).cu_seqlens_tensor()
    pooled = last_token_pool(hidden, cu)
    expected = F.normalize(torch.stack([hidden[2], hidden[3], hidden[8]]), dim=-1)
    torch.testing.assert_close(pooled, expected)
    torch.testing.assert_close(last_token_pool(hidden, cu, normalize=False)[1], hidden[3])


def test_last_token_pool_rejects_bad_shapes():
    with pytest.raises(ValueError, match="hidden_states"):
        last_token_pool(torch.zeros(2, 3, 4), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        last_token_pool(torch.zeros(2, 4), torch.tensor([0]))


@pytest.mark.parametrize(
    ("max_seqs", "max_tokens", "expected"),
    [
        (10, 100, [(0, (0, 3, 7, 12, 18, 25))]),  # fits: the batch itself
        (2, 100, [(0, (0, 3, 7)), (7, (0, 5, 11)), (18, (0, 7))]),
        (10, 9, [(0, (0, 3, 7)), (7, (0, 5)), (12, (0, 6)), (18, (0, 7))]),
    ],
)
def test_chunks_keep_whole_sequences_within_both_limits(max_seqs, max_tokens, expected):
    seqs = PackedSeqs.from_seq_lens([3, 4, 5, 6, 7])
    chunks = seqs.chunks(max_seqs, max_tokens)
    assert [(start, chunk.cu_seqlens) for start, chunk in chunks] == expected
    assert sum(chunk.num_tokens for _, chunk in chunks) == seqs.num_tokens


def test_chunks_reject_a_sequence_longer_than_the_token_limit():
    with pytest.raises(ValueError, match="7 tokens exceeds the limit of 6"):
        PackedSeqs.from_seq_lens([3, 7]).chunks(10, 6)
