"""ASGI middleware that `vllm-npu-ext serve` adds to vLLM's server with `--middleware`.

`EmbeddingRequestValidator` validates `/v1/embeddings` requests. vLLM already answers most
bad input with HTTP 400 (wrong JSON types, empty lists, token ids outside the vocabulary,
over-long input, invalid `dimensions`). What it accepts, and OpenAI and
text-embeddings-inference reject, is checked here: empty strings (vLLM would embed the bare
EOS token and return a meaningless vector) and batches larger than the API allows.

`ScoringRequestValidator` does the same for `/rerank` and `/score` (and their `/v1`, `/v2`
aliases). vLLM answers 400 for an empty document list, non-string documents and a pair
longer than the model length; it accepts an empty query, a negative `top_n` in vLLM 0.23
(read as "every document"; 0.32 answers 400 itself), and, for Qwen3-Reranker,
`truncate_prompt_tokens`, which cuts the templated prompt from its end: the assistant turn
after which the score is read, so every truncated pair gets a wrong score.

Every message starts with the name of the offending request field, which becomes the error's
`param`.

vLLM 0.23 also lets the exceptions of its input checks (an empty input list, a token id past
the vocabulary, `dimensions` below 1, an unknown model) reach its catch-all exception handler,
which answers 400 (404) but re-raises, so uvicorn logs "Exception in ASGI application" and a
traceback for each bad request and closes its connection; 0.32 answers them without one.
0.23 accepts negative token ids (0.32 answers 400) and a `dimensions` above the embedding size
(it returns the whole vector; 0.32 answers 400). The validators check those two, and answer
an exception that vLLM raises for one of their requests, when vLLM's own error response for it
is a client error (a `ValueError` is a 400, an unknown model a 404), with that response,
without the traceback (tested on both versions: tests/test_server.py, tests/test_faults.py).

`GenerationRequestValidator` adds no check of its own to `/v1/completions` and
`/v1/chat/completions`: it answers the client errors vLLM 0.23 raises past its handler there
(a token id past the vocabulary: "Exception in ASGI application" and a traceback, seen on a
generation server under vllm-ascend) as the other validators do.

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

from vllm_npu_ext import compat
from vllm_npu_ext.logger import get_logger

EMBEDDING_PATHS = frozenset({"/v1/embeddings"})
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request
RERANK_PATHS = frozenset({"/rerank", "/v1/rerank", "/v2/rerank"})
SCORE_PATHS = frozenset({"/score", "/v1/score"})
# The query side of a score request, under each of the field names vLLM accepts.
SCORE_QUERY_FIELDS = ("queries", "data_1", "text_1")


def validate_embedding_request(payload: Any, embedding_size: int | None = None) -> str | None:
    """An error message for a decoded request body, or None when it may go on to vLLM.

    Only what vLLM would accept wrongly is checked; malformed requests are left to vLLM's
    own schema validation, which names the offending field. `embedding_size`: the served
    model's, the largest valid `dimensions` (unchecked when None).
    """
    if not isinstance(payload, dict):
        return None
    dimensions = payload.get("dimensions")
    if _is_int(dimensions) and embedding_size is not None and dimensions > embedding_size:
        size = embedding_size
        return f"dimensions must be between 1 and {size} (the embedding size), got {dimensions}"
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
        if _is_int(item) and item < 0:
            return f"input[{index}] must be a token id >= 0, got {item}"
        if isinstance(item, list):
            negative = next((i for i, v in enumerate(item) if _is_int(v) and v < 0), None)
            if negative is not None:
                return f"input[{index}][{negative}] must be a token id >= 0, got {item[negative]}"
    return None


def validate_scoring_request(path: str, payload: Any, qwen3_reranker: bool = False) -> str | None:
    """An error message for a decoded rerank/score request body, or None.

    `qwen3_reranker`: the server runs Qwen3-Reranker (`is_original_qwen3_reranker`), whose
    prompt must not be truncated from its end.
    """
    if not isinstance(payload, dict):
        return None
    if path in RERANK_PATHS:
        error = _empty_string_error("query", payload.get("query"))
        top_n = payload.get("top_n")
        if error is None and _is_int(top_n) and top_n < 0:
            error = f"top_n must be >= 0 (0 returns every document), got {top_n}"
    else:
        fields = [name for name in SCORE_QUERY_FIELDS if name in payload]
        error = next(filter(None, (_empty_string_error(f, payload[f]) for f in fields)), None)
    if error is None and qwen3_reranker and payload.get("truncate_prompt_tokens") is not None:
        error = (
            "truncate_prompt_tokens is not supported for Qwen3-Reranker: it cuts the end of "
            "the templated prompt, after which the score is read; limit documents with "
            "max_tokens_per_doc (and queries with max_tokens_per_query) instead"
        )
    return error


def _empty_string_error(name: str, value: Any) -> str | None:
    if value == "":
        return f"{name} must not be an empty string"
    if isinstance(value, list):
        for index, item in enumerate(value):
            if item == "":
                return f"{name}[{index}] must not be an empty string"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _RequestValidator:
    """ASGI middleware: a 400 with an OpenAI-style error body for POSTs to `paths` whose
    JSON body `error_for` rejects; everything else passes through untouched."""

    paths: frozenset[str] = frozenset()

    def __init__(self, app) -> None:
        self.app = app

    def error_for(self, scope, payload: Any) -> str | None:
        raise NotImplementedError

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        if scope.get("path") not in self.paths:
            return await self.app(scope, receive, send)
        body, disconnected = await _read_body(receive)
        if disconnected:
            return None  # the client left; nothing to answer
        try:
            error = self.error_for(scope, json.loads(body))
        except (UnicodeDecodeError, json.JSONDecodeError):
            error = None  # vLLM reports malformed JSON itself
        if error is not None:
            param = error.split(" ", 1)[0].split("[", 1)[0]
            return await _send_error(send, error, param=param)
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            return await self.app(scope, _replay(body, receive), tracked_send)
        except Exception as exc:
            # vLLM 0.23's catch-all handler would answer this and re-raise it: a traceback in
            # the log per bad request, and uvicorn drops the connection, so the client's next
            # request on it fails. A client error (4xx) is answered here as vLLM answers it.
            error = None if started else compat.create_error_response(exc)
            if error is None or error.error.code >= 500:
                raise
            get_logger(__name__).info("%s %s: %d (%s: %s)", scope.get("method"),
                                      scope.get("path"), error.error.code, type(exc).__name__,
                                      exc)  # fmt: skip
            return await _send_json(send, error.model_dump(), error.error.code)


class EmbeddingRequestValidator(_RequestValidator):
    """`validate_embedding_request` on /v1/embeddings."""

    paths = EMBEDDING_PATHS

    def error_for(self, scope, payload: Any) -> str | None:
        return validate_embedding_request(payload, _embedding_size(scope))


class ScoringRequestValidator(_RequestValidator):
    """`validate_scoring_request` on the rerank and score endpoints."""

    paths = RERANK_PATHS | SCORE_PATHS

    def error_for(self, scope, payload: Any) -> str | None:
        return validate_scoring_request(scope["path"], payload, _serves_qwen3_reranker(scope))


class GenerationRequestValidator(_RequestValidator):
    """No extra check on the completion endpoints; vLLM 0.23's re-raised client errors there
    are answered without a traceback (module docstring)."""

    paths = GENERATION_PATHS

    def error_for(self, scope, payload: Any) -> str | None:
        return None


def _model_config(scope) -> Any:
    """The app's ModelConfig, or None (vLLM 0.23 and 0.32 keep the VllmConfig in
    `app.state.vllm_config`)."""
    state = getattr(scope.get("app"), "state", None)
    return getattr(getattr(state, "vllm_config", None), "model_config", None)


def _serves_qwen3_reranker(scope) -> bool:
    """Whether the app's model is Qwen3-Reranker."""
    hf_config = getattr(_model_config(scope), "hf_config", None)
    return bool(getattr(hf_config, "is_original_qwen3_reranker", False))


def _embedding_size(scope) -> int | None:
    """The served model's embedding size: `ModelConfig.embedding_size` (vLLM 0.32), else the
    hidden size (0.23 has no such property; a Qwen3 embedding is its last hidden state)."""
    model_config = _model_config(scope)
    size = getattr(model_config, "embedding_size", None)
    if size is None:
        size = getattr(getattr(model_config, "hf_config", None), "hidden_size", None)
    return size if _is_int(size) else None


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
    await _send_json(send, {"error": error}, status)


async def _send_json(send, content: dict, status: int) -> None:
    body = json.dumps(content).encode()
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
