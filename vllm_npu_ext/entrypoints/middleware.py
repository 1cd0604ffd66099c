"""ASGI middleware that `vllm-npu-ext serve` adds to vLLM's server with `--middleware`.

`EmbeddingRequestValidator` validates `/v1/embeddings` requests. vLLM already answers most
bad input with HTTP 400 (wrong JSON types, empty lists, token ids outside the vocabulary,
over-long input, invalid `dimensions`). What it accepts, and OpenAI and
text-embeddings-inference reject, is checked here: empty strings (vLLM would embed the bare
EOS token and return a meaningless vector) and batches larger than the API allows.

`ShutdownGuard` ends requests that are in flight when the engine stops. vLLM's server stops
its engine before its HTTP server; a request whose engine output never came (the output
task was cancelled before it saw the engine die) would wait for ever, and the HTTP server
waits for every open request before it exits, so one such request kept a SIGTERMed server
alive until its client gave up. The guard answers those requests with a 503 instead.
"""

from __future__ import annotations

import asyncio
import contextlib
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


async def _send_error(
    send,
    message: str,
    status: int = 400,
    kind: str = "BadRequestError",
    param: str | None = "input",
) -> None:
    error = {"message": message, "type": kind, "param": param, "code": status}
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


SHUTDOWN_MESSAGE = "the server is shutting down; the request was not completed"


class ShutdownGuard:
    """ASGI middleware: once the engine has stopped, no request waits for it any longer.

    A request still running `grace_s` after the engine client reports `errored` (engine dead
    or its output task stopped) is cancelled and, when nothing was sent yet, answered with
    503 Service Unavailable; requests arriving after that get the 503 at once. Answers that
    were already on their way get the grace period to finish. Apps without an engine client
    (`scope["app"].state.engine_client`) are passed through untouched.
    """

    poll_s = 0.5
    grace_s = 2.0
    cancel_wait_s = 1.0

    def __init__(self, app) -> None:
        self.app = app
        self._stopped: asyncio.Future | None = None  # done once the engine stopped
        self._watcher: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        engine = _engine_client(scope)
        if engine is None:
            return await self.app(scope, receive, send)
        stopped = self._stopped_future(engine)
        if stopped.done() or _engine_stopped(engine):
            _set_done(stopped)
            return await _send_unavailable(send)

        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        request = asyncio.ensure_future(self.app(scope, receive, tracked_send))
        try:
            # One future shared by all requests: no extra task per request.
            await asyncio.wait({request, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                await asyncio.wait({request}, timeout=self.grace_s)
        except asyncio.CancelledError:
            request.cancel()
            raise
        if request.done():
            return request.result()
        request.cancel()
        # Cancelling makes vLLM abort the request on an engine that is gone; do not wait long
        # (and do not let a late exception of the abandoned task be logged as unretrieved).
        request.add_done_callback(_retrieve)
        await asyncio.wait({request}, timeout=self.cancel_wait_s)
        if not started:
            await _send_unavailable(send)
        return None

    def _stopped_future(self, engine) -> asyncio.Future:
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
            self._watcher = asyncio.ensure_future(self._watch(engine, self._stopped))
        return self._stopped

    async def _watch(self, engine, stopped: asyncio.Future) -> None:
        while not _engine_stopped(engine) and not stopped.done():
            await asyncio.sleep(self.poll_s)
        _set_done(stopped)


def _engine_client(scope):
    return getattr(getattr(scope.get("app"), "state", None), "engine_client", None)


def _engine_stopped(engine) -> bool:
    with contextlib.suppress(Exception):
        return bool(engine.errored)
    return False


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _set_done(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _send_unavailable(send) -> None:
    await _send_error(send, SHUTDOWN_MESSAGE, 503, "ServiceUnavailableError", None)
