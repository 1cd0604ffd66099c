"""Inputs longer than the model length, and stopping a server under load.

- `truncate_prompt_tokens` on the shared server (max-model-len 128);
- vLLM's chunked processing (`--pooler-config '{"enable_chunked_processing": true,
  "max_embed_len": N}'`) on a server of this module: a long input is cut into
  max-model-len chunks, each embedded on its own, and the result is the token-weighted mean
  of the chunk embeddings, normalised;
- the last test stops this module's server with SIGTERM while clients are sending: one
  server start serves both.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
from support.hf_oracle import MIN_COSINE
from support.loadgen import Request, cosine, embed_alone, run_load, served_model, word_texts
from support.server import running_server
from tokenizers import Tokenizer

from vllm_npu_ext.entrypoints.middleware import SHUTDOWN_MESSAGE

MAX_MODEL_LEN = 128
MAX_EMBED_LEN = 1024
SHUTDOWN_LIMIT_S = 30
CHUNKED_POOLER = {"enable_chunked_processing": True, "max_embed_len": MAX_EMBED_LEN}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def long_text(tokenizer) -> str:
    text = " ".join(word_texts(12, 21, 40, 40))
    if len(tokenizer.encode(text).ids) <= 2 * MAX_MODEL_LEN:
        raise ValueError("long_text must span at least three chunks")
    return text


@pytest.fixture(scope="module")
def chunked_server(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("chunked_server")
    args = [str(tiny_model_dir), "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
            "--gpu-memory-utilization", "0.3", "--pooler-config", json.dumps(CHUNKED_POOLER)]
    with running_server(args, root / "server.log") as server:
        yield server


def _embed(server, body: dict) -> httpx.Response:
    model = served_model(server.base_url)
    return httpx.post(
        f"{server.base_url}/v1/embeddings", json={"model": model, **body}, timeout=120
    )


TRUNCATIONS = {
    # the tokenizer's side (right): the first keep - 1 tokens and the appended EOS
    "first 32": (32, None, lambda ids, keep: ids[: keep - 1] + ids[-1:]),
    "first 128": (MAX_MODEL_LEN, None, lambda ids, keep: ids[: keep - 1] + ids[-1:]),
    "last 32": (32, "left", lambda ids, keep: ids[-keep:]),
}


@pytest.mark.parametrize("case", TRUNCATIONS)
def test_truncate_prompt_tokens_keeps_the_documented_tokens(
    embedding_server, tokenizer, long_text, case
):
    keep, side, expected_ids_of = TRUNCATIONS[case]
    body = {"input": long_text, "truncate_prompt_tokens": keep}
    if side is not None:
        body["truncation_side"] = side
    response = _embed(embedding_server, body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == keep
    expected_ids = expected_ids_of(tokenizer.encode(long_text).ids, keep)
    model = served_model(embedding_server.base_url)
    (expected,) = embed_alone(embedding_server.base_url, model, [expected_ids])
    got = response.json()["data"][0]["embedding"]
    assert cosine(got, expected) >= MIN_COSINE


def test_truncate_prompt_tokens_minus_one_means_max_model_len(embedding_server, long_text):
    response = _embed(embedding_server, {"input": long_text, "truncate_prompt_tokens": -1})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN


def test_truncate_prompt_tokens_above_max_model_len_is_a_400(embedding_server, long_text):
    body = {"input": long_text, "truncate_prompt_tokens": MAX_MODEL_LEN + 1}
    response = _embed(embedding_server, body)
    assert response.status_code == 400
    assert response.json()["error"]["message"]


def test_chunked_processing_is_the_weighted_mean_of_chunk_embeddings(
    chunked_server, tokenizer, long_text
):
    response = _embed(chunked_server, {"input": long_text})
    assert response.status_code == 200, response.text
    ids = tokenizer.encode(long_text).ids
    assert response.json()["usage"]["prompt_tokens"] == len(ids)
    chunks = [ids[i : i + MAX_MODEL_LEN] for i in range(0, len(ids), MAX_MODEL_LEN)]
    model = served_model(chunked_server.base_url)
    chunk_vectors = embed_alone(chunked_server.base_url, model, chunks)
    mean = [
        sum(len(c) * v[d] for c, v in zip(chunks, chunk_vectors, strict=True)) / len(ids)
        for d in range(len(chunk_vectors[0]))
    ]
    assert cosine(response.json()["data"][0]["embedding"], mean) >= MIN_COSINE


def test_chunked_processing_rejects_inputs_over_max_embed_len(chunked_server):
    response = _embed(chunked_server, {"input": "word " * (MAX_EMBED_LEN + 10)})
    assert response.status_code == 400
    assert response.json()["error"]["message"]


def test_short_inputs_are_unchanged_by_chunked_processing(chunked_server, embedding_server):
    texts = word_texts(4, 22, 3, 30)
    model = served_model(embedding_server.base_url)
    plain = embed_alone(embedding_server.base_url, model, texts)
    chunked = embed_alone(chunked_server.base_url, model, texts)
    assert min(cosine(a, b) for a, b in zip(plain, chunked, strict=True)) >= MIN_COSINE


def _load_in_background(server, results: list) -> threading.Thread:
    model = served_model(server.base_url)
    requests = [Request({"model": model, "input": t}) for t in word_texts(3000, 23, 5, 60)]
    thread = threading.Thread(
        target=lambda: results.extend(run_load(server.base_url, requests, 16, timeout=60)[0]),
        daemon=True,
    )
    thread.start()
    return thread


def test_sigterm_under_load_exits_cleanly_in_bounded_time(chunked_server):
    """Runs last in this module: it stops the module's server.

    vLLM stops its engine before its HTTP server, so a request arriving in between gets a
    5xx (with a message) rather than a refused connection; every request must still end.
    """
    outcomes: list = []
    thread = _load_in_background(chunked_server, outcomes)
    time.sleep(5)  # let the load build up
    process = chunked_server.process
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=SHUTDOWN_LIMIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {SHUTDOWN_LIMIT_S} s after SIGTERM; the server log ends:\n"
                    + chunked_server.log_tail(80))  # fmt: skip
    stopped_in = time.monotonic() - start
    leftover = _group_alive_after(process.pid, grace_s=15)
    thread.join(timeout=120)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    assert code == 0, chunked_server.log_tail(60)
    assert stopped_in < SHUTDOWN_LIMIT_S
    assert not leftover, "engine processes outlived the server"
    assert not thread.is_alive(), "a client request hung after the server stopped"
    assert "Application shutdown complete" in chunked_server.log_text()
    assert sum(o.ok for o in outcomes) > 0
    unexplained = [o for o in outcomes if not (o.ok or o.status == 0 or _server_error(o))]
    assert not unexplained, [(o.status, o.error) for o in unexplained[:5]]
    answered = sum(o.ok for o in outcomes)
    refused = sum(o.status == 0 for o in outcomes)
    guarded = sum(o.status == 503 and SHUTDOWN_MESSAGE in (o.error or "") for o in outcomes)
    print(f"SIGTERM: exit {code} after {stopped_in:.1f} s; {answered} answered, "
          f"{len(outcomes) - answered - refused} 5xx ({guarded} by the shutdown guard), "
          f"{refused} connection errors")  # fmt: skip


def _server_error(outcome) -> bool:
    return outcome.status >= 500 and bool(outcome.error)


def _group_alive_after(pgid: int, grace_s: float) -> bool:
    """Whether a process of the group is still alive `grace_s` after the leader exited."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.5)
    return True
