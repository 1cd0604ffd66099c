"""Offline Qwen3-Reranker (`LLM.score`) through the plugin: our model under vLLM's seq-cls
adapter, the NPU path (emulated) and the platform path of one engine, against the model-card
oracle.

The engine runs once per session in its own process (tests/conftest.py `rerank_engine_run`).
"""

from __future__ import annotations

import pytest
from support.rerank_oracle import MAX_SCORE_DIFF, hf_rerank_scores
from support.rerank_servers import ENGINE_CASES

PATHS = ("emulated", "platform")


@pytest.fixture(scope="module")
def oracle(reranker_model_dir) -> list[list[float]]:
    return [
        hf_rerank_scores(reranker_model_dir, c["query"], c["documents"], c.get("instruction"))
        for c in ENGINE_CASES
    ]


@pytest.mark.parametrize("path", PATHS)
def test_scores_match_the_model_card_oracle(rerank_engine_run, oracle, path):
    scores = rerank_engine_run["scores"][path]
    diffs = [abs(a - b) for got, ref in zip(scores, oracle, strict=True)
             for a, b in zip(got, ref, strict=True)]  # fmt: skip
    print(f"{path}: max |score - oracle| = {max(diffs):.3g} over {len(diffs)} pairs")
    assert max(diffs) <= MAX_SCORE_DIFF


def test_per_request_instruction_reaches_the_prompt(rerank_engine_run, oracle):
    """The case with its own instruction scores differently from the default instruction."""
    default, instructed = rerank_engine_run["scores"]["platform"][:2]
    assert all(abs(a - b) > 1e-4 for a, b in zip(default[:3], instructed, strict=True))


def test_runs_our_model_under_vllms_seq_cls_adapter(rerank_engine_run):
    classes = rerank_engine_run["model_classes"]
    assert classes[0].endswith(".Qwen3ForSequenceClassification")
    assert "vllm_npu_ext.model_executor.models.qwen3.Qwen3ForCausalLM" in classes
    config = rerank_engine_run["config"]
    assert config["architecture"] == "Qwen3ForSequenceClassification"
    assert config["convert_type"] == "classify" and config["num_labels"] == 1


def test_cache_free_attention_without_prefix_caching(rerank_engine_run):
    config = rerank_engine_run["config"]
    assert not config["prefix_caching"] and not config["chunked_prefill"]
    assert "attention: cache-free causal (no KV cache)" in rerank_engine_run["log"]


def test_emulated_pass_took_the_fused_npu_path(rerank_engine_run):
    from vllm_npu_ext.selfcheck.engine_probe import FUSED_OPERATORS, QK_PATH_OPERATORS

    npu_path = rerank_engine_run["npu_path"]
    assert npu_path["active"]
    assert "backend: NPU path (torch_npu emulator" in rerank_engine_run["log"]
    calls = rerank_engine_run["fused_calls"]
    # float32: q/k/v through the merged projection (npu_grouped_matmul takes float32 only as
    # one tensor), attention through npu_fusion_attention (FIA has no float32); q/k norms and
    # rotary by the q/k path (vllm-ascend's bf16-only qkv_rmsnorm_rope does not take float32)
    qk = {"rotary", "qk_norm_rope"}
    assert set(npu_path["fusions"]) == set(FUSED_OPERATORS) - {"grouped_qkv"} | {"attention"} | qk
    for fusion in set(npu_path["fusions"]) - qk:
        operator = f"npu_{npu_path['attention_op']}" if fusion == "attention" else None
        assert calls.get(operator or FUSED_OPERATORS[fusion], 0) > 0, fusion
    assert npu_path["attention_op"] == "fusion_attention"
    assert calls.get(QK_PATH_OPERATORS[npu_path["qk_path"]], 0) > 0, npu_path["qk_path"]
