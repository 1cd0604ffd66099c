"""Load on the shared reranker server: 500 concurrent /rerank requests of mixed sizes and
lengths, zero failures, and probe pairs that score the same whatever they were batched with."""

from __future__ import annotations

import random

from support.loadgen import Request, run_load, summarise, word_texts
from support.rerank_oracle import MAX_SCORE_DIFF, hf_rerank_scores
from support.rerank_servers import rerank_scores

REQUESTS = 500
CONCURRENCY = 32
PROBE_EVERY = 5
MAX_WORDS = 100  # query + document stay within the server's 512 tokens


def load_requests(model: str, probe_query: str, probe_document: str) -> list[Request]:
    """1-4 documents per request; every PROBE_EVERY-th carries the probe pair."""
    rng = random.Random(11)
    queries = iter(word_texts(REQUESTS, seed=12, min_words=1, max_words=20))
    documents = iter(word_texts(REQUESTS * 4, seed=13, min_words=1, max_words=MAX_WORDS))
    requests = []
    for i in range(REQUESTS):
        docs = [next(documents) for _ in range(rng.randint(1, 4))]
        body = {"model": model, "query": next(queries), "documents": docs}
        if i % PROBE_EVERY:
            requests.append(Request(body, path="/rerank"))
            continue
        position = rng.randrange(len(docs))
        docs[position] = probe_document
        body["query"] = probe_query
        requests.append(Request(body, probe="pair", probe_index=position, path="/rerank"))
    return requests


def test_concurrent_rerank_requests_all_succeed_with_stable_scores(reranker_server):
    probe_query, probe_document = "Where is the Louvre?", "The Louvre is a museum in Paris."
    reference = rerank_scores(reranker_server, probe_query, [probe_document])[0]
    expected = hf_rerank_scores(reranker_server.model_dir, probe_query, [probe_document])[0]
    assert abs(reference - expected) <= MAX_SCORE_DIFF
    requests = load_requests(reranker_server.model, probe_query, probe_document)
    outcomes, wall = run_load(reranker_server.base_url, requests, CONCURRENCY, timeout=300)
    summary = summarise(outcomes, wall)
    print(f"rerank load: {summary}")
    assert summary["errors"] == 0, summary["first_errors"]
    probes = [o.request.probe_embedding(o.embeddings)[0] for o in outcomes if o.request.probe]
    assert len(probes) == REQUESTS // PROBE_EVERY
    assert max(abs(score - reference) for score in probes) <= 1e-6
