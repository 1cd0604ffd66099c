"""A mixed HTTP load: several kinds of request, each knowing what its answer must be.

A `RequestKind` builds its requests and checks each outcome; `mixed_requests` draws a
sequence of them by share. Adding a kind of request to a load is one more entry in the
load's `{name: RequestKind}` table (tests/test_load.py).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

from support.bad_requests import bad_requests
from support.hf_oracle import MIN_COSINE
from support.loadgen import Outcome, Request, cosine, embed_alone, word_texts
from support.rerank_servers import rerank_scores


class RequestKind:
    """One kind of request. `prepare` runs once on the idle server (e.g. computes references
    alone); `request(rng)` builds the next request; `check` raises AssertionError when an
    outcome is not what this kind must get."""

    share: float = 1.0

    def prepare(self, base_url: str, model: str) -> None:
        self.model = model

    def request(self, rng: random.Random) -> Request:
        raise NotImplementedError

    def check(self, outcome: Outcome) -> None:
        raise NotImplementedError


class Embeddings(RequestKind):
    """Single texts (70%) and batches of 2-8; every 4th request carries a probe text at a
    random position, whose embedding must equal the one computed alone (same `extra`)."""

    def __init__(self, share: float, seed: int, extra: dict | None = None, max_words: int = 60):
        self.share, self.seed, self.extra, self.max_words = share, seed, extra or {}, max_words
        self.sent = 0

    def prepare(self, base_url: str, model: str) -> None:
        super().prepare(base_url, model)
        self.probes = word_texts(6, self.seed, 1, self.max_words)
        self.references = embed_alone(base_url, model, self.probes, **self.extra)
        self.fillers = _texts_forever(self.seed * 100_000 + 1, self.max_words)

    def request(self, rng: random.Random) -> Request:
        size = 1 if rng.random() < 0.7 else rng.randint(2, 8)
        inputs = [next(self.fillers) for _ in range(size)]
        body = {"model": self.model, **self.extra}
        probe, position = None, 0
        if self.sent % 4 == 0:
            probe, position = rng.randrange(len(self.probes)), rng.randrange(size)
            inputs[position] = self.probes[probe]
        self.sent += 1
        body["input"] = inputs[0] if size == 1 else inputs
        key = None if probe is None else str(probe)
        return Request(body, probe=key, probe_index=position, keep_embedding=True)

    def check(self, outcome: Outcome) -> None:
        assert outcome.ok, f"{outcome.status}: {outcome.error}"
        inputs = outcome.request.body["input"]
        assert len(outcome.embeddings) == (1 if isinstance(inputs, str) else len(inputs))
        width = len(self.references[0])
        assert all(len(vector) == width for vector in outcome.embeddings)
        if outcome.request.probe is not None:
            vector = outcome.request.probe_embedding(outcome.embeddings)
            reference = self.references[int(outcome.request.probe)]
            assert cosine(vector, reference) >= MIN_COSINE, "probe differs from its alone run"


class Rerank(RequestKind):
    """/rerank on a reranker server of its own (a server serves one model): 1-4 documents per
    request; every 4th request carries a probe pair, whose score must equal its alone run."""

    MAX_SCORE_CHANGE = 1e-6

    def __init__(self, share: float, server, seed: int, max_words: int = 60):
        self.share, self.server, self.seed, self.max_words = share, server, seed, max_words
        self.sent = 0

    def prepare(self, base_url: str, model: str) -> None:
        self.model = self.server.model  # this kind's own server, not the load's
        self.probes = list(zip(word_texts(4, self.seed, 1, 12),
                               word_texts(4, self.seed + 1, 1, self.max_words), strict=True))
        self.references = [rerank_scores(self.server, query, [doc])[0]
                           for query, doc in self.probes]  # fmt: skip
        self.texts = _texts_forever(self.seed * 100_000 + 2, self.max_words)

    def request(self, rng: random.Random) -> Request:
        documents = [next(self.texts) for _ in range(rng.randint(1, 4))]
        body = {"model": self.model, "query": next(self.texts), "documents": documents}
        probe, position = None, 0
        if self.sent % 4 == 0:
            probe, position = rng.randrange(len(self.probes)), rng.randrange(len(documents))
            body["query"], documents[position] = self.probes[probe]
        self.sent += 1
        key = None if probe is None else str(probe)
        return Request(body, probe=key, probe_index=position, keep_embedding=True,
                       path="/rerank", base_url=self.server.base_url)  # fmt: skip

    def check(self, outcome: Outcome) -> None:
        assert outcome.ok, f"{outcome.status}: {outcome.error}"
        assert len(outcome.embeddings) == len(outcome.request.body["documents"])
        if outcome.request.probe is not None:
            score = outcome.request.probe_embedding(outcome.embeddings)[0]
            reference = self.references[int(outcome.request.probe)]
            assert abs(score - reference) <= self.MAX_SCORE_CHANGE, "probe differs from alone"


class BadRequests(RequestKind):
    """Every case of tests/support/bad_requests.py in turn: each must get a 400 with a message."""

    def __init__(self, share: float):
        self.share = share
        self.sent = 0

    def prepare(self, base_url: str, model: str) -> None:
        super().prepare(base_url, model)
        self.cases = list(bad_requests(model).items())
        self.case_of: dict[int, str] = {}

    def request(self, rng: random.Random) -> Request:
        name, request = self.cases[self.sent % len(self.cases)]
        self.sent += 1
        request = Request(request.body, path=request.path)  # one object per send
        self.case_of[id(request)] = name
        return request

    def check(self, outcome: Outcome) -> None:
        case = self.case_of[id(outcome.request)]
        assert outcome.status == 400, f"{case}: {outcome.status} {outcome.error}"
        assert outcome.error, f"{case}: no error message"


def _texts_forever(first_seed: int, max_words: int) -> Iterator[str]:
    for chunk in itertools.count():
        yield from word_texts(1000, first_seed + chunk, 1, max_words)


def mixed_requests(
    kinds: dict[str, RequestKind], count: int, seed: int
) -> list[tuple[str, Request]]:
    """`count` (kind name, request) pairs, kinds drawn by their `share`."""
    rng = random.Random(seed)
    names = list(kinds)
    weights = [kinds[name].share for name in names]
    drawn = rng.choices(names, weights, k=count)
    return [(name, kinds[name].request(rng)) for name in drawn]
