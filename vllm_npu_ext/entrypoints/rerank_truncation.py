"""`truncate_prompt_tokens` for Qwen3-Reranker: the document is cut, the prompt stays whole.

vLLM applies `truncate_prompt_tokens` to the whole templated prompt, from its end (or its
start with `truncation_side: "left"`), i.e. it cuts the assistant turn after which
Qwen3-Reranker's score is read (or the system prompt and the query). For Qwen3-Reranker this
module cuts each document instead, at a token boundary of its text (as vLLM's
`max_tokens_per_doc` does, `truncate_text_to_tokens`: by the tokenizer's offsets), keeping
its start (`truncation_side` "right", the default) or its end ("left"), so that the rendered
prompt (template, instruction, query and what is kept of the document) has at most
`truncate_prompt_tokens` tokens (-1: the model's length). The count is the server tokenizer's
on the prompt rendered from the server's chat template, as vLLM renders and tokenizes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A rerank body names its query and documents thus; /score bodies in one of three ways.
QUERY_FIELDS = ("query", "queries", "data_1", "text_1")
DOCUMENT_FIELDS = ("documents", "data_2", "text_2", "items")
# Each fitting step removes the excess it measured; BPE seams can need one more round.
MAX_ROUNDS = 8


class NoRoomError(ValueError):
    """The prompt without any document already exceeds the limit."""


@dataclass(frozen=True)
class PromptCounter:
    """Tokens of the prompt vLLM renders for one (query, document) pair."""

    tokenizer: Any
    template: str

    def count(self, query: str, document: str, template_kwargs: dict) -> int:
        messages = [{"role": "query", "content": query},
                    {"role": "document", "content": document}]  # fmt: skip
        prompt = self.tokenizer.apply_chat_template(messages, chat_template=self.template,
                                                    tokenize=False, **template_kwargs)  # fmt: skip
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def fit(self, query: str, document: str, limit: int, side: str,
            template_kwargs: dict) -> str:  # fmt: skip
        """The longest cut of `document` (its start, or its end for side "left") at a token
        boundary whose prompt has at most `limit` tokens; NoRoomError when none has."""
        excess = self.count(query, document, template_kwargs) - limit
        if excess <= 0:
            return document
        offsets = self.tokenizer(document, add_special_tokens=False,
                                 return_offsets_mapping=True)["offset_mapping"]  # fmt: skip
        keep = len(offsets) - excess
        for _ in range(MAX_ROUNDS):
            if keep < 1:
                break
            cut = _cut(document, offsets, keep, side)
            excess = self.count(query, cut, template_kwargs) - limit
            if excess <= 0:
                return cut
            keep -= excess
        empty = self.count(query, "", template_kwargs)
        raise NoRoomError(f"truncate_prompt_tokens ({limit}) leaves no room for the document: "
                          f"the prompt around it takes {empty} tokens")  # fmt: skip


def _cut(document: str, offsets: Sequence[tuple[int, int]], keep: int, side: str) -> str:
    if side == "left":
        return document[offsets[len(offsets) - keep][0]:]
    return document[: offsets[keep - 1][1]]


def template_text(chat_template: str | None) -> str | None:
    """The server's `--chat-template` as text (vLLM takes a path or the template itself)."""
    if not chat_template:
        return None
    path = Path(chat_template)
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError:  # a template string too long to be a path
        pass
    return chat_template


def truncated_body(payload: dict, counter: PromptCounter, max_model_len: int) -> dict | None:
    """`payload` with its documents cut to fit `truncate_prompt_tokens` and that field (and
    `truncation_side`) removed; None when the request is left to vLLM as it is (no limit, a
    limit vLLM refuses itself, or a shape vLLM answers with its own error). NoRoomError
    when the prompt around a document alone exceeds the limit."""
    limit = payload.get("truncate_prompt_tokens")
    if not _is_int(limit) or limit > max_model_len or limit < -1:
        return None  # absent, or vLLM's own 400 ("greater than max_model_len", ge=-1)
    limit = max_model_len if limit == -1 else limit
    side = payload.get("truncation_side") or "right"
    query_field = next((f for f in QUERY_FIELDS if f in payload), None)
    document_field = next((f for f in DOCUMENT_FIELDS if f in payload), None)
    if query_field is None or document_field is None or side not in ("left", "right"):
        return None
    queries, documents = payload[query_field], payload[document_field]
    single = isinstance(documents, str)
    documents = [documents] if single else documents
    if isinstance(queries, list) and len(queries) == 1 and isinstance(documents, list):
        queries = queries[0]  # one query against every document, as vLLM scores it
    if isinstance(queries, str):
        queries = [queries] * len(documents) if isinstance(documents, list) else None
    if not isinstance(documents, list) or not isinstance(queries, list) \
            or len(queries) != len(documents):  # fmt: skip
        return None
    kwargs = dict(payload.get("chat_template_kwargs") or {})
    if isinstance(payload.get("instruction"), str):
        kwargs["instruction"] = payload["instruction"]
    cut = [counter.fit(q, d, limit, side, kwargs) if isinstance(q, str) and isinstance(d, str)
           else d for q, d in zip(queries, documents, strict=True)]  # fmt: skip
    body = {k: v for k, v in payload.items() if k not in ("truncate_prompt_tokens",
                                                          "truncation_side")}  # fmt: skip
    body[document_field] = cut[0] if single else cut
    return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
