"""text-embeddings-inference's HTTP API on vLLM's server, so TEI clients need no change.

`TeiRoutes` is ASGI middleware (`vllm-npu-ext serve` adds it; with plain `vllm serve`, pass
`--middleware vllm_npu_ext.entrypoints.tei.TeiRoutes`). It answers TEI's routes
(text-embeddings-inference `router/src/http/server.rs`): `POST /embed`, `/similarity`,
`/rerank`, `/tokenize`, `/decode`, `GET /info`, and `POST /` routed by the model type (an
embedding model embeds, or computes similarities for a body whose `inputs` holds a
`source_sentence` as huggingface_hub's `InferenceClient.sentence_similarity` posts it; a
reranker reranks). Requests go through vLLM's own `/v1/embeddings` and `/rerank` handlers in
the same app (the same engine, tokenizer and request checks), called in-process, and their
answers are reshaped (`tei_protocol.py`). `/tokenize` and `/decode` use the server's tokenizer.

vLLM also serves `/rerank` and `/tokenize` with bodies of its own: a body with TEI's fields
(`texts` without `documents`; `inputs` without `prompt`) is TEI's, anything else goes on to
vLLM untouched. With `--api-key`, TEI's routes need the key as vLLM's `/v1` routes do (vLLM's
own check covers `/v1` paths only); TEI answers a missing key with a bare 401, and so do we.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_npu_ext import __version__, envs
from vllm_npu_ext.entrypoints import tei_protocol as protocol
from vllm_npu_ext.entrypoints.middleware import _read_body, _replay
from vllm_npu_ext.entrypoints.tei_protocol import TeiError, TeiLimits
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.tiny_model import ST_CONFIG

# Pooling types as TEI's /info names them (`text_embeddings_backend::Pool`).
POOLING_NAMES = {"LAST": "last_token", "CLS": "cls", "MEAN": "mean"}
# Tokens a truncated rerank document gives up besides what the prompt needs: the prompt's
# length is measured once on another pair, and BPE merges at the pair's seams may differ.
RERANK_SEAM_TOKENS = 4
TEI_ONLY_POST = frozenset({"/embed", "/similarity", "/decode", "/"})


@dataclass(frozen=True)
class _Client:
    """The client's request: its ASGI scope, and its connection (the body already read)."""

    scope: dict
    receive: Any


class TeiRoutes:
    """ASGI middleware serving TEI's API beside vLLM's (module docstring)."""

    def __init__(self, app) -> None:
        self.app = app
        self._server: _Server | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method"), scope.get("path")
        if method == "GET" and path in ("/", "/info"):
            server = self._server_for(scope)
            if server is None:
                return await self.app(scope, receive, send)
            if not server.authorized(scope):
                return await _send(send, 401, None)
            if path == "/":  # TEI's health check on its root
                return await self.app(_get_scope(scope, "/health"), receive, send)
            return await _send(send, 200, server.info())
        if method != "POST" or path not in TEI_ONLY_POST | {"/rerank", "/tokenize"}:
            return await self.app(scope, receive, send)
        server = self._server_for(scope)
        if server is None:
            return await self.app(scope, receive, send)
        body, disconnected = await _read_body(receive)
        if disconnected:
            return None
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            payload = exc
        if path not in TEI_ONLY_POST and not _is_tei_body(path, payload):
            return await self.app(scope, _replay(body, receive), send)
        if not server.authorized(scope):
            return await _send(send, 401, None)
        try:
            if isinstance(payload, Exception):
                raise TeiError(f"request body is not valid JSON: {payload}")
            status, answer = 200, await server.answer(_Client(scope, receive), path, payload)
        except TeiError as error:
            get_logger(__name__).info("TEI %s: %d %s", path, error.status, error.message)
            status, answer = error.status, error.body()
        return await _send(send, status, answer)

    def _server_for(self, scope) -> _Server | None:
        """What TEI's routes need from the app, or None on a server that does not pool."""
        if self._server is None:
            state = getattr(scope.get("app"), "state", None)
            vllm_config = getattr(state, "vllm_config", None)
            model_config = getattr(vllm_config, "model_config", None)
            if getattr(model_config, "runner_type", None) != "pooling":
                return None
            self._server = _Server(self.app, state, vllm_config)
        return self._server


class _Server:
    """The served model as TEI sees it, and the in-process calls that answer TEI's routes."""

    def __init__(self, app, state, vllm_config) -> None:
        self.app = app
        self.state = state
        self.model_config = vllm_config.model_config
        self.scheduler_config = vllm_config.scheduler_config
        self.reranker = _is_classifier(self.model_config)
        self.limits = TeiLimits(
            max_client_batch_size=envs.TEI_MAX_CLIENT_BATCH_SIZE(),
            max_input_length=self.model_config.max_model_len,
            prompts=_sentence_transformers_prompts(self.model_config),
        )
        self._rerank_prompt_tokens: int | None = None

    async def answer(self, client: _Client, path: str, payload: Any) -> Any:
        if path == "/":
            path = _root_route(self.reranker, payload)
        if path == "/tokenize":
            return self.tokenize(payload)
        if path == "/decode":
            return self.decode(payload)
        if path == "/rerank":
            return await self.rerank(client, payload)
        if self.reranker:
            raise TeiError("model is not an embedding model", "Backend")
        if path == "/similarity":
            body = protocol.similarity_request(payload, self.limits)
            return protocol.similarity_response(await self.call(client, "/v1/embeddings", body))
        body = protocol.embed_request(payload, self.limits)
        return protocol.embed_response(await self.call(client, "/v1/embeddings", body))

    async def rerank(self, client: _Client, payload: Any) -> list:
        if not self.reranker:
            raise TeiError("model is not a re-ranker model", "Backend")
        body, return_text, truncate = protocol.rerank_request(payload, self.limits)
        if truncate:
            body["max_tokens_per_doc"] = await self._document_budget(client, body["query"])
        answer = await self.call(client, "/rerank", body)
        return protocol.rerank_response(answer, body["documents"], return_text)

    async def _document_budget(self, client: _Client, query: str) -> int:
        """Document tokens that fit beside `query` in the model's length: the prompt around a
        pair is measured once from vLLM's own count for a one-token query and document."""
        if self._rerank_prompt_tokens is None:
            probe = {"query": "a", "documents": ["a"], "top_n": 1}
            usage = (await self.call(client, "/rerank", probe))["usage"]
            self._rerank_prompt_tokens = usage["prompt_tokens"] - 2 * len(self._ids("a"))
        budget = (self.model_config.max_model_len - self._rerank_prompt_tokens
                  - len(self._ids(query)) - RERANK_SEAM_TOKENS)  # fmt: skip
        if budget < 1:
            raise TeiError(f"`query` leaves no room for a document within the model's "
                           f"{self.model_config.max_model_len} tokens")  # fmt: skip
        return budget

    def tokenize(self, payload: Any) -> list[list[dict]]:
        texts, add_special_tokens = protocol.tokenize_request(payload, self.limits)
        tokenizer = self.tokenizer()
        rows = []
        for text in texts:
            encoded = tokenizer(text, add_special_tokens=add_special_tokens,
                                return_offsets_mapping=True,
                                return_special_tokens_mask=True)  # fmt: skip
            ids = encoded["input_ids"]
            pieces = tokenizer.convert_ids_to_tokens(ids)
            rows.append(protocol.tokens_of(text, ids, encoded["offset_mapping"],
                                           encoded["special_tokens_mask"], pieces))  # fmt: skip
        return rows

    def decode(self, payload: Any) -> list[str]:
        tokenizer = self.tokenizer()
        batch, skip_special = protocol.decode_request(payload, self.limits, len(tokenizer))
        return [tokenizer.decode(ids, skip_special_tokens=skip_special) for ids in batch]

    def info(self) -> dict[str, Any]:
        """TEI's `Info`; the fields vLLM has no counterpart for are null (docs/serving.md)."""
        import vllm

        config = self.model_config
        args = getattr(self.state, "args", None)
        served = getattr(config, "served_model_name", None) or getattr(args, "model", None)
        if isinstance(served, list | tuple):
            served = served[0]
        return {
            "model_id": config.model,
            "model_sha": None,
            "model_dtype": str(config.dtype).removeprefix("torch."),
            "served_model_name": served or config.model,
            "model_type": self._model_type(),
            "max_concurrent_requests": None,
            "max_input_length": config.max_model_len,
            "max_batch_tokens": self.scheduler_config.max_num_batched_tokens,
            "max_batch_requests": self.scheduler_config.max_num_seqs,
            "max_client_batch_size": self.limits.max_client_batch_size,
            "auto_truncate": False,
            "tokenization_workers": None,
            "version": __version__,
            "sha": None,
            "docker_label": None,
            "vllm_version": vllm.__version__,
        }

    def _model_type(self) -> dict[str, Any]:
        if self.reranker:
            hf_config = self.model_config.hf_config
            id2label = {str(k): v for k, v in (getattr(hf_config, "id2label", None) or {}).items()}
            id2label = id2label or {"0": "LABEL_0"}
            return {"reranker": {"id2label": id2label,
                                 "label2id": {v: int(k) for k, v in id2label.items()}}}  # fmt: skip
        pooler = getattr(self.model_config, "pooler_config", None)
        kind = getattr(pooler, "seq_pooling_type", None) or getattr(pooler, "pooling_type", None)
        kind = str(getattr(kind, "name", kind) or "LAST").upper()
        return {"embedding": {"pooling": POOLING_NAMES.get(kind, kind.lower())}}

    def tokenizer(self):
        return self.state.engine_client.renderer.get_tokenizer()

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer()(text, add_special_tokens=False)["input_ids"]

    def authorized(self, scope) -> bool:
        """vLLM's key check (its `AuthenticationMiddleware`), for TEI's routes."""
        args = getattr(self.state, "args", None)
        keys = getattr(args, "api_key", None) or [os.environ.get("VLLM_API_KEY")]
        keys = [keys] if isinstance(keys, str) else [k for k in keys if k]
        if not keys:
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        return any(given == f"Bearer {key}" for key in keys)

    async def call(self, client: _Client, path: str, body: dict) -> dict:
        """POST `body` to one of vLLM's routes in this app; its JSON answer, or a TeiError."""
        status, answer = await _call_app(self.app, client, path, body)
        if status != 200:
            raise protocol.vllm_error(status, answer)
        return answer


def _root_route(reranker: bool, payload: Any) -> str:
    """TEI's `POST /` by model type; on an embedding model a similarity body (as
    huggingface_hub's `sentence_similarity` posts to the root) computes similarities (TEI
    does that only when started with `TASK=sentence-similarity`)."""
    if reranker:
        return "/rerank"
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    return "/similarity" if isinstance(inputs, dict) and "source_sentence" in inputs else "/embed"


def _is_tei_body(path: str, payload: Any) -> bool:
    """Whether a body for a path vLLM serves too (`/rerank`, `/tokenize`) is TEI's."""
    if not isinstance(payload, dict):
        return False
    if path == "/rerank":
        return "texts" in payload and "documents" not in payload
    return "inputs" in payload and "prompt" not in payload and "messages" not in payload


def _is_classifier(model_config) -> bool:
    """TEI's rule (`get_backend_model_type`): an architecture ending in Classification."""
    architectures = getattr(model_config, "architectures", None)
    architectures = architectures or getattr(model_config.hf_config, "architectures", None) or []
    return any(name.endswith("Classification") for name in architectures)


def _sentence_transformers_prompts(model_config) -> dict[str, str] | None:
    """`prompts` of the checkpoint's Sentence Transformers config (a local checkpoint's file,
    or for a hub id what vLLM reads for Cohere's `input_type`: `get_hf_file_to_dict`); None
    when there is none."""
    model = Path(str(model_config.model))
    if model.is_dir():
        path = model / ST_CONFIG
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    else:
        from vllm.transformers_utils.repo_utils import get_hf_file_to_dict

        try:
            config = get_hf_file_to_dict(ST_CONFIG, str(model),
                                         getattr(model_config, "revision", None))  # fmt: skip
        except (ValueError, OSError):
            config = None
    prompts = (config or {}).get("prompts")
    if not isinstance(prompts, dict) or not prompts:
        return None
    return {str(name): text for name, text in prompts.items() if isinstance(text, str)}


async def _call_app(app, client: _Client, path: str, body: dict) -> tuple[int, Any]:
    """Run `app` on a POST of `body` to `path` with the client request's own headers (its
    key included); the answer's status and decoded JSON."""
    scope = client.scope
    data = json.dumps(body).encode()
    skip = {b"content-length", b"content-type"}
    headers = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in skip]
    headers += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    inner = {**scope, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers}  # fmt: skip
    status, chunks, sent = 500, [], False

    async def receive():
        # After the body, the client's own connection: vLLM's handlers cancel a request
        # whose client disconnects (they listen on `receive`).
        nonlocal sent
        if sent:
            return await client.receive()
        sent = True
        return {"type": "http.request", "body": data, "more_body": False}

    async def capture(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(inner, receive, capture)
    raw = b"".join(chunks)
    try:
        return status, json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return status, raw.decode("utf-8", "replace")


def _get_scope(scope, path: str) -> dict:
    return {**scope, "path": path, "raw_path": path.encode(), "query_string": b""}


async def _send(send, status: int, content: Any) -> None:
    body = b"" if content is None else json.dumps(content).encode()
    headers = [(b"content-length", b"%d" % len(body))]
    if content is not None:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
