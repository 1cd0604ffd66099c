"""Request validation for `/v1/embeddings`, added to vLLM's server with `--middleware`.

vLLM already answers most bad input with HTTP 400 (wrong JSON types, empty lists, token ids
outside the vocabulary, over-long input, invalid `dimensions`). What it accepts, and OpenAI
and text-embeddings-inference reject, is checked here: empty strings (vLLM would embed the
bare EOS token and return a meaningless vector) and batches larger than the API allows.
"""

from __future__ import annotations

import json
from typing import Any

EMBEDDING_PATHS = frozenset({"/v1/embeddings"})
MAX_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request


def validate_embedding_request(payload: Any) -> str | None:
    """An error message for a decoded request body, or None when it may go on to vLLM.

    Only what vLLM would accept wrongly is checked; malformed requests are left to vLLM's
    own schema validation, which names the offending field.
    """
    if not isinstance(payload, dict):
        return None
    inputs = payload.get("input")
    if isinstance(inputs, str):
        return "input must not be an empty string" if inputs == "" else None
    if not isinstance(inputs, list):
        return None
    if len(inputs) > MAX_INPUTS:
        return f"input holds {len(inputs)} items; at most {MAX_INPUTS} are allowed per request"
    for index, item in enumerate(inputs):
        if item == "":
            return f"input[{index}] must not be an empty string"
    return None


class EmbeddingRequestValidator:
    """ASGI middleware: a 400 with an OpenAI-style error body for requests vLLM would mis-serve."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        if scope.get("path") not in EMBEDDING_PATHS:
            return await self.app(scope, receive, send)
        body, disconnected = await _read_body(receive)
        if disconnected:
            return None  # the client left; nothing to answer
        error = _error_for(body)
        if error is not None:
            return await _send_error(send, error)
        return await self.app(scope, _replay(body, receive), send)


def _error_for(body: bytes) -> str | None:
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None  # vLLM reports malformed JSON itself
    return validate_embedding_request(payload)


async def _read_body(receive) -> tuple[bytes, bool]:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def _send_error(send, message: str) -> None:
    body = json.dumps(
        {"error": {"message": message, "type": "BadRequestError", "param": "input", "code": 400}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": body})
