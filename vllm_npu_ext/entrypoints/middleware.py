"""ASGI middleware that `vllm-npu-ext serve` adds to vLLM's server with `--middleware`.

`EmbeddingRequestValidator` validates `/v1/embeddings` requests. vLLM already answers most
bad input with HTTP 400 (wrong JSON types, empty lists, token ids outside the vocabulary,
over-long input, invalid `dimensions`). What it accepts, and OpenAI and
text-embeddings-inference reject, is checked here: empty strings (vLLM would embed the bare
EOS token and return a meaningless vector) and batches larger than the API allows.

`ScoringRequestValidator` does the same for `/rerank` and `/score` (and their `/v1`, `/v2`
aliases). vLLM answers 400 for an empty document list, non-string documents and a pair
longer than the model length; it accepts an empty query, and a negative `top_n` in vLLM 0.23
(read as "every document"; 0.32 answers 400 itself, and this check is left to it there).
For Qwen3-Reranker it applies `truncate_prompt_tokens` to the document, so that the template
and the query stay whole (`rerank_truncation.py`; vLLM would cut the templated prompt's end,
the assistant turn after which the score is read).

Our own checks' messages start with the name of the offending request field, which becomes
the error's `param`. What vLLM 0.32 answers itself these validators leave to vLLM; where vLLM
0.23 does not answer (it embeds negative token ids, and returns the whole vector for a
`dimensions` above the embedding size), they answer with vLLM 0.32's status and message
("Token id -1 is out of vocabulary"; "Model 'm' only supports dimensions in range [1, 64],
got 100."), in vLLM's own error response.

vLLM 0.23 also lets the exceptions of its input checks (an empty input list, a token id past
the vocabulary, `dimensions` below 1, an unknown model) reach its catch-all exception handler,
which answers 400 (404) but re-raises, so uvicorn logs "Exception in ASGI application" and a
traceback for each bad request and closes its connection; 0.32 answers them without one.
The validators answer an exception that vLLM raises for one of their requests, when vLLM's
own error response for it is a client error (a `ValueError` is a 400, an unknown model a
404), with that response, without the traceback (tested on both versions:
tests/test_server.py, tests/test_faults.py).

`GenerationRequestValidator` adds no check of its own to `/v1/completions` and
`/v1/chat/completions`: it answers the client errors vLLM 0.23 raises past its handler there
(a token id past the vocabulary: "Exception in ASGI application" and a traceback, seen on a
generation server under vllm-ascend) as the other validators do.

`ShutdownGuard` (`shutdown.py`, importable from here too) ends requests that are in flight
when the engine stops. vLLM's server stops
its engine before its HTTP server; a request whose engine output never came (the output
task was cancelled before it saw the engine die) would wait for ever, and the HTTP server
waits for every open request before it exits, so one such request kept a SIGTERMed server
alive until its client gave up. The guard answers those requests with a 503 instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_npu_ext import compat
from vllm_npu_ext.entrypoints import asgi, rerank_truncation
from vllm_npu_ext.entrypoints.shutdown import SHUTDOWN_MESSAGE, ShutdownGuard
from vllm_npu_ext.logger import get_logger

__all__ = ["SHUTDOWN_MESSAGE", "EmbeddingRequestValidator", "GenerationRequestValidator",
           "ScoringRequestValidator", "ShutdownGuard"]

EMBEDDING_PATHS = frozenset({"/v1/embeddings"})
GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
MAX_INPUTS = 2048  # OpenAI's limit on inputs per embeddings request
RERANK_PATHS = frozenset({"/rerank", "/v1/rerank", "/v2/rerank"})
SCORE_PATHS = frozenset({"/score", "/v1/score"})
# The query side of a score request, under each of the field names vLLM accepts.
SCORE_QUERY_FIELDS = ("queries", "data_1", "text_1")


@dataclass(frozen=True)
class Refusal:
    """A 400 for a request: its message and the field it names (None: vLLM's own wording)."""

    message: str
    param: str | None


@dataclass(frozen=True)
class ServedModel:
    """What the validators read about the served model (from the app's ModelConfig)."""

    name: str = "model"
    embedding_size: int | None = None
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] | None = None
    qwen3_reranker: bool = False
    max_model_len: int | None = None


def validate_embedding_request(payload: Any, model: ServedModel | None = None,
                               vllm_checks: bool | None = None) -> Refusal | None:  # fmt: skip
    """Why a decoded `/v1/embeddings` body is refused, or None when it may go on to vLLM.

    Only what vLLM would accept wrongly is checked; malformed requests are left to vLLM's
    own schema validation, which names the offending field. `vllm_checks`: whether this
    vLLM answers negative token ids and `dimensions` out of range itself (0.32; default: the
    installed version's, `compat`).
    """
    if not isinstance(payload, dict):
        return None
    if vllm_checks is None:
        vllm_checks = compat.rejects_negative_token_ids()
    inputs = payload.get("input")
    if inputs == "":
        return _ours("input must not be an empty string")
    if isinstance(inputs, list) and len(inputs) > MAX_INPUTS:
        return _ours(f"input holds {len(inputs)} items; at most {MAX_INPUTS} are allowed per "
                     "request")  # fmt: skip
    for index, item in enumerate(inputs if isinstance(inputs, list) else []):
        if item == "":
            return _ours(f"input[{index}] must not be an empty string")
    if vllm_checks:
        return None
    return _negative_token_id(inputs) or _dimensions_out_of_range(payload, model)


def _ours(message: str) -> Refusal:
    return Refusal(message, message.split(" ", 1)[0].split("[", 1)[0])


def _negative_token_id(inputs: Any) -> Refusal | None:
    """vLLM 0.32's answer to a prompt holding a negative token id (`validate_token_ids`,
    per prompt, its smallest id)."""
    prompts = [inputs] if _is_ids(inputs) else [i for i in inputs if _is_ids(i)] \
        if isinstance(inputs, list) else []  # fmt: skip
    for ids in prompts:
        if ids and min(ids) < 0:
            return Refusal(f"Token id {min(ids)} is out of vocabulary", None)
    return None


def _dimensions_out_of_range(payload: dict, model: ServedModel | None) -> Refusal | None:
    """vLLM 0.32's answer to `dimensions` above the embedding size of a Matryoshka model
    without listed dimensions (`PoolingParams._set_default_parameters`); 0.23 returns the
    whole vector. Everything else about `dimensions` 0.23 answers itself."""
    dimensions = payload.get("dimensions")
    if model is None or not _is_int(dimensions) or model.embedding_size is None:
        return None
    if not model.matryoshka or model.matryoshka_dimensions or dimensions <= model.embedding_size:
        return None
    return Refusal(f"Model {model.name!r} only supports dimensions in range "
                   f"[1, {model.embedding_size}], got {dimensions}.", None)  # fmt: skip


def validate_scoring_request(path: str, payload: Any,
                             vllm_checks: bool | None = None) -> Refusal | None:  # fmt: skip
    """Why a decoded rerank/score request body is refused, or None. A negative `top_n` is
    left to vLLM where it answers it itself (`vllm_checks`; default: the installed version's,
    `compat`)."""
    if not isinstance(payload, dict):
        return None
    if path in RERANK_PATHS:
        error = _empty_string_error("query", payload.get("query"))
        top_n = payload.get("top_n")
        vllm_checks = compat.checks_top_n() if vllm_checks is None else vllm_checks
        if error is None and not vllm_checks and _is_int(top_n) and top_n < 0:
            error = f"top_n must be >= 0 (0 returns every document), got {top_n}"
    else:
        fields = [name for name in SCORE_QUERY_FIELDS if name in payload]
        error = next(filter(None, (_empty_string_error(f, payload[f]) for f in fields)), None)
    return None if error is None else _ours(error)


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


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(_is_int(v) for v in value)


class _RequestValidator:
    """ASGI middleware: a 400 with an OpenAI-style error body for POSTs to `paths` whose
    JSON body `refusal` refuses; a body `rewritten` changes goes on changed; everything else
    passes through untouched."""

    paths: frozenset[str] = frozenset()

    def __init__(self, app) -> None:
        self.app = app

    def refusal(self, scope, payload: Any) -> Refusal | None:
        raise NotImplementedError

    def rewritten(self, scope, payload: Any) -> Any:
        """A replacement body for vLLM, or None to pass the request on as it came."""
        return None

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        if scope.get("path") not in self.paths:
            return await self.app(scope, receive, send)
        body, disconnected = await asgi.read_body(receive)
        if disconnected:
            return None  # the client left; nothing to answer
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            payload = None  # vLLM reports malformed JSON itself
        try:
            refusal = self.refusal(scope, payload)
            replacement = None if refusal else self.rewritten(scope, payload)
        except ValueError as error:
            refusal = Refusal(str(error), _ours(str(error)).param)
        if refusal is not None:
            return await asgi.send_error(send, refusal.message, param=refusal.param)
        if replacement is not None:
            body = json.dumps(replacement).encode()
            scope = {**scope, "headers": _with_length(scope.get("headers") or [], len(body))}
        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            started = started or message.get("type") == "http.response.start"
            await send(message)

        try:
            return await self.app(scope, asgi.replay(body, receive), tracked_send)
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
            return await asgi.send_json(send, error.model_dump(), error.error.code)


class EmbeddingRequestValidator(_RequestValidator):
    """`validate_embedding_request` on /v1/embeddings."""

    paths = EMBEDDING_PATHS

    def refusal(self, scope, payload: Any) -> Refusal | None:
        return validate_embedding_request(payload, served_model(scope))


class ScoringRequestValidator(_RequestValidator):
    """`validate_scoring_request` on the rerank and score endpoints; Qwen3-Reranker's
    `truncate_prompt_tokens` applied to the documents (`rerank_truncation.py`)."""

    paths = RERANK_PATHS | SCORE_PATHS

    def refusal(self, scope, payload: Any) -> Refusal | None:
        return validate_scoring_request(scope["path"], payload)

    def rewritten(self, scope, payload: Any) -> Any:
        if not isinstance(payload, dict) or payload.get("truncate_prompt_tokens") is None:
            return None
        model = served_model(scope)
        counter = prompt_counter(scope)
        if not model.qwen3_reranker or counter is None or model.max_model_len is None:
            return None
        return rerank_truncation.truncated_body(payload, counter, model.max_model_len)


class GenerationRequestValidator(_RequestValidator):
    """No extra check on the completion endpoints; vLLM 0.23's re-raised client errors there
    are answered without a traceback (module docstring)."""

    paths = GENERATION_PATHS

    def refusal(self, scope, payload: Any) -> Refusal | None:
        return None


def _app_state(scope) -> Any:
    return getattr(scope.get("app"), "state", None)


def _model_config(scope) -> Any:
    """The app's ModelConfig, or None (vLLM 0.23 and 0.32 keep the VllmConfig in
    `app.state.vllm_config`)."""
    return getattr(getattr(_app_state(scope), "vllm_config", None), "model_config", None)


def served_model(scope) -> ServedModel:
    """The served model as the validators see it (defaults where the app has no config)."""
    config = _model_config(scope)
    hf_config = getattr(config, "hf_config", None)
    size = getattr(config, "embedding_size", None)  # vLLM 0.32; 0.23: the hidden size
    size = size if _is_int(size) else getattr(hf_config, "hidden_size", None)
    name = getattr(config, "served_model_name", None) or getattr(config, "model", None)
    dimensions = getattr(config, "matryoshka_dimensions", None)
    max_model_len = getattr(config, "max_model_len", None)
    return ServedModel(
        name=str(name or "model"),
        embedding_size=size if _is_int(size) else None,
        matryoshka=getattr(config, "is_matryoshka", False) is True,
        matryoshka_dimensions=tuple(dimensions) if dimensions else None,
        qwen3_reranker=bool(getattr(hf_config, "is_original_qwen3_reranker", False)),
        max_model_len=max_model_len if _is_int(max_model_len) else None,
    )


def prompt_counter(scope) -> rerank_truncation.PromptCounter | None:
    """Token counts of the prompts the server renders (its tokenizer and chat template)."""
    state = _app_state(scope)
    args = getattr(state, "args", None)
    template = rerank_truncation.template_text(getattr(args, "chat_template", None))
    engine_client = getattr(state, "engine_client", None)
    if template is None or engine_client is None:
        return None
    return rerank_truncation.PromptCounter(engine_client.renderer.get_tokenizer(), template)


def _with_length(headers: list, length: int) -> list:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return [*kept, (b"content-length", b"%d" % length)]
