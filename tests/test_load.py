"""Load on the shared server: concurrent mixed-length requests, zero failures, and embeddings
that do not depend on what a text was batched with.

The bigger run (2,000 requests per concurrency level, up to 64 clients) is
`benchmarks/bench_serve.py --requests 2000`; this one is sized for CI.
"""

from __future__ import annotations

import random

import pytest
from support.hf_oracle import MIN_COSINE
from support.loadgen import (
    Request,
    cosine,
    embed_alone,
    embed_batch,
    run_load,
    served_model,
    summarise,
    word_texts,
)

LOAD_REQUESTS = 2000
CONCURRENCY = 64
MAX_WORDS = 60  # the shared server's max-model-len is 128 tokens
PROBES = 6


@pytest.fixture(scope="module")
def model(embedding_server):
    return served_model(embedding_server.base_url)


def load_requests(model: str, probes: list[str]) -> list[Request]:
    """Mostly single texts, some batches of 2-8; every 4th request carries a probe text."""
    rng = random.Random(3)
    fillers = iter(_texts(LOAD_REQUESTS * 8, seed=4))
    requests = []
    for i in range(LOAD_REQUESTS):
        size = 1 if rng.random() < 0.7 else rng.randint(2, 8)
        inputs = [next(fillers) for _ in range(size)]
        probe = position = None
        if i % 4 == 0:
            probe, position = rng.randrange(len(probes)), rng.randrange(size)
            inputs[position] = probes[probe]
        body = {"model": model, "input": inputs[0] if size == 1 else inputs}
        if probe is None:
            requests.append(Request(body))
        else:
            requests.append(Request(body, probe=str(probe), probe_index=position))
    return requests


def _texts(count: int, seed: int) -> list[str]:
    return word_texts(count, seed, 1, MAX_WORDS)


def test_concurrent_mixed_requests_all_succeed_with_batch_independent_embeddings(
    embedding_server, model
):
    probes = _texts(PROBES, seed=5)
    reference = embed_alone(embedding_server.base_url, model, probes)
    requests = load_requests(model, probes)
    outcomes, wall = run_load(embedding_server.base_url, requests, CONCURRENCY, timeout=120)
    summary = summarise(outcomes, wall)
    assert summary["errors"] == 0, summary["first_errors"]
    probed = [o for o in outcomes if o.request.probe is not None]
    assert len(probed) == LOAD_REQUESTS // 4
    for outcome in probed:
        vector = outcome.request.probe_embedding(outcome.embeddings)
        assert cosine(vector, reference[int(outcome.request.probe)]) >= MIN_COSINE
    assert summary["min_probe_cosine"] >= MIN_COSINE
    print(f"load: {summary}")


def test_each_input_of_a_batch_matches_its_own_embedding(embedding_server, model):
    texts = _texts(32, seed=6)
    alone = embed_alone(embedding_server.base_url, model, texts)
    batch = embed_batch(embedding_server.base_url, model, texts)
    assert min(cosine(a, b) for a, b in zip(batch, alone, strict=True)) >= MIN_COSINE
