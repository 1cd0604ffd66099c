"""benchmarks/bench_serve.py without a server: which texts it sends, in which order, and how it
summarises what came back."""

from __future__ import annotations

import math

import pytest
from support.loadgen import bench_serve

LEVELS = [1, 4, 16, 64]


@pytest.fixture
def sent(monkeypatch):
    """Runs `bench_serve.main` against a stand-in for `run_load`; returns its calls in order:
    (concurrency, request bodies)."""
    calls = []

    def fake_run_load(url, requests, concurrency, **kwargs):
        calls.append((concurrency, [r.body for r in requests]))
        outcomes = [bench_serve.Outcome(r, 200, 0.01, 5) for r in requests]
        for outcome in outcomes:
            if outcome.request.probe is not None:
                outcome.embeddings = [[1.0, 0.0]]
        return outcomes, 1.0

    monkeypatch.setattr(bench_serve, "run_load", fake_run_load)
    argv = ["--url", "http://unused", "--model", "m", "--requests", "200", "--no-progress",
            "--concurrency", ",".join(map(str, LEVELS)), "--warmup", "32"]  # fmt: skip
    assert bench_serve.main(argv) == 0
    return calls


def test_a_warmup_runs_before_the_timed_levels(sent):
    assert [(concurrency, len(bodies)) for concurrency, bodies in sent] == [
        (max(LEVELS), 32), *((level, 200) for level in LEVELS)
    ]


def test_no_text_is_sent_in_two_levels_or_in_the_warmup_and_a_level(sent):
    per_level = [{body["input"] for body in bodies} for _, bodies in sent]
    for i, texts in enumerate(per_level):
        for other in per_level[i + 1 :]:
            assert not texts & other


def test_probe_texts_repeat_within_their_level_only(sent):
    for _, bodies in sent[1:]:
        probes = [body["input"] for body in bodies[::10]]  # --probe-every 10
        assert len(set(probes)) == bench_serve.PROBE_TEXTS  # each probe text comes back
        fillers = [body["input"] for i, body in enumerate(bodies) if i % 10]
        assert len(set(fillers)) == len(fillers)


def _outcome(status: int, seconds: float, error: str | None = None):
    return bench_serve.Outcome(bench_serve.Request({"input": "x"}), status, seconds, 3, error)


def test_failed_requests_are_counted_and_kept_out_of_rates_and_latencies():
    outcomes = [_outcome(200, s) for s in (0.1, 0.2, 0.3)]
    outcomes += [_outcome(400, 0.001, "bad"), _outcome(0, 0.002, "ConnectError")]
    summary = bench_serve.summarise(outcomes, wall=2.0)
    assert summary["requests"] == 5 and summary["errors"] == 2
    assert summary["requests_per_s"] == 1.5 and summary["tokens_per_s"] == 4.5
    assert summary["p50_ms"] == pytest.approx(200) and summary["p99_ms"] == pytest.approx(300)
    assert summary["first_errors"] == ["0: ConnectError", "400: bad"]


def test_a_level_where_everything_failed_has_no_latency():
    summary = bench_serve.summarise([_outcome(503, 0.01, "down")], wall=1.0)
    assert summary["errors"] == 1 and summary["requests_per_s"] == 0
    assert math.isnan(summary["p50_ms"]) and math.isnan(summary["p99_ms"])
