"""Our Qwen3-Reranker template renders the model card's prompt byte for byte, through the
same call vLLM's score/rerank path makes (`safe_apply_chat_template`), with default,
per-request and per-server instructions."""

from __future__ import annotations

import pytest
from support.rerank_oracle import MODEL_CARD_INSTRUCTION, model_card_prompt, prompt_token_ids

from vllm_npu_ext import reranker

# Characters that a naive template, string literal or escape would mangle.
TRICKY = 'Say "yes" \\ or no\nline two {{ x }} {% raw %} é 😀'
PAIRS = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("a", ""),
    (TRICKY, TRICKY),
]


@pytest.fixture(scope="module")
def tokenizer(reranker_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(reranker_model_dir)


def render(tokenizer, query: str, document: str, template: str, **kwargs) -> str:
    """What vLLM's CrossEncoderIOProcessor.get_score_prompt renders for one pair."""
    from vllm.renderers.hf import safe_apply_chat_template

    messages = [{"role": "query", "content": query}, {"role": "document", "content": document}]
    return safe_apply_chat_template(
        None, tokenizer, messages, chat_template=template, tools=None, tokenize=False, **kwargs
    )


@pytest.mark.parametrize(("query", "document"), PAIRS)
def test_default_prompt_is_the_model_cards_byte_for_byte(tokenizer, query, document):
    rendered = render(tokenizer, query, document, reranker.template_text())
    assert rendered == model_card_prompt(query, document)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert reranker.prompt(query, document) == rendered


def test_prompt_tokens_equal_the_model_cards(tokenizer, reranker_model_dir):
    """vLLM tokenizes the whole rendered prompt; the model card tokenizes prefix, pair and
    suffix apart and concatenates: the same ids here (no special tokens are added)."""
    for query, document in PAIRS:
        rendered = render(tokenizer, query, document, reranker.template_text())
        ids = tokenizer(rendered)["input_ids"]
        assert ids == prompt_token_ids(reranker_model_dir, query, document)


def test_per_request_instruction(tokenizer):
    """Requests pass `instruction`, which vLLM folds into chat_template_kwargs; an empty one
    falls back to the default (vLLM keeps only kwargs the template names)."""
    query, document = PAIRS[0]
    rendered = render(tokenizer, query, document, reranker.template_text(), instruction=TRICKY)
    assert rendered == model_card_prompt(query, document, TRICKY)
    empty = render(tokenizer, query, document, reranker.template_text(), instruction="")
    assert empty == model_card_prompt(query, document)


def test_server_instruction_is_the_default_and_requests_still_override_it(tokenizer):
    template = reranker.template_text(TRICKY)
    query, document = PAIRS[0]
    assert render(tokenizer, query, document, template) == model_card_prompt(
        query, document, TRICKY
    )
    other = "Find passages about rivers"
    assert render(tokenizer, query, document, template, instruction=other) == (
        model_card_prompt(query, document, other)
    )


def test_the_ending_newlines_are_an_expression():
    """Jinja drops a template's final newline: written literally, the prompt would end in
    "</think>\\n" and every score would shift."""
    text = reranker.TEMPLATE_PATH.read_text(encoding="utf-8")
    assert text.rstrip("\n").endswith('</think>{{ "\\n\\n" }}')
    assert reranker.DEFAULT_INSTRUCTION == MODEL_CARD_INSTRUCTION


def test_template_path_for_an_instruction_is_a_stable_copy(tmp_path):
    assert reranker.template_path() == reranker.TEMPLATE_PATH
    assert reranker.template_path(reranker.DEFAULT_INSTRUCTION) == reranker.TEMPLATE_PATH
    path = reranker.template_path(TRICKY, tmp_path)
    assert path.parent == tmp_path and path.read_text(encoding="utf-8") == (
        reranker.template_text(TRICKY)
    )
    assert reranker.template_path(TRICKY, tmp_path) == path
    assert reranker.template_path("another", tmp_path) != path


def test_instruction_must_be_a_string():
    with pytest.raises(TypeError, match="instruction must be a string"):
        reranker.template_text(3)
