"""Faults on the shared server while good requests are in flight.

Bad requests interleaved with good ones must each get a 4xx with a message, and clients that
go away mid-request (while uploading, or while the server computes) must not hurt the server
or anyone else's request. tests/test_server.py checks each bad request on an idle server.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time

import httpx
import pytest
from support.bad_requests import bad_requests
from support.hf_oracle import MIN_COSINE
from support.loadgen import (
    Request,
    cosine,
    embed_alone,
    run_load,
    run_load_async,
    served_model,
    word_texts,
)

GOOD_TEXTS = 12
ABANDONED_WORK_DROPPED_WITHIN_S = 30
# Marks of a request the server failed to handle (vLLM/uvicorn log these on a crash).
SERVER_FAILURE_MARKS = ("Exception in ASGI application", "Traceback (most recent call last)")


@pytest.fixture(scope="module")
def model(embedding_server):
    return served_model(embedding_server.base_url)


@pytest.fixture(scope="module")
def good(embedding_server, model):
    """Texts and their embeddings computed alone, on an idle server."""
    texts = word_texts(GOOD_TEXTS, 11, 1, 60)
    return texts, embed_alone(embedding_server.base_url, model, texts)


def good_requests(model: str, texts: list[str], count: int) -> list[Request]:
    return [
        Request({"model": model, "input": texts[i % len(texts)]}, probe=str(i % len(texts)))
        for i in range(count)
    ]


def assert_good(outcomes, references) -> int:
    checked = 0
    for outcome in outcomes:
        assert outcome.ok, f"{outcome.status}: {outcome.error}"
        assert cosine(outcome.embeddings[0], references[int(outcome.request.probe)]) >= MIN_COSINE
        checked += 1
    return checked


@pytest.fixture
def server_log_since(embedding_server):
    """The shared server's log written during this test only (earlier tests' lines excluded)."""
    start = len(embedding_server.log_text())
    return lambda: embedding_server.log_text()[start:]


def assert_server_clean(log: str) -> None:
    for mark in SERVER_FAILURE_MARKS:
        assert mark not in log, log[-6000:]


def test_bad_requests_interleaved_with_good_ones(embedding_server, model, good, server_log_since):
    texts, references = good
    bad = bad_requests(model)
    bad["unknown model"] = Request({"model": "no-such-model", "input": "hello"})
    requests = good_requests(model, texts, 160) + [r for r in bad.values() for _ in range(2)]
    random.Random(12).shuffle(requests)
    outcomes, _ = run_load(embedding_server.base_url, requests, 16, timeout=120)
    kinds = {id(request): kind for kind, request in bad.items()}
    good_outcomes = []
    for outcome in outcomes:
        kind = kinds.get(id(outcome.request))
        if kind is None:
            good_outcomes.append(outcome)
            continue
        assert 400 <= outcome.status < 500, f"{kind}: {outcome.status} {outcome.error}"
        assert outcome.error, f"{kind}: no error message"
    assert assert_good(good_outcomes, references) == 160
    assert_server_clean(server_log_since())


def test_unknown_model_is_a_404_naming_the_model(embedding_server):
    body = {"model": "no-such-model", "input": "hello"}
    response = httpx.post(f"{embedding_server.base_url}/v1/embeddings", json=body, timeout=30)
    assert response.status_code == 404
    assert "no-such-model" in response.json()["error"]["message"]


async def _abandon_then_serve(base_url: str, model: str, texts, heavy: list[Request]):
    """Heavy requests whose clients give up after 50 ms, alongside normal clients."""
    abandoned = run_load_async(base_url, heavy, 8, timeout=0.05)
    served = run_load_async(base_url, good_requests(model, texts, 48), 4, timeout=120)
    (abandoned_outcomes, _), (served_outcomes, _) = await asyncio.gather(abandoned, served)
    return abandoned_outcomes, served_outcomes


def test_clients_leaving_mid_request_do_not_hurt_others(
    embedding_server, model, good, server_log_since
):
    texts, references = good
    long_texts = word_texts(512, 13, 40, 60)
    heavy = [Request({"model": model, "input": long_texts}) for _ in range(16)]
    abandoned, served = asyncio.run(
        _abandon_then_serve(embedding_server.base_url, model, texts, heavy)
    )
    # They left after sending the whole request, while the server was working on it ...
    left = [o for o in abandoned if o.status == 0 and "ReadTimeout" in o.error]
    assert len(left) >= len(heavy) // 2, [o.error or o.status for o in abandoned]
    assert_good(served, references)
    # ... and their work was dropped: computing it all would take minutes on this machine.
    start = time.monotonic()
    after = embed_alone(embedding_server.base_url, model, texts[:2])
    assert time.monotonic() - start < ABANDONED_WORK_DROPPED_WITHIN_S
    assert min(cosine(a, b) for a, b in zip(after, references[:2], strict=False)) >= MIN_COSINE
    assert_server_clean(server_log_since())


@pytest.mark.parametrize("sent_fraction", [0.0, 0.5])
def test_clients_leaving_mid_upload_do_not_hurt_others(
    embedding_server, model, good, server_log_since, sent_fraction
):
    texts, references = good
    body = b'{"model": "' + model.encode() + b'", "input": ["' + b"word " * 2000 + b'"]}'
    for _ in range(8):
        _send_partial(embedding_server.port, body, int(len(body) * sent_fraction))
    after = embed_alone(embedding_server.base_url, model, texts[:2])
    assert min(cosine(a, b) for a, b in zip(after, references[:2], strict=False)) >= MIN_COSINE
    assert httpx.get(f"{embedding_server.base_url}/health", timeout=10).status_code == 200
    assert_server_clean(server_log_since())


def _send_partial(port: int, body: bytes, sent: int) -> None:
    """Announce the whole body, send `sent` bytes of it, then close the connection."""
    head = (
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + body[:sent])
        time.sleep(0.05)
