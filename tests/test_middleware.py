"""The embeddings request validator, as a pure function and as ASGI middleware."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from vllm_npu_ext.entrypoints.middleware import (
    MAX_INPUTS,
    EmbeddingRequestValidator,
    validate_embedding_request,
)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"input": ""}, "input must not be an empty string"),
        ({"input": ["a", ""]}, r"input\[1\] must not be an empty string"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, "at most 2048"),
    ],
)
def test_rejected_payloads(payload, message):
    error = validate_embedding_request(payload)
    assert error is not None and re.search(message, error)


@pytest.mark.parametrize(
    "payload",
    [{"input": "x"}, {"input": ["a", "b"]}, {"input": [[1, 2]]}, {"input": 3}, [], "text",
     {"input": ["a"] * MAX_INPUTS}],
)  # fmt: skip
def test_payloads_left_to_vllm(payload):
    assert validate_embedding_request(payload) is None


def _call(path: str, body: bytes, method: str = "POST"):
    seen, sent = {}, []

    async def app(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path}
    asyncio.run(EmbeddingRequestValidator(app)(scope, receive, send))
    return seen, sent


def test_middleware_answers_400_without_calling_vllm():
    seen, sent = _call("/v1/embeddings", json.dumps({"input": ""}).encode())
    assert "body" not in seen
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["message"] == "input must not be an empty string"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/embeddings", b'{"input": "ok"}'), ("/v1/embeddings", b"{broken"),
     ("/v1/completions", b'{"input": ""}')],
)  # fmt: skip
def test_middleware_passes_the_same_body_on(path, body):
    seen, sent = _call(path, body)
    assert seen["body"] == body
    assert sent[0]["status"] == 200
