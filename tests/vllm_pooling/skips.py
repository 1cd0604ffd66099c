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

VLLM_0_23 = Skips(modules=dict(COMMON_MODULES), functions={})
VLLM_0_32 = Skips(modules=dict(COMMON_MODULES), functions={})


def for_version(version: str | None = None) -> Skips:
    version = version or vllm.__version__
    if version.startswith("0.23."):
        return VLLM_0_23
    if version.startswith("0.32."):
        return VLLM_0_32
    raise RuntimeError(f"no skip table for vLLM {version}: run.py pins 0.23.0 and 0.32.0")
