"""The tests of vLLM's `tests/entrypoints/pooling` that do not run here, each with its reason.

Keys are paths under `tests/entrypoints/pooling` (a whole module) or `path::function` (every
parameter of one test function). The reasons are of four kinds: a trained model's numbers (its
tokenizer's ids and token counts, its scores, MTEB results), a multimodal architecture (images
fetched from the network, vision towers), ColBERT late interaction (a BERT encoder with a
projection head), and a package the stacks do not install (mteb). Everything else runs against
`vllm-npu-ext serve` on the tiny stand-ins of models.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import vllm

TOKENIZER_IDS = ("a trained model's numbers: the token ids (or counts) of {model}'s own "
                 "tokenizer; the tiny stand-in has its own vocabulary")  # fmt: skip
MTEB = ("a trained model's numbers: MTEB scores of the trained checkpoint (and the mteb "
        "package, which the stacks do not install)")  # fmt: skip
VISION = ("a multimodal model: images fetched from the network at import and a vision tower, "
          "neither available here (this package serves text Qwen3)")  # fmt: skip
COLBERT = ("ColBERT late interaction: a BERT encoder with a ColBERT projection head, an "
           "architecture outside this package's Qwen3 classes with no tiny stand-in here")


@dataclass(frozen=True)
class Skips:
    modules: dict[str, str] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)


COMMON_MODULES = {
    "embed/test_correctness_mteb.py": MTEB,
    "scoring/test_cross_encoder_correctness_mteb.py": MTEB,
    "classify/test_online_vision.py": VISION,
    "embed/test_online_vision.py": VISION,
    "embed/test_cohere_online_vision.py": VISION,
    "scoring/test_cross_encoder_online_vision.py": VISION,
    "scoring/test_late_interaction_online_vision.py": VISION,
    "scoring/test_late_interaction_offline_vision.py": VISION,
    "scoring/test_late_interaction_online.py": COLBERT,
    "scoring/test_late_interaction_offline.py": COLBERT,
}

REWARD = ("InternLM2's reward model: its modelling code comes from the hub "
          "(`--trust-remote-code`) and the tests count its tokenizer's tokens")
SEMANTICS = ("a trained model's numbers: the test expects trained semantics (the relevant "
             "document ranked first, a score above a threshold, similar texts closer)")

CHUNKS = ("a trained model's numbers: vLLM averages the normalised embeddings of a long text's "
          "chunks without normalising again, and the test expects a norm above 0.8, i.e. "
          "chunks of one text embedded alike (a random stand-in's are not: 0.79)")


def _tokenizer(model: str) -> str:
    return TOKENIZER_IDS.format(model=model)


E5, APEACH = _tokenizer("multilingual-e5-small"), _tokenizer("Qwen2.5-1.5B-apeach")
BGE_RERANKER = _tokenizer("bge-reranker-base")
VLLM_0_23 = Skips(
    modules={**COMMON_MODULES, "reward/test_token_reward_online.py": REWARD,
             "reward/test_token_reward_offline.py": REWARD},
    functions={
        "classify/test_offline.py::test_str_prompts": APEACH,
        "classify/test_offline.py::test_list_prompts": APEACH,
        "classify/test_offline.py::test_token_ids_prompts": APEACH,
        "classify/test_online.py::test_basic": APEACH,
        "classify/test_online.py::test_completion_request": APEACH,
        "classify/test_online.py::test_completion_request_batched": APEACH,
        "classify/test_online.py::test_chat_request": APEACH,
        "embed/test_offline.py::test_str_prompts": E5,
        "embed/test_offline.py::test_list_prompts": E5,
        "embed/test_offline.py::test_token_ids_prompts": E5,
        "embed/test_online.py::test_basic": E5,
        "embed/test_online.py::test_completion_request": E5,
        "embed/test_online.py::test_completion_request_batched": E5,
        "embed/test_online.py::test_chat_request": E5,
        "embed/test_online.py::test_truncate_prompt_tokens": E5,
        "embed/test_cohere_online.py::test_semantic_similarity": SEMANTICS,
        "embed/test_online_long_text.py::test_chunked_processing_response_format": CHUNKS,
        "scoring/test_bi_encoder_online.py::test_rerank_api_texts": SEMANTICS,
        "scoring/test_bi_encoder_online.py::test_rerank_api_top_n": SEMANTICS,
        "scoring/test_cross_encoder_online.py::test_basic": BGE_RERANKER,
        "scoring/test_cross_encoder_online.py::test_rerank_api_texts": SEMANTICS,
        "scoring/test_cross_encoder_online.py::test_rerank_api_top_n": SEMANTICS,
        "token_classify/test_offline.py::test_str_prompts": APEACH,
        "token_classify/test_offline.py::test_token_ids_prompts": APEACH,
        "token_classify/test_online.py::test_pooling_token_classify": APEACH,
        "token_embed/test_offline.py::test_str_prompts": E5,
        "token_embed/test_offline.py::test_token_ids_prompts": E5,
        "token_embed/test_online.py::test_pooling_token_embed": E5,
    },
)
VLLM_0_32 = Skips(modules=dict(COMMON_MODULES), functions={})


def for_version(version: str | None = None) -> Skips:
    version = version or vllm.__version__
    if version.startswith("0.23."):
        return VLLM_0_23
    if version.startswith("0.32."):
        return VLLM_0_32
    raise RuntimeError(f"no skip table for vLLM {version}: run.py pins 0.23.0 and 0.32.0")
