"""Load on the shared server: 2,000 concurrent requests of every kind at once, and embeddings
that do not depend on what a text was batched with.

The mix (`load_mix`, tests/support/request_mix.py): embeddings (single texts and batches),
embeddings with `dimensions`, rerank requests (to the shared reranker server, at the same
time) and bad requests. Every good request must succeed with the right number and width of
vectors (or scores), every probe text or pair must embed or score as it does alone, every bad
request must get a 400. The benchmark (`benchmarks/bench_serve.py --requests 2000`) sends
the same way.
"""

from __future__ import annotations

from collections import Counter

import pytest
from support.hf_oracle import MIN_COSINE
from support.loadgen import cosine, embed_alone, embed_batch, run_load, served_model, word_texts
from support.request_mix import BadRequests, Embeddings, RequestKind, Rerank, mixed_requests

LOAD_REQUESTS = 2000
CONCURRENCY = 64
MAX_WORDS = 60  # the shared server's max-model-len is 128 tokens


def load_mix(reranker_server) -> dict[str, RequestKind]:
    """The kinds of request in the load and their shares: one entry per kind."""
    return {
        "embedding": Embeddings(share=0.45, seed=5, max_words=MAX_WORDS),
        "embedding with dimensions": Embeddings(
            share=0.2, seed=8, extra={"dimensions": 32}, max_words=MAX_WORDS
        ),
        "rerank": Rerank(share=0.2, server=reranker_server, seed=9, max_words=MAX_WORDS),
        "bad request": BadRequests(share=0.15),
    }


@pytest.fixture(scope="module")
def model(embedding_server):
    return served_model(embedding_server.base_url)


def test_mixed_load_good_requests_succeed_bad_ones_get_400_and_probes_match_alone(
    embedding_server, reranker_server, model
):
    mix = load_mix(reranker_server)
    for kind in mix.values():
        kind.prepare(embedding_server.base_url, model)
    tagged = mixed_requests(mix, LOAD_REQUESTS, seed=3)
    requests = [request for _, request in tagged]
    outcomes, wall = run_load(embedding_server.base_url, requests, CONCURRENCY, timeout=120)
    failures, sent, probed = [], Counter(), Counter()
    for (name, _), outcome in zip(tagged, outcomes, strict=True):
        sent[name] += 1
        probed[name] += outcome.request.probe is not None
        try:
            mix[name].check(outcome)
        except AssertionError as error:
            failures.append(f"{name}: {error}")
    print(f"mixed load: {LOAD_REQUESTS} requests at concurrency {CONCURRENCY} in {wall:.1f} s; "
          f"sent {dict(sent)}, probes {dict(probed)}, {len(failures)} wrong")  # fmt: skip
    assert not failures, failures[:5]
    assert set(sent) == set(mix) and all(probed[name] for name in mix if name != "bad request")


def test_each_input_of_a_batch_matches_its_own_embedding(embedding_server, model):
    texts = word_texts(32, 6, 1, MAX_WORDS)
    alone = embed_alone(embedding_server.base_url, model, texts)
    batch = embed_batch(embedding_server.base_url, model, texts)
    assert min(cosine(a, b) for a, b in zip(batch, alone, strict=True)) >= MIN_COSINE
