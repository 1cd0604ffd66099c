"""The HTTP load generator of `benchmarks/bench_serve.py`, for the load and fault tests.

The tests drive the benchmark's own `run_load`, so the tool users run is the one CI checks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import bench_serve  # noqa: E402

Request = bench_serve.Request
Outcome = bench_serve.Outcome
cosine = bench_serve.cosine
run_load = bench_serve.run_load
run_load_async = bench_serve.run_load_async
summarise = bench_serve.summarise
word_texts = bench_serve.word_texts
served_model = bench_serve.served_model


def embed_alone(base_url: str, model: str, inputs: list, **extra) -> list[list[float]]:
    """Embeddings of each input sent in a request of its own, one request at a time."""
    vectors = []
    for item in inputs:
        response = httpx.post(
            f"{base_url}/v1/embeddings", json={"model": model, "input": item, **extra},
            timeout=120,
        )  # fmt: skip
        response.raise_for_status()
        vectors.append(response.json()["data"][0]["embedding"])
    return vectors


def embed_batch(base_url: str, model: str, inputs: list, **extra) -> list[list[float]]:
    """Embeddings of all inputs sent in one request."""
    response = httpx.post(
        f"{base_url}/v1/embeddings", json={"model": model, "input": inputs, **extra},
        timeout=120,
    )  # fmt: skip
    response.raise_for_status()
    return [d["embedding"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]
