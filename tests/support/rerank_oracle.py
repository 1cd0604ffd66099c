"""The independent reranker oracle: Qwen3-Reranker's model-card code in Hugging Face transformers.

The prompt pieces are the model card's own text ("Transformers Usage" of Qwen3-Reranker,
QwenLM/Qwen3-Embedding README), written out here rather than taken from the package, so a
mistake in the package's template or prompt cannot hide in the reference. As on the model
card, prefix, pair body and suffix are tokenized separately and concatenated, and the score
is softmax(logits[[no, yes]])[yes] at the last position; each pair runs alone (no padding)
in float32.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

MODEL_CARD_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
MODEL_CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
MODEL_CARD_INSTRUCTION = (
    "Given a web search query, retrieve relevant passages that answer the query"
)

# fp32 vLLM (either path) against this fp32 oracle, per pair.
MAX_SCORE_DIFF = 1e-5


def format_instruction(instruction: str | None, query: str, doc: str) -> str:
    """The model card's `format_instruction`."""
    if instruction is None:
        instruction = MODEL_CARD_INSTRUCTION
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"


def model_card_prompt(query: str, doc: str, instruction: str | None = None) -> str:
    return MODEL_CARD_PREFIX + format_instruction(instruction, query, doc) + MODEL_CARD_SUFFIX


@functools.lru_cache(maxsize=4)
def _model_and_tokenizer(model_dir: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return model, tokenizer


def prompt_token_ids(model_dir, query: str, doc: str, instruction: str | None = None) -> list[int]:
    """prefix + pair + suffix tokens, each tokenized on its own (the model card's way)."""
    _, tokenizer = _model_and_tokenizer(str(model_dir))
    prefix = tokenizer.encode(MODEL_CARD_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(MODEL_CARD_SUFFIX, add_special_tokens=False)
    body = tokenizer(format_instruction(instruction, query, doc))["input_ids"]
    return prefix + body + suffix


def hf_rerank_scores(
    model_dir, query: str, docs: Sequence[str], instruction: str | None = None
) -> list[float]:
    """P(yes) for each (query, doc) pair."""
    model, tokenizer = _model_and_tokenizer(str(model_dir))
    no_id, yes_id = tokenizer.convert_tokens_to_ids(["no", "yes"])
    scores = []
    with torch.no_grad():
        for doc in docs:
            ids = torch.tensor([prompt_token_ids(model_dir, query, doc, instruction)])
            logits = model(input_ids=ids).logits[0, -1, [no_id, yes_id]].float()
            scores.append(torch.softmax(logits, dim=-1)[1].item())
    return scores
