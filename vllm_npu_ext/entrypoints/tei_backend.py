"""The served model as text-embeddings-inference sees it, and the in-process calls to vLLM's
own handlers that answer TEI's routes (`tei.py` routes the requests here).

Each route's answer comes with the prompt tokens vLLM counted (TEI's `x-compute-tokens`).
Requests go through vLLM's `/v1/embeddings`, `/pooling`, `/rerank` and `/score` in the same
app, so the engine, the tokenizer and the request checks are vLLM's; `/tokenize` and
`/decode` use the server's tokenizer.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_npu_ext import __version__, envs
from vllm_npu_ext.entrypoints import tei_protocol as protocol
from vllm_npu_ext.entrypoints.tei_protocol import TeiError, TeiLimits
from vllm_npu_ext.tiny_model import ST_CONFIG

# Pooling types as TEI's /info names them (`text_embeddings_backend::Pool`).
POOLING_NAMES = {"LAST": "last_token", "CLS": "cls", "MEAN": "mean"}
# TEI's messages where a model lacks the route's head (core/src/infer.rs, router/src/http/
# server.rs, v1.9.3), all `Backend` errors (424) whose text TextEmbeddingsError prefixes.
NOT_EMBEDDING = "Backend error: Model is not an embedding model"
NOT_SPLADE = "Backend error: Model is not an embedding model with SPLADE pooling"
NOT_CLASSIFIER = "Backend error: Model is not a classifier model"
NOT_RERANKER = "Backend error: model is not a re-ranker model"


@dataclass(frozen=True)
class Client:
    """The client's request: its ASGI scope, and its connection (the body already read)."""

    scope: dict
    receive: Any


@dataclass(frozen=True)
class Answer:
    """A route's JSON answer and the prompt tokens vLLM computed for it (None: no model ran)."""

    body: Any
    prompt_tokens: int | None = None


class TeiBackend:
    """TEI's routes answered by the app's vLLM handlers (`call`)."""

    def __init__(self, app, state, vllm_config) -> None:
        self.app = app
        self.state = state
        self.model_config = vllm_config.model_config
        self.scheduler_config = vllm_config.scheduler_config
        self.reranker = is_classifier(self.model_config)
        self.limits = TeiLimits(
            max_client_batch_size=envs.TEI_MAX_CLIENT_BATCH_SIZE(),
            max_input_length=self.model_config.max_model_len,
            prompts=sentence_transformers_prompts(self.model_config),
            auto_truncate=envs.TEI_AUTO_TRUNCATE(),
        )

    async def answer(self, client: Client, route: str, payload: Any) -> Answer:
        """The answer of TEI route `route` ("/" and "/invocations" already resolved)."""
        if route == "/tokenize":
            return Answer(self.tokenize(payload))
        if route == "/decode":
            return Answer(self.decode(payload))
        handlers = {"/rerank": self.rerank, "/predict": self.predict, "/embed": self.embed,
                    "/embed_all": self.embed_all, "/similarity": self.similarity,
                    "/embed_sparse": self.embed_sparse}  # fmt: skip
        return await handlers[route](client, payload)

    async def embed(self, client: Client, payload: Any) -> Answer:
        body = protocol.embed_request(payload, self.limits)
        self._needs_embedding_model()
        answer = await self.call(client, "/v1/embeddings", body)
        return Answer(protocol.embed_response(answer), _prompt_tokens(answer))

    async def embed_all(self, client: Client, payload: Any) -> Answer:
        """Every token's last hidden state, unnormalised as TEI's `embed_all` returns them:
        vLLM's token-embedding pooling (`task: token_embed`). vLLM's `/pooling` route serves
        only the one pooling task the server was started for (`--pooler-config.task`, embed
        here), while the engine supports both, so the inputs go to the engine directly."""
        request = protocol.embed_all_request(payload, self.limits)
        self._needs_embedding_model()
        prompts = [self._token_ids(item, request) for item in request["input"]]
        vectors = await asyncio.gather(*(self._token_embeddings(ids) for ids in prompts))
        return Answer(vectors, sum(len(ids) for ids in prompts))

    def _token_ids(self, item: str | list[int], request: dict) -> list[int]:
        """The prompt vLLM's embeddings route would build (special tokens added; with
        truncation, the content cut to the model's length and the special tokens kept, as
        `truncate_prompt_tokens=-1` does)."""
        if not isinstance(item, str):
            ids = list(item)
        else:
            tokenizer = self.tokenizer()
            ids = tokenizer(item)["input_ids"]
            limit = self.model_config.max_model_len
            if "truncate_prompt_tokens" in request and len(ids) > limit:
                content = tokenizer(item, add_special_tokens=False)["input_ids"]
                ids = truncated_ids(ids, content, limit, request["truncation_side"])
        return ids

    async def _token_embeddings(self, ids: list[int]) -> list[list[float]]:
        from vllm import PoolingParams

        params = PoolingParams(task="token_embed", use_activation=False)
        params.verify(self.model_config)
        request_id = f"tei-embed-all-{uuid.uuid4().hex}"
        last = None
        try:
            async for output in self.state.engine_client.encode(
                    {"prompt_token_ids": ids}, params, request_id):  # fmt: skip
                last = output
        except (ValueError, TypeError) as error:  # vLLM's request checks
            raise TeiError(str(error)) from None
        return last.outputs.data.float().tolist()

    async def embed_sparse(self, client: Client, payload: Any) -> Answer:
        protocol.embed_request(payload, self.limits)  # TEI validates the body first
        raise TeiError(NOT_SPLADE, "Backend")

    async def similarity(self, client: Client, payload: Any) -> Answer:
        body = protocol.similarity_request(payload, self.limits)
        self._needs_embedding_model()
        answer = await self.call(client, "/v1/embeddings", body)
        return Answer(protocol.similarity_response(answer), _prompt_tokens(answer))

    async def rerank(self, client: Client, payload: Any) -> Answer:
        body, return_text = protocol.rerank_request(payload, self.limits)
        if not self.reranker:
            raise TeiError(NOT_RERANKER, "Backend")
        answer = await self.call(client, "/rerank", body)
        ranks = protocol.rerank_response(answer, body["documents"], return_text)
        return Answer(ranks, _prompt_tokens(answer))

    async def predict(self, client: Client, payload: Any) -> Answer:
        """A reranker scores (query, document) pairs, as TEI's classifier backend does for a
        reranker; an embedding model has no classifier head (TEI's 424)."""
        sequences, single = protocol.predict_request(payload, self.limits)
        if not self.reranker:
            raise TeiError(NOT_CLASSIFIER, "Backend")
        body = protocol.predict_score_body(sequences, payload, self.limits)
        answer = await self.call(client, "/score", body)
        label = self.id2label().get("0", "LABEL_0")
        return Answer(protocol.predict_response(answer, label, single), _prompt_tokens(answer))

    def _needs_embedding_model(self) -> None:
        if self.reranker:
            raise TeiError(NOT_EMBEDDING, "Backend")

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
        """TEI's `Info` (its OpenAPI document's required fields all set) from the server's
        configuration; `vllm_version` is ours."""
        import vllm

        config = self.model_config
        args = getattr(self.state, "args", None)
        served = getattr(config, "served_model_name", None) or getattr(args, "model", None)
        if isinstance(served, list | tuple):
            served = served[0]
        return {
            "model_id": str(config.model),
            "model_sha": _model_sha(config),
            "model_dtype": str(config.dtype).removeprefix("torch."),
            "served_model_name": str(served or config.model),
            "model_type": self._model_type(),
            "max_concurrent_requests": envs.TEI_MAX_CONCURRENT_REQUESTS(),
            "max_input_length": config.max_model_len,
            "max_batch_tokens": self.scheduler_config.max_num_batched_tokens,
            "max_batch_requests": self.scheduler_config.max_num_seqs,
            "max_client_batch_size": self.limits.max_client_batch_size,
            "auto_truncate": self.limits.auto_truncate,
            "tokenization_workers": tokenization_workers(args),
            "version": __version__,
            "sha": None,
            "docker_label": None,
            "vllm_version": vllm.__version__,
        }

    def id2label(self) -> dict[str, str]:
        hf_config = self.model_config.hf_config
        id2label = {str(k): v for k, v in (getattr(hf_config, "id2label", None) or {}).items()}
        return id2label or {"0": "LABEL_0"}

    def _model_type(self) -> dict[str, Any]:
        if self.reranker:
            id2label = self.id2label()
            return {"reranker": {"id2label": id2label,
                                 "label2id": {v: int(k) for k, v in id2label.items()}}}  # fmt: skip
        pooler = getattr(self.model_config, "pooler_config", None)
        kind = getattr(pooler, "seq_pooling_type", None) or getattr(pooler, "pooling_type", None)
        kind = str(getattr(kind, "name", kind) or "LAST").upper()
        return {"embedding": {"pooling": POOLING_NAMES.get(kind, kind.lower())}}

    def tokenizer(self):
        return self.state.engine_client.renderer.get_tokenizer()

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

    async def call(self, client: Client, path: str, body: dict) -> dict:
        """POST `body` to one of vLLM's routes in this app; its JSON answer, or a TeiError."""
        status, answer = await call_app(self.app, client, path, body)
        if status != 200:
            raise protocol.vllm_error(status, answer)
        return answer


def truncated_ids(ids: list[int], content: list[int], limit: int, side: str) -> list[int]:
    """`ids` (content with special tokens around it) cut to `limit` tokens by cutting the
    content from its end (side "right") or its start ("left"), the special tokens kept."""
    start = next((i for i in range(len(ids) - len(content) + 1)
                  if ids[i:i + len(content)] == content), None)  # fmt: skip
    if start is None:
        return ids[:limit] if side == "right" else ids[-limit:]
    prefix, suffix = ids[:start], ids[start + len(content):]
    budget = max(limit - len(prefix) - len(suffix), 0)
    kept = content[:budget] if side == "right" else content[len(content) - budget:]
    return prefix + kept + suffix


def tokenization_workers(args: Any) -> int:
    """Processes that tokenize: vLLM tokenizes in its API server processes
    (`--api-server-count`, 1 unless set)."""
    count = getattr(args, "api_server_count", None)
    return count if isinstance(count, int) and count > 0 else 1


def _model_sha(config: Any) -> str | None:
    """The checkpoint's commit for a hub model in the local cache; None for a directory."""
    if Path(str(config.model)).is_dir():
        return None
    revision = getattr(config, "revision", None)
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(config.model), "config.json", revision=revision)
    except (ImportError, ValueError):
        return None
    parts = Path(found).parts if isinstance(found, str) else ()
    return parts[-2] if len(parts) > 2 and parts[-3] == "snapshots" else None


def _prompt_tokens(answer: dict) -> int | None:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) else None


def is_classifier(model_config) -> bool:
    """TEI's rule (`get_backend_model_type`): an architecture ending in Classification."""
    architectures = getattr(model_config, "architectures", None)
    architectures = architectures or getattr(model_config.hf_config, "architectures", None) or []
    return any(name.endswith("Classification") for name in architectures)


def sentence_transformers_prompts(model_config) -> dict[str, str] | None:
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


async def call_app(app, client: Client, path: str, body: dict) -> tuple[int, Any]:
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
