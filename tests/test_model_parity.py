"""Our Qwen3 inside a real vLLM engine against Hugging Face transformers.

Each configuration runs one in-process `LLM(..., runner="pooling", convert="embed")` with the
plugin loaded (tests/support/engine_worker.py): the NPU path under the torch_npu emulator,
the same engine on the platform path, and the loaded model under every fusion configuration.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ENGINE_CONFIGS, PARITY_TEXTS
from support.hf_oracle import cosines, hf_embeddings

from vllm_npu_ext.envs import FUSIONS
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

CONFIGS = list(ENGINE_CONFIGS)
OUR_CLASS = "vllm_npu_ext.model_executor.models.qwen3.Qwen3ForCausalLM"


@pytest.fixture(scope="module")
def oracle(engine_runs):
    cache = {}

    def get(name: str) -> torch.Tensor:
        if name not in cache:
            cache[name] = hf_embeddings(engine_runs.model_dir(name), PARITY_TEXTS)
        return cache[name]

    return get


def _min_cosine(name: str) -> float:
    return min_embedding_cosine(getattr(torch, ENGINE_CONFIGS[name]["dtype"]))


def _assert_parity(actual: torch.Tensor, expected: torch.Tensor, min_cosine: float) -> None:
    assert actual.shape == expected.shape
    worst = cosines(actual, expected).min().item()
    assert worst >= min_cosine, f"worst cosine {worst:.7f} < {min_cosine}"


@pytest.mark.parametrize("name", CONFIGS)
def test_vllm_uses_our_model_class(engine_runs, name):
    run = engine_runs[name]
    assert OUR_CLASS in run["model_classes"]
    assert run["model_classes"][0].endswith("Qwen3ForEmbedding")
    assert "vllm.model_executor.models.qwen3.Qwen3ForCausalLM" not in run["model_classes"]
    assert "vllm-npu-ext built Qwen3ForEmbedding" in run["log"]


@pytest.mark.parametrize("name", CONFIGS)
def test_platform_path_matches_hf(engine_runs, oracle, name):
    _assert_parity(engine_runs[name]["platform"], oracle(name), _min_cosine(name))


@pytest.mark.parametrize("name", CONFIGS)
def test_npu_path_in_engine_matches_hf(engine_runs, oracle, name):
    run = engine_runs[name]
    _assert_parity(run["batch"], oracle(name), _min_cosine(name))
    # float32 has no fused-infer kernel; the model switches to npu_fusion_attention for it.
    attention = "npu_fusion_attention" if "fp32" in name else "npu_fused_infer_attention_score"
    assert run["fused_calls"].get(attention, 0) > 0, run["fused_calls"]


@pytest.mark.parametrize("name", CONFIGS)
def test_batch_equals_each_input_alone(engine_runs, name):
    run = engine_runs[name]
    _assert_parity(run["batch"], run["single"], _min_cosine(name))


@pytest.mark.parametrize("variant", ["all_on", "all_off", *(f"no_{f}" for f in FUSIONS)])
@pytest.mark.parametrize("name", CONFIGS)
def test_every_fusion_configuration_matches_hf_and_native(engine_runs, oracle, name, variant):
    variants = engine_runs[name]["variants"]
    _assert_parity(variants[variant], oracle(name), _min_cosine(name))
    _assert_parity(variants[variant], variants["all_off"], _min_cosine(name))


@pytest.mark.parametrize("name", CONFIGS)
def test_fully_fused_layer_issues_at_most_12_device_ops(engine_runs, name):
    counts = engine_runs[name]["op_counts"]
    assert counts["all_on"] <= 12, counts
    # Switching a fusion off never saves operators; rotary/norm/attention/qkv visibly cost.
    assert all(n >= counts["all_on"] for n in counts.values()), counts
    for fusion in ("attention", "rms_norm", "add_rms_norm", "rotary", "grouped_qkv"):
        assert counts[f"no_{fusion}"] > counts["all_on"], counts


def test_cache_free_pooling_allocates_no_kv_cache(engine_runs):
    log = engine_runs["gqa2_tied_fp32"]["log"]
    assert "attention: cache-free causal (no KV cache)" in log
    assert "enable_prefix_caching=False" in log
