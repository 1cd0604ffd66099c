"""How `truncate_prompt_tokens` reaches each (query, document) pair of a rerank or score body
(`entrypoints/rerank_truncation.truncated_body`); the cut itself runs on a real server in
tests/reranker/test_server.py."""

from __future__ import annotations

import pytest

from vllm_npu_ext.entrypoints.rerank_truncation import truncated_body


class PairCounter:
    """Records the pairs it is asked to fit; "fits" a document to its first `limit` chars."""

    def __init__(self):
        self.pairs = []

    def fit(self, query, document, limit, side, template_kwargs):
        self.pairs.append((query, document))
        return document[:limit] if side == "right" else document[-limit:]


@pytest.mark.parametrize("body", [
    {"query": "q", "documents": ["abcdef", "uvwxyz"]},  # /rerank
    {"queries": ["q"], "documents": ["abcdef", "uvwxyz"]},  # /score, one query for all
    {"queries": "q", "documents": ["abcdef", "uvwxyz"]},
    {"queries": ["q", "q"], "documents": ["abcdef", "uvwxyz"]},  # one query a document
])  # fmt: skip
def test_every_document_is_cut_against_its_query(body):
    counter = PairCounter()
    cut = truncated_body({**body, "truncate_prompt_tokens": 3}, counter, max_model_len=64)
    assert cut["documents"] == ["abc", "uvw"] and "truncate_prompt_tokens" not in cut
    assert counter.pairs == [("q", "abcdef"), ("q", "uvwxyz")]


@pytest.mark.parametrize("limit", [None, 65, -2, True])
def test_limits_vllm_answers_itself_are_left_to_it(limit):
    body = {"query": "q", "documents": ["abcdef"], "truncate_prompt_tokens": limit}
    assert truncated_body(body, PairCounter(), max_model_len=64) is None


def test_queries_and_documents_of_other_counts_are_left_to_vllm():
    body = {"queries": ["a", "b"], "documents": ["x", "y", "z"], "truncate_prompt_tokens": 3}
    assert truncated_body(body, PairCounter(), max_model_len=64) is None
