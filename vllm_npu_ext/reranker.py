"""Qwen3-Reranker through vLLM's score and rerank APIs: the overrides and the prompt template.

Qwen3-Reranker is a Qwen3ForCausalLM checkpoint that scores a (query, document) pair by
P(yes) = softmax(logits[["no", "yes"]])[1] at the last position of a fixed chat prompt. vLLM
serves it as `Qwen3ForSequenceClassification` (`HF_OVERRIDES`): the architecture name selects
the pooling runner with `convert=classify`, `classifier_from_token` and
`is_original_qwen3_reranker` make vLLM's seq-cls adapter build a one-logit head from the "yes"
minus "no" rows of the LM head, and sigmoid of that logit is P(yes). The prompt comes from a
chat template (`TEMPLATE_PATH`, shipped in this package): without one vLLM scores the bare
concatenation of query and document, and the scores are meaningless.

With the plugin the model under the adapter is ours (`patches.vllm_model_registry`): the
fused NPU path and cache-free attention, as for embeddings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from vllm_npu_ext.envs import cache_dir

HF_OVERRIDES: dict = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}
# The model card's default: omitting an instruction costs 1-5% retrieval quality, it says.
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
TEMPLATE_PATH = Path(__file__).resolve().parent / "templates" / "qwen3_reranker.jinja"

# The model card's Transformers usage: prefix + format_instruction(...) + suffix.
PROMPT_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
PROMPT_BODY = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def prompt(query: str, document: str, instruction: str | None = None) -> str:
    """The full prompt the model card builds for one pair (no truncation)."""
    body = PROMPT_BODY.format(
        instruction=instruction or DEFAULT_INSTRUCTION, query=query, document=document
    )
    return PROMPT_PREFIX + body + PROMPT_SUFFIX


@functools.cache
def _shipped_template() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def template_text(instruction: str | None = None) -> str:
    """The chat template, with `instruction` as its default instruction when given."""
    if instruction is not None and not isinstance(instruction, str):
        raise TypeError(f"instruction must be a string, got {type(instruction).__name__}")
    text = _shipped_template()
    if not instruction or instruction == DEFAULT_INSTRUCTION:
        return text
    default_literal = json.dumps(DEFAULT_INSTRUCTION)
    if text.count(default_literal) != 1:
        raise RuntimeError(f"{TEMPLATE_PATH} must hold the default instruction exactly once")
    # A JSON string is a valid Jinja string literal (Jinja unescapes with Python's rules);
    # ensure_ascii=False keeps characters outside the BMP in one piece.
    return text.replace(default_literal, json.dumps(instruction, ensure_ascii=False))


def template_path(instruction: str | None = None, directory: Path | None = None) -> Path:
    """A file holding `template_text(instruction)`: the shipped one for the default
    instruction, else a copy named by its content in `directory` (default: the cache)."""
    text = template_text(instruction)
    if text == _shipped_template():
        return TEMPLATE_PATH
    directory = directory or cache_dir() / "templates"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    path = directory / f"qwen3_reranker-{digest}.jinja"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    return path
