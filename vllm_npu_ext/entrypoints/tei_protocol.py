"""Hugging Face text-embeddings-inference (TEI) requests and responses, as vLLM requests.

Each `*_request` function reads a TEI request body (TEI's `router/src/http/types.rs`:
`EmbedRequest`, `RerankRequest`, `SimilarityRequest`, `TokenizeRequest`, `DecodeRequest`) and
returns the body of the vLLM request that computes it, or raises `TeiError` with TEI's error
type and status (`router/src/lib.rs` `ErrorType`; `router/src/http/server.rs`
`impl From<&ErrorType> for StatusCode`). The `*_response` functions turn vLLM's answer into
TEI's response shape. Nothing here talks to a server: `entrypoints/tei.py` does.

Status codes (TEI's `impl From<&ErrorType> for StatusCode`): empty input 400 (`Empty`),
validation and tokenizer errors 422 (a batch larger than the server's client batch limit
included: TEI's router sends 422 for it since 1.9.0, though its OpenAPI document still lists
413 "Batch size error"), backend errors 424, `Overloaded` 429 (`tei.py` counts the inputs in
flight), `Unhealthy` 503. Whether an input longer than the model is truncated when a request
does not say (`truncate` unset) is the server's `auto_truncate` (TEI 1.9: on by default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# TEI's `--max-client-batch-size` default (router/src/main.rs).
DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
STATUS = {"Empty": 400, "Validation": 422, "Tokenizer": 422, "Backend": 424, "Overloaded": 429,
          "Unhealthy": 503}  # fmt: skip
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
    """What the server allows: TEI's `max_client_batch_size`, the model's `max_input_length`,
    its Sentence Transformers `prompts` (None when the checkpoint configures none) and
    whether inputs are truncated when a request does not say (`auto_truncate`)."""

    max_client_batch_size: int = DEFAULT_MAX_CLIENT_BATCH_SIZE
    max_input_length: int | None = None
    prompts: dict[str, str] | None = None
    auto_truncate: bool = True


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
    body.update(_truncation(payload, limits))
    return body


def embed_all_request(payload: Any, limits: TeiLimits) -> dict[str, Any]:
    """`POST /embed_all` -> its inputs (the prompt applied) and truncation, as for `/embed`
    (`normalize` and `dimensions` do not apply: TEI pools and normalises nothing here)."""
    return embed_request({k: v for k, v in _object(payload).items()
                          if k not in ("normalize", "dimensions")}, limits)  # fmt: skip


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
    body.update(_truncation(parameters, limits))
    return body


def similarity_response(openai_body: dict[str, Any]) -> list[float]:
    """Cosine similarity of the source sentence's embedding to each other sentence's."""
    source, *others = embed_response(openai_body)
    return [_cosine(source, other) for other in others]


def rerank_request(payload: Any, limits: TeiLimits) -> tuple[dict[str, Any], bool]:
    """`POST /rerank` -> (vLLM's `/rerank` body, `return_text`).

    `raw_scores` asks for the classifier's logit instead of its sigmoid (vLLM's
    `use_activation=False`). Truncation is vLLM's `truncate_prompt_tokens=-1` with
    `truncation_side`, which our scoring validator applies to each document of
    Qwen3-Reranker (its start kept, or its end for `truncation_direction` left), so the
    template and the query stay whole (`rerank_truncation.py`).
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
    body.update(_truncation(payload, limits))
    return body, _bool(payload, "return_text", False)


def predict_request(payload: Any, limits: TeiLimits) -> tuple[list, bool]:
    """`POST /predict` -> (its sequences, whether the request held one): TEI's untagged
    `PredictInput`, a sequence (a string, or a [text, text] pair) or a batch of them."""
    payload = _object(payload)
    inputs = _required(payload, "inputs")
    if isinstance(inputs, str) or _is_pair(inputs):
        return [inputs], True
    if not isinstance(inputs, list) or not all(isinstance(i, str) or _is_pair(i)
                                               for i in inputs):  # fmt: skip
        raise TeiError("`inputs` must be a string, a [text, text] pair or a list of those")
    if not inputs:
        raise TeiError("`inputs` cannot be empty", "Empty")
    _check_batch_size(len(inputs), limits)
    return inputs, False


def predict_score_body(sequences: list, payload: dict, limits: TeiLimits) -> dict[str, Any]:
    """vLLM's `/score` body for pairs (a reranker scores pairs; one text alone is refused)."""
    if not all(_is_pair(sequence) for sequence in sequences):
        raise TeiError("this reranker scores (query, document) pairs: send `inputs` as "
                       "[query, document] or a list of such pairs")  # fmt: skip
    if any(text == "" for pair in sequences for text in pair):
        raise TeiError("`inputs` cannot be empty", "Empty")
    body: dict[str, Any] = {"queries": [pair[0] for pair in sequences],
                            "documents": [pair[1] for pair in sequences]}  # fmt: skip
    if _bool(payload, "raw_scores", False):
        body["use_activation"] = False
    body.update(_truncation(payload, limits))
    return body


def predict_response(score_body: dict[str, Any], label: str, single: bool) -> list:
    """vLLM's `/score` answer as TEI's `PredictResponse`: per sequence a list of
    `{score, label}` (one label: the reranker's)."""
    data = sorted(score_body["data"], key=lambda item: item["index"])
    predictions = []
    for item in data:
        if item["score"] is None or math.isnan(item["score"]):
            raise TeiError("score is NaN", "Backend")
        predictions.append([{"score": item["score"], "label": label}])
    return predictions[0] if single else predictions


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


def _truncation(payload: dict, limits: TeiLimits) -> dict[str, Any]:
    """TEI's `truncate` (unset: the server's `auto_truncate`) and `truncation_direction` as
    vLLM's truncation fields (to the model's length: `truncate_prompt_tokens=-1`), or nothing
    when not truncating."""
    direction = payload.get("truncation_direction", "right")
    if direction not in TRUNCATION_DIRECTIONS:
        raise TeiError(f"`truncation_direction` must be left or right, got {direction!r}")
    if not _bool(payload, "truncate", limits.auto_truncate):
        return {}
    return {"truncate_prompt_tokens": -1, "truncation_side": TRUNCATION_DIRECTIONS[direction]}


def _check_batch_size(size: int, limits: TeiLimits) -> None:
    if size > limits.max_client_batch_size:
        raise TeiError(f"batch size {size} > maximum allowed batch size "
                       f"{limits.max_client_batch_size}", "Validation")  # fmt: skip


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


def _is_pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def input_count(route: str, payload: Any) -> int:
    """How many inputs a TEI request computes (each takes one of TEI's concurrency permits);
    0 for a body that the route's own checks refuse."""
    if not isinstance(payload, dict):
        return 0
    if route == "/rerank":
        texts = payload.get("texts")
        return len(texts) if isinstance(texts, list) else 0
    if route == "/similarity":
        inputs = payload.get("inputs")
        sentences = inputs.get("sentences") if isinstance(inputs, dict) else None
        return len(sentences) + 1 if isinstance(sentences, list) else 0
    inputs = payload.get("inputs")
    one_pair = route == "/predict" and _is_pair(inputs)
    if isinstance(inputs, str) or _is_ids(inputs) and inputs or one_pair:
        return 1
    return len(inputs) if isinstance(inputs, list) else 0


def input_characters(route: str, payload: Any) -> int:
    """Characters of a request's texts (TEI's `x-compute-characters`)."""
    if not isinstance(payload, dict):
        return 0
    texts: list = []
    if route == "/rerank":
        texts = [payload.get("query"), *(payload.get("texts") or [])]
    elif route == "/similarity":
        inputs = payload.get("inputs") if isinstance(payload.get("inputs"), dict) else {}
        texts = [inputs.get("source_sentence"), *(inputs.get("sentences") or [])]
    else:
        inputs = payload.get("inputs")
        texts = [inputs] if isinstance(inputs, str) else inputs if isinstance(inputs, list) else []
        texts = [t for item in texts for t in (item if _is_pair(item) else [item])]
    return sum(len(text) for text in texts if isinstance(text, str))


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(v) for v in value)


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norm if norm else 0.0
