"""text-embeddings-inference's HTTP API on vLLM's server, so TEI clients need no change.

`TeiRoutes` is ASGI middleware (`vllm-npu-ext serve` adds it; with plain `vllm serve`, pass
`--middleware vllm_npu_ext.entrypoints.tei.TeiRoutes`). It routes as TEI v1.9.3's router
does (`router/src/http/server.rs`, `run`): `POST /embed`, `/embed_all`, `/embed_sparse`,
`/predict`, `/rerank`, `/similarity`, `/tokenize`, `/decode`, the OpenAI route `/embeddings`
(vLLM's `/v1/embeddings`), `GET /info`, and `POST /` and `POST /invocations` by the model type
(an embedding model embeds, a reranker reranks; on an embedding model a body whose `inputs`
holds a `source_sentence`, as huggingface_hub's `InferenceClient.sentence_similarity` posts
it, computes similarities, which TEI does only under `TASK=sentence-similarity`). `GET /`
is the health check; `/health`, `/ping` and `/metrics` are vLLM's own, which answer alike.
Answers come from vLLM's handlers in the same app (`tei_backend.py`).

vLLM also serves `/rerank`, `/tokenize` and `/invocations` with bodies of its own: a body with
TEI's fields (`texts` without `documents`; `inputs` without `prompt` or `messages`) is TEI's,
anything else goes on to vLLM untouched.

TEI's limits, from `vllm-npu-ext serve`'s TEI options (`serve_args.TEI_OPTIONS`, variables
`VLLM_NPU_EXT_TEI_*`): a body above `--payload-limit` bytes gets 413; inputs in flight on
the TEI routes above `--max-concurrent-requests` get 429 "Model is overloaded" (each input of
a batch counts, as each takes one of TEI's permits); a batch above `--max-client-batch-size`
gets 422. With `--api-key`, TEI's routes need the key (a bare 401 without it, as TEI); TEI
keeps `GET /`, `/health`, `/ping` and `/metrics` open, and so do we (vLLM checks the key on
`/v1` paths only). Successful answers carry TEI's `x-compute-type`, `x-compute-time`,
`x-total-time`, `x-compute-characters` and `x-compute-tokens` (vLLM's prompt-token count);
vLLM's handlers report no per-request tokenization, queue or inference time, so
`x-tokenization-time`, `x-queue-time` and `x-inference-time` are not sent.
"""

from __future__ import annotations

import json
import time
from typing import Any

from vllm_npu_ext import envs
from vllm_npu_ext.entrypoints import tei_protocol as protocol
from vllm_npu_ext.entrypoints.asgi import read_body, replay
from vllm_npu_ext.entrypoints.tei_backend import Answer, Client, TeiBackend
from vllm_npu_ext.entrypoints.tei_protocol import TeiError
from vllm_npu_ext.logger import get_logger

TEI_ONLY_POST = frozenset({"/embed", "/embed_all", "/embed_sparse", "/predict", "/similarity",
                           "/decode", "/"})  # fmt: skip
SHARED_POST = frozenset({"/rerank", "/tokenize", "/invocations"})  # vLLM has them too
OPENAI_ALIAS = {"/embeddings": "/v1/embeddings"}
OVERLOADED = "Model is overloaded"  # TEI's TextEmbeddingsError::Overloaded
PAYLOAD_TOO_LARGE = "Failed to buffer the request body: length limit exceeded"  # axum's text


class TeiRoutes:
    """ASGI middleware serving TEI's API beside vLLM's (module docstring)."""

    def __init__(self, app) -> None:
        self.app = app
        self._backend: TeiBackend | None = None
        self._inputs_in_flight = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method"), scope.get("path")
        tei_post = method == "POST" and path in TEI_ONLY_POST | SHARED_POST | set(OPENAI_ALIAS)
        backend = self._backend_for(scope) if tei_post or path in ("/", "/info") else None
        if backend is None:
            return await self.app(scope, receive, send)
        if method == "GET" and path == "/":  # TEI's health check on its root: open
            return await self.app(_with_path(scope, "/health"), receive, send)
        if method == "GET" and path == "/info":
            if not backend.authorized(scope):
                return await _send(send, 401, None)
            return await _send(send, 200, backend.info())
        if not tei_post:
            return await self.app(scope, receive, send)
        return await self._post(backend, scope, receive, send)

    async def _post(self, backend: TeiBackend, scope, receive, send) -> None:
        path = scope["path"]
        body, disconnected = await read_body(receive)
        if disconnected:
            return None
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            payload = exc
        if path in SHARED_POST and not _is_tei_body(path, payload):
            return await self.app(scope, replay(body, receive), send)
        if not backend.authorized(scope):
            return await _send(send, 401, None)
        if len(body) > envs.TEI_PAYLOAD_LIMIT():
            return await _send(send, 413, TeiError(PAYLOAD_TOO_LARGE).body())
        if path in OPENAI_ALIAS:
            return await self.app(_with_path(scope, OPENAI_ALIAS[path]), replay(body, receive),
                                  send)  # fmt: skip
        route = _route(path, backend.reranker, payload)
        start = time.monotonic()
        try:
            if isinstance(payload, Exception):
                raise TeiError(f"request body is not valid JSON: {payload}")
            answer = await self._counted(backend, Client(scope, receive), route, payload)
        except TeiError as error:
            get_logger(__name__).info("TEI %s: %d %s", path, error.status, error.message)
            return await _send(send, error.status, error.body())
        headers = _timing_headers(start, protocol.input_characters(route, payload), answer)
        return await _send(send, 200, answer.body, headers)

    async def _counted(self, backend: TeiBackend, client: Client, route: str,
                       payload: Any) -> Answer:  # fmt: skip
        """The answer, computed while its inputs hold TEI's concurrency permits."""
        count = protocol.input_count(route, payload)
        if count and self._inputs_in_flight + count > envs.TEI_MAX_CONCURRENT_REQUESTS():
            raise TeiError(OVERLOADED, "Overloaded")
        self._inputs_in_flight += count
        try:
            return await backend.answer(client, route, payload)
        finally:
            self._inputs_in_flight -= count

    def _backend_for(self, scope) -> TeiBackend | None:
        """What TEI's routes need from the app, or None on a server that does not pool."""
        if self._backend is None:
            state = getattr(scope.get("app"), "state", None)
            vllm_config = getattr(state, "vllm_config", None)
            model_config = getattr(vllm_config, "model_config", None)
            if getattr(model_config, "runner_type", None) != "pooling":
                return None
            self._backend = TeiBackend(self.app, state, vllm_config)
        return self._backend


def _route(path: str, reranker: bool, payload: Any) -> str:
    """The TEI route a request takes: `POST /` and `/invocations` by model type."""
    if path not in ("/", "/invocations"):
        return path
    if reranker:
        return "/rerank"
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    return "/similarity" if isinstance(inputs, dict) and "source_sentence" in inputs else "/embed"


def _is_tei_body(path: str, payload: Any) -> bool:
    """Whether a body for a path vLLM serves too is TEI's."""
    if not isinstance(payload, dict):
        return False
    if path == "/rerank":
        return "texts" in payload and "documents" not in payload
    if path == "/invocations" and "texts" in payload and "query" in payload:
        return True
    return "inputs" in payload and "prompt" not in payload and "messages" not in payload


def _timing_headers(start: float, characters: int, answer: Answer) -> list[tuple[bytes, bytes]]:
    """TEI's response headers from what vLLM reports (module docstring)."""
    from vllm.platforms import current_platform

    elapsed_ms = b"%d" % int((time.monotonic() - start) * 1000)
    headers = [(b"x-compute-type", str(current_platform.device_type or "cpu").encode()),
               (b"x-compute-time", elapsed_ms), (b"x-total-time", elapsed_ms),
               (b"x-compute-characters", b"%d" % characters)]  # fmt: skip
    if answer.prompt_tokens is not None:
        headers.append((b"x-compute-tokens", b"%d" % answer.prompt_tokens))
    return headers


def _with_path(scope, path: str) -> dict:
    return {**scope, "path": path, "raw_path": path.encode(), "query_string": b""}


async def _send(send, status: int, content: Any, headers: list | None = None) -> None:
    body = b"" if content is None else json.dumps(content).encode()
    all_headers = [(b"content-length", b"%d" % len(body)), *(headers or [])]
    if content is not None:
        all_headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})
