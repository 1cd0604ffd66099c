"""Shared prefixes of one step (`ops.shared_prefix`): the plan found from host token ids, and
attention over the unique rows against attention over every text whole.

The attention cases build q/k/v for the step's rows as a causal model would (a prefix's rows
are the same in every text that starts with it), compute attention over every text whole
(`varlen_attention_native`: the truth), and compare the shared path, on the unique rows and
mapped back, with it: the PyTorch reference, and the fused operators under the torch_npu
stand-in (FIA in bfloat16 with head_dim 128, FA in float32), which must really run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_npu_ext import emulator
from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.ops.shared_prefix import find_shared_prefixes, shared_prefix_attention
from vllm_npu_ext.selfcheck.tolerances import op_tolerance

SYSTEM = [90, 91, 92, 93, 94, 95]  # a reranker's prompt: shared by both queries' pairs
QUERY_A, QUERY_B = [11, 12, 13, 14, 15], [21, 22, 23, 24]


def _step(texts: list[list[int]]) -> tuple[np.ndarray, PackedSeqs]:
    ids = np.array([token for text in texts for token in text], dtype=np.int64)
    return ids, PackedSeqs.from_seq_lens([len(text) for text in texts])


def _groups(plan) -> list[tuple[tuple[int, ...], int]]:
    return [(group.members, group.prefix_len) for group in plan.groups]


def test_two_rerank_queries_in_one_step_are_two_groups():
    texts = [SYSTEM + QUERY_A + [1, 2], SYSTEM + QUERY_B + [3], SYSTEM + QUERY_A + [4, 5, 6],
             SYSTEM + QUERY_B + [7, 8]]  # fmt: skip
    plan = find_shared_prefixes(*_step(texts), min_len=4)
    # two groups save 11 + 10 tokens; one group of the four would save 3 * 6
    assert _groups(plan) == [((0, 2), 11), ((1, 3), 10)]
    assert plan.saved_tokens == 11 + 10


def test_one_group_beats_two_when_it_saves_more():
    # all four share 6 tokens; two pairs share 7: (4 - 1) * 6 = 18 > 2 * 7
    texts = [SYSTEM + [1, 9], SYSTEM + [1, 8], SYSTEM + [2, 9], SYSTEM + [2, 8]]
    assert _groups(find_shared_prefixes(*_step(texts), min_len=4)) == [((0, 1, 2, 3), 6)]


def test_unrelated_texts_and_short_prefixes_share_nothing():
    assert find_shared_prefixes(*_step([[1, 2, 3, 4], [5, 6, 7, 8], [9]]), min_len=2) is None
    assert find_shared_prefixes(*_step([[1, 2, 3, 4], [1, 2, 3, 5]]), min_len=4) is None
    assert find_shared_prefixes(*_step([[1, 2, 3, 4], [1, 2, 3, 5]]), min_len=3) is not None


def test_rows_of_a_text_equal_to_its_prefix_and_of_a_duplicate():
    prefix = [7, 7, 8, 9]
    texts = [prefix + [1, 2], [5, 5], prefix, prefix + [3], prefix + [1, 2]]
    ids, seqs = _step(texts)
    plan = find_shared_prefixes(ids, seqs, min_len=3)
    # 2 is the whole prefix of the others; 4 duplicates 0 (its prefix: all of 0, 6 tokens)
    assert _groups(plan) == [((0, 2, 3, 4), 4)]
    assert plan.q_lens.tolist() == [6, 2, 0, 1, 2]
    assert plan.num_unique == 6 + 2 + 1 + 2
    # every step row's token is the token of the unique row that holds it
    assert (ids[plan.unique_rows][plan.original_to_unique] == ids).all()
    # the unique rows keep the step's positions: own tokens continue after the prefix
    positions = np.concatenate([np.arange(n) for n in seqs.seq_lens])
    own_of_3 = plan.unique_rows[8:9]
    assert positions[own_of_3].tolist() == [4]
    # a text without own rows has no attention of its own; each other attends to its whole text
    layout = plan.attention_layout(plan.num_unique)
    assert layout.q_seqs.seq_lens == [6, 2, 1, 2]
    assert layout.kv_seqs.seq_lens == [6, 2, 5, 6]


def test_padding_rows_attend_to_themselves():
    plan = find_shared_prefixes(*_step([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]]), min_len=4)
    layout = plan.attention_layout(plan.num_unique + 3)
    assert layout.q_seqs.seq_lens == [5, 1, 3]
    assert layout.kv_seqs.seq_lens == [5, 5, 3]
    assert layout.kv_rows.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 5, 6, 7, 8]
    assert plan.tensor("unique_rows", "cpu", 9).tolist() == [0, 1, 2, 3, 4, 9, 0, 0, 0]


def test_bad_arguments_raise_value_errors_naming_them():
    ids, seqs = _step([[1, 2, 3], [1, 2, 4]])
    with pytest.raises(ValueError, match="min_len"):
        find_shared_prefixes(ids, seqs, min_len=0)
    with pytest.raises(ValueError, match="token_ids has 5 ids"):
        find_shared_prefixes(ids[:5], seqs, min_len=2)
    with pytest.raises(ValueError, match="host"):
        find_shared_prefixes(torch.zeros(6, dtype=torch.long, device="meta"), seqs, min_len=2)
    with pytest.raises(ValueError, match="num_rows"):
        find_shared_prefixes(ids, seqs, min_len=2).attention_layout(3)


def _causal_qkv(texts, heads, dtype):
    """q/k/v `[T, N, D]` of the step's rows, equal wherever two texts share their first rows
    (a causal model's rows depend on their prefix only)."""
    heads_q, heads_kv, dim = heads
    generator = torch.Generator().manual_seed(0)
    rows = {}
    out = []
    for text in texts:
        for end in range(1, len(text) + 1):
            key = tuple(text[:end])
            if key not in rows:
                rows[key] = [torch.randn(n, dim, generator=generator).to(dtype)
                             for n in (heads_q, heads_kv, heads_kv)]  # fmt: skip
            out.append(rows[key])
    return [torch.stack([row[i] for row in out]) for i in range(3)]


TEXTS = [SYSTEM + QUERY_A + [1, 2], [40, 41, 42], SYSTEM + QUERY_B + [3], SYSTEM,
         SYSTEM + QUERY_A + [4, 5, 6, 7, 8], SYSTEM + QUERY_B]  # fmt: skip


def _shared_vs_whole(heads, dtype, npu=None, operator=attention.FUSED_INFER, padding=0):
    ids, seqs = _step(TEXTS)
    plan = find_shared_prefixes(ids, seqs, min_len=4)
    assert plan.saved_tokens > 0
    q, k, v = _causal_qkv(TEXTS, heads, dtype)
    scale = heads[2] ** -0.5
    whole = attention.varlen_attention_native(q, k, v, seqs, scale)
    rows = plan.num_unique + padding
    unique = plan.tensor("unique_rows", "cpu", rows)
    layout = plan.attention_layout(rows)
    shared = shared_prefix_attention(
        q[unique], k[unique], v[unique], layout, plan.tensor("kv_rows", "cpu", rows), scale,
        npu=npu, operator=operator,
    )  # fmt: skip
    return shared[plan.tensor("original_to_unique", "cpu")], whole


@pytest.mark.parametrize("padding", [0, 5])
def test_reference_on_unique_rows_equals_attention_of_every_text_whole(padding):
    shared, whole = _shared_vs_whole((4, 2, 16), torch.float32, padding=padding)
    torch.testing.assert_close(shared, whole, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("operator", "dtype", "heads"),
    [(attention.FUSED_INFER, torch.bfloat16, (8, 2, 128)),
     (attention.FUSION, torch.float32, (4, 4, 64))],
)  # fmt: skip
def test_fused_attention_on_unique_rows_equals_every_text_whole(operator, dtype, heads):
    with emulator.emulated() as npu:
        emulator.reset_counts()
        shared, whole = _shared_vs_whole(heads, dtype, npu=npu, operator=operator, padding=3)
        assert emulator.calls[f"npu_{operator}"] == 1, dict(emulator.calls)
    tolerance = op_tolerance(f"npu_{operator}", dtype)
    torch.testing.assert_close(shared.float(), whole.float(), atol=tolerance.atol,
                               rtol=tolerance.rtol)  # fmt: skip


def test_keys_must_cover_each_sequences_queries():
    q = torch.zeros(4, 2, 8)
    kv = torch.zeros(3, 2, 8)
    seqs, kv_seqs = PackedSeqs.from_seq_lens([2, 2]), PackedSeqs.from_seq_lens([2, 1])
    with pytest.raises(ValueError, match="at least as many keys as queries"):
        attention.varlen_attention(q, kv, kv, seqs, 1.0, kv_seqs=kv_seqs)
