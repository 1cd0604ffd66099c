"""Hugging Face text-embeddings-inference (TEI) requests and responses, as vLLM requests.

Each `*_request` function reads a TEI request body (TEI's `router/src/http/types.rs`:
`EmbedRequest`, `RerankRequest`, `SimilarityRequest`, `TokenizeRequest`, `DecodeRequest`) and
returns the body of the vLLM request that computes it, or raises `TeiError` with TEI's error
type and status (`router/src/lib.rs` `ErrorType`; `router/src/http/server.rs`
`impl From<&ErrorType> for StatusCode`). The `*_response` functions turn vLLM's answer into
TEI's response shape. Nothing here talks to a server: `entrypoints/tei.py` does.

Status codes: empty input 400 (`Empty`), validation and tokenizer errors 422, a batch larger
than the server's client batch limit 413 (TEI's OpenAPI document lists 413 "Batch size error"
on every route; its router returns 422 for every validation error since TEI 1.9.0 and 413
before), backend errors 424. TEI answers 429 when its concurrent-request limit is reached;
vLLM has no such limit (requests queue), so 429 is never sent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# TEI's `--max-client-batch-size` default (router/src/main.rs).
DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
STATUS = {"Empty": 400, "Validation": 422, "Tokenizer": 422, "Backend": 424, "Unhealthy": 503}
BATCH_TOO_LARGE_STATUS = 413
TRUNCATION_DIRECTIONS = {"left": "left", "Left": "left", "right": "right", "Right": "right"}


class TeiError(Exception):
    """A TEI error response: `{"error": message, "error_type": kind}` with its status."""

    def __init__(self, message: str, kind: str = "Validation", status: int | None = None):
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = STATUS[kind] if status is None else status

    def body(self) -> dict[str, str]:
        return {"error": self.message, "error_type": self.kind}


@dataclass(frozen=True)
class TeiLimits:
    """What the server allows: TEI's `max_client_batch_size`, the model's `max_input_length`
    and its Sentence Transformers `prompts` (None when the checkpoint configures none)."""

    max_client_batch_size: int = DEFAULT_MAX_CLIENT_BATCH_SIZE
    max_input_length: int | None = None
    prompts: dict[str, str] | None = None


def embed_request(payload: Any, limits: TeiLimits) -> dict[str, Any]:
    """`POST /embed` -> the `/v1/embeddings` body. Inputs: a string, token ids, or a list of
    either (TEI's untagged `Input`); one input still answers a list of one embedding."""
    payload = _object(payload)
    inputs = _inputs(_required(payload, "inputs"), limits)
    prompt = _prompt(payload.get("prompt_name"), limits)
    body: dict[str, Any] = {"input": [_with_prompt(item, prompt) for item in inputs]}
    normalize = _bool(payload, "normalize", True)
    if not normalize:
        body["use_activation"] = False
    dimensions = payload.get("dimensions")
    if dimensions is not None:
        if not _is_int(dimensions) or dimensions < 1:
            raise TeiError(f"`dimensions` must be a positive integer, got {dimensions!r}")
        body["dimensions"] = dimensions
    body.update(_truncation(payload))
    return body


def embed_response(openai_body: dict[str, Any]) -> list[list[float]]:
    """The `/v1/embeddings` answer as TEI's `EmbedResponse`: one vector per input, in order."""
    data = sorted(openai_body["data"], key=lambda item: item["index"])
    return [item["embedding"] for item in data]


def similarity_request(payload: Any, limits: TeiLimits) -> dict[str, Any]:
    """`POST /similarity` -> the `/v1/embeddings` body for the source sentence followed by the
    others, unnormalised as TEI embeds them (the cosine does not depend on it)."""
    payload = _object(payload)
    inputs = _object(_required(payload, "inputs"), "inputs")
    source = _string(_required(inputs, "source_sentence", "inputs."), "inputs.source_sentence")
    sentences = _required(inputs, "sentences", "inputs.")
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise TeiError("`inputs.sentences` must be a list of strings")
    if not sentences:
        raise TeiError("`inputs.sentences` cannot be empty", "Empty")
    _check_batch_size(len(sentences) + 1, limits)
    parameters = payload.get("parameters") or {}
    parameters = _object(parameters, "parameters")
    texts = [source, *sentences]
    if any(text == "" for text in texts):
        raise TeiError("`inputs` cannot be empty", "Empty")
    prompt = _prompt(parameters.get("prompt_name"), limits)
    body: dict[str, Any] = {"input": [_with_prompt(t, prompt) for t in texts]}
    body["use_activation"] = False
    body.update(_truncation(parameters))
    return body


def similarity_response(openai_body: dict[str, Any]) -> list[float]:
    """Cosine similarity of the source sentence's embedding to each other sentence's."""
    source, *others = embed_response(openai_body)
    return [_cosine(source, other) for other in others]


def rerank_request(payload: Any, limits: TeiLimits) -> tuple[dict[str, Any], bool, bool]:
    """`POST /rerank` -> (vLLM's `/rerank` body, `return_text`, `truncate`).

    `raw_scores` asks for the classifier's logit instead of its sigmoid (vLLM's
    `use_activation=False`). Truncation is decided by the caller, which knows the prompt's
    length (`tei.py`).
    """
    payload = _object(payload)
    query = _string(_required(payload, "query"), "query")
    texts = _required(payload, "texts")
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise TeiError("`texts` must be a list of strings")
    if not texts:
        raise TeiError("`texts` cannot be empty", "Empty")
    _check_batch_size(len(texts), limits)
    if query == "" or "" in texts:
        raise TeiError("`inputs` cannot be empty", "Empty")
    body: dict[str, Any] = {"query": query, "documents": texts, "top_n": len(texts)}
    if _bool(payload, "raw_scores", False):
        body["use_activation"] = False
    truncate = _truncation(payload)
    if truncate and truncate["truncation_side"] == "left":
        raise TeiError("`truncation_direction` left is not supported on /rerank: documents are "
                       "truncated from their end")  # fmt: skip
    return body, _bool(payload, "return_text", False), bool(truncate)


def rerank_response(vllm_body: dict[str, Any], texts: Sequence[str], return_text: bool) -> list:
    """vLLM's rerank results as TEI's `RerankResponse`: `{index, score[, text]}` sorted by
    score, highest first, ties in TEI's order (an ascending stable sort, reversed)."""
    ranks = []
    for result in vllm_body["results"]:
        score = result["relevance_score"]
        if score is None or math.isnan(score):
            raise TeiError("score is NaN", "Backend")
        rank = {"index": result["index"], "score": score}
        if return_text:
            rank["text"] = texts[result["index"]]
        ranks.append(rank)
    ranks.sort(key=lambda rank: (rank["score"], rank["index"]))
    return ranks[::-1]


def tokenize_request(payload: Any, limits: TeiLimits) -> tuple[list[str], bool]:
    """`POST /tokenize` -> (the texts with the prompt applied, `add_special_tokens`)."""
    payload = _object(payload)
    inputs = _required(payload, "inputs")
    if isinstance(inputs, str):
        inputs = [inputs]
    elif not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise TeiError("`inputs` must be a string or a list of strings")
    elif not inputs:
        raise TeiError("`inputs` cannot be empty", "Empty")
    _check_batch_size(len(inputs), limits)
    if "" in inputs:
        raise TeiError("`inputs` cannot be empty", "Empty")
    prompt = _prompt(payload.get("prompt_name"), limits)
    return [(prompt or "") + text for text in inputs], _bool(payload, "add_special_tokens", True)


def tokens_of(text: str, ids: Sequence[int], offsets, special_mask, pieces) -> list[dict]:
    """TEI's `SimpleToken`s for one encoded text (`core/src/tokenization.rs` `into_tokens`):
    special tokens carry their token string and no offsets; the others the text they cover
    and its UTF-8 byte offsets (TEI reads them from the Rust tokenizer, in bytes)."""
    tokens = []
    for token_id, (start, stop), special, piece in zip(ids, offsets, special_mask, pieces,
                                                       strict=True):  # fmt: skip
        if special:
            tokens.append({"id": token_id, "text": piece, "special": True,
                           "start": None, "stop": None})  # fmt: skip
            continue
        byte_start = len(text[:start].encode())
        byte_stop = byte_start + len(text[start:stop].encode())
        tokens.append({"id": token_id, "text": text[start:stop], "special": False,
                       "start": byte_start, "stop": byte_stop})  # fmt: skip
    return tokens


def decode_request(payload: Any, limits: TeiLimits, vocab_size: int) -> tuple[list, bool]:
    """`POST /decode` -> (a list of id lists, `skip_special_tokens`)."""
    payload = _object(payload)
    ids = _required(payload, "ids")
    if not isinstance(ids, list):
        raise TeiError("`ids` must be a list of token ids or a list of such lists")
    batch = ids if ids and all(isinstance(i, list) for i in ids) else [ids]
    if not ids:
        raise TeiError("`input_ids` cannot be empty", "Empty")
    _check_batch_size(len(batch), limits)
    for row, sequence in enumerate(batch):
        if not sequence:
            raise TeiError("`input_ids` cannot be empty", "Empty")
        for column, token_id in enumerate(sequence):
            if not _is_int(token_id) or not 0 <= token_id < vocab_size:
                where = f"ids[{row}][{column}]" if batch is ids else f"ids[{column}]"
                raise TeiError(f"`{where}` must be a token id in [0, {vocab_size}), got "
                               f"{token_id!r}", "Tokenizer")  # fmt: skip
    return batch, _bool(payload, "skip_special_tokens", True)


def vllm_error(status: int, body: Any) -> TeiError:
    """A vLLM error response as a TEI error: its 4xx are validation errors (422), 503 means
    the server is shutting down, anything else is the backend's (424)."""
    message = body
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message", error) if isinstance(error, dict) else error
    message = str(message)
    if 400 <= status < 500:
        return TeiError(message, "Validation")
    if status == 503:
        return TeiError(message, "Unhealthy")
    return TeiError(message, "Backend")


def _inputs(inputs: Any, limits: TeiLimits) -> list:
    """TEI's untagged `Input`: a string, a list of token ids, or a batch of those."""
    if isinstance(inputs, str) or (_is_ids(inputs) and inputs):
        batch = [inputs]
    elif isinstance(inputs, list):
        batch = inputs
    else:
        raise TeiError("`inputs` must be a string, a list of token ids or a list of those")
    if not batch:
        raise TeiError("`inputs` cannot be empty", "Empty")
    _check_batch_size(len(batch), limits)
    for index, item in enumerate(batch):
        if not isinstance(item, str) and not _is_ids(item):
            raise TeiError(f"`inputs[{index}]` must be a string or a list of token ids")
        if len(item) == 0:
            raise TeiError("`inputs` cannot be empty", "Empty")
        if not isinstance(item, str) and min(item) < 0:
            raise TeiError(f"`inputs[{index}]` holds a negative token id", "Validation")
    return batch


def _with_prompt(item: str | list[int], prompt: str | None) -> str | list[int]:
    if prompt is None:
        return item
    if not isinstance(item, str):
        raise TeiError("`prompt_name` cannot be used with token id inputs")
    return prompt + item


def _prompt(prompt_name: Any, limits: TeiLimits) -> str | None:
    """The Sentence Transformers prompt `prompt_name` names (TEI's `prepare_pre_prompt`)."""
    if prompt_name is None:
        return None
    if not isinstance(prompt_name, str):
        raise TeiError("`prompt_name` must be a string")
    if limits.prompts is None:
        raise TeiError(f"`prompt_name` is set to `{prompt_name}` but no prompts were found in "
                       "the Sentence Transformers configuration")  # fmt: skip
    if prompt_name not in limits.prompts:
        raise TeiError(f"`prompt_name` is set to `{prompt_name}` but it was not found in the "
                       f"Sentence Transformers prompts. Available prompts: "
                       f"{sorted(limits.prompts)}")  # fmt: skip
    return limits.prompts[prompt_name]


def _truncation(payload: dict) -> dict[str, Any]:
    """TEI's `truncate` / `truncation_direction` as vLLM's truncation fields (to the model's
    length: `truncate_prompt_tokens=-1`), or nothing when not truncating."""
    direction = payload.get("truncation_direction", "right")
    if direction not in TRUNCATION_DIRECTIONS:
        raise TeiError(f"`truncation_direction` must be left or right, got {direction!r}")
    if not _bool(payload, "truncate", False):
        return {}
    return {"truncate_prompt_tokens": -1, "truncation_side": TRUNCATION_DIRECTIONS[direction]}


def _check_batch_size(size: int, limits: TeiLimits) -> None:
    if size > limits.max_client_batch_size:
        raise TeiError(f"batch size {size} > maximum allowed batch size "
                       f"{limits.max_client_batch_size}", "Validation",
                       BATCH_TOO_LARGE_STATUS)  # fmt: skip


def _object(value: Any, name: str = "request body") -> dict:
    if not isinstance(value, dict):
        raise TeiError(f"`{name}` must be a JSON object")
    return value


def _required(payload: dict, name: str, prefix: str = "") -> Any:
    if name not in payload:
        raise TeiError(f"missing field `{prefix}{name}`")
    return payload[name]


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise TeiError(f"`{name}` must be a string")
    return value


def _bool(payload: dict, name: str, default: bool) -> bool:
    value = payload.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TeiError(f"`{name}` must be true or false, got {value!r}")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm else 0.0
