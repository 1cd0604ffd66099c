"""Our Qwen3 inside a real vLLM engine against Hugging Face transformers.

Each configuration runs one in-process `LLM(..., runner="pooling", convert="embed")` with the
plugin loaded (tests/support/engine_worker.py): the NPU path under the torch_npu emulator,
the same engine on the platform path, and (cache-free engines) the loaded model under every
fusion configuration. tests/model_executor/test_kv_cache_pooling.py checks the KV-cache figures
and repeated inputs of the same runs.
"""

from __future__ import annotations

import pytest
import torch
from support.engines import ENGINE_CONFIGS, PARITY_TEXTS, min_cosine_of
from support.hf_oracle import cosines, hf_embeddings

from vllm_npu_ext.envs import FUSIONS

CONFIGS = list(ENGINE_CONFIGS)
PACKED_CONFIGS = [name for name in CONFIGS if not ENGINE_CONFIGS[name].get("kv_cache")]
OUR_CLASS = "vllm_npu_ext.model_executor.models.qwen3.Qwen3ForCausalLM"


@pytest.fixture(scope="module")
def oracle(engine_runs):
    cache = {}

    def get(name: str) -> torch.Tensor:
        if name not in cache:
            cache[name] = hf_embeddings(engine_runs.model_dir(name), PARITY_TEXTS)
        return cache[name]

    return get


def _assert_parity(actual: torch.Tensor, expected: torch.Tensor, min_cosine: float) -> None:
    assert actual.shape == expected.shape
    worst = cosines(actual, expected).min().item()
    assert worst >= min_cosine, f"worst cosine {worst:.7f} < {min_cosine}"


@pytest.mark.parametrize("name", CONFIGS)
def test_vllm_uses_our_model_class(engine_runs, name):
    run = engine_runs[name]
    assert OUR_CLASS in run["model_classes"]
    # vLLM's pooling adapter names the class after ours: Qwen3(KVCache)ForEmbedding.
    served = run["model_classes"][0].rsplit(".", 1)[1]
    kv_class = ENGINE_CONFIGS[name].get("env", {}).get("VLLM_NPU_EXT_KV_CACHE_FREE") == "0"
    assert served == ("Qwen3KVCacheForEmbedding" if kv_class else "Qwen3ForEmbedding")
    assert "vllm.model_executor.models.qwen3.Qwen3ForCausalLM" not in run["model_classes"]
    assert f"vllm-npu-ext built {served}" in run["log"]


@pytest.mark.parametrize("name", CONFIGS)
def test_platform_path_matches_hf(engine_runs, oracle, name):
    _assert_parity(engine_runs[name]["platform"], oracle(name), min_cosine_of(name))


@pytest.mark.parametrize("name", CONFIGS)
def test_npu_path_in_engine_matches_hf(engine_runs, oracle, name):
    run = engine_runs[name]
    _assert_parity(run["batch"], oracle(name), min_cosine_of(name))
    calls = run["fused_calls"]
    # q and k rotated together (npu_mrope takes every head_dim here: multiples of 32)
    assert all(calls.get(op, 0) > 0 for op in ("npu_linear", "npu_mrope", "npu_swiglu")), calls
    assert not calls.get("npu_rotary_mul"), calls
    # float32 has no fused-infer kernel; the model switches to npu_fusion_attention for it.
    attention = "npu_fusion_attention" if "fp32" in name else "npu_fused_infer_attention_score"
    if ENGINE_CONFIGS[name].get("kv_cache"):  # vLLM's attention layer reads and writes the cache
        assert calls.get(attention, 0) == 0, calls
    else:
        assert calls.get(attention, 0) > 0, calls
        other = ({"npu_fusion_attention", "npu_fused_infer_attention_score"} - {attention}).pop()
        assert calls.get(other, 0) == 0, calls


@pytest.mark.parametrize("name", CONFIGS)
def test_float32_models_never_call_a_three_tensor_grouped_matmul(engine_runs, name):
    """npu_grouped_matmul takes float32 only as one x/weight/y; the model says what it does."""
    run = engine_runs[name]
    float32 = ENGINE_CONFIGS[name]["dtype"] == "float32"
    assert ("grouped_qkv" in run["npu_path"]["fusions"]) is not float32
    assert (run["fused_calls"].get("npu_grouped_matmul", 0) > 0) is not float32
    if float32:
        assert "npu_grouped_matmul takes torch.float32 only" in run["log"]
        assert "fused attention uses npu_fusion_attention" in run["log"]


@pytest.mark.parametrize("name", CONFIGS)
def test_batch_equals_each_input_alone(engine_runs, name):
    run = engine_runs[name]
    _assert_parity(run["batch"], run["single"], min_cosine_of(name))


@pytest.mark.parametrize("variant", ["all_on", "all_off", *(f"no_{f}" for f in FUSIONS)])
@pytest.mark.parametrize("name", PACKED_CONFIGS)
def test_every_fusion_configuration_matches_hf_and_native(engine_runs, oracle, name, variant):
    variants = engine_runs[name]["variants"]
    _assert_parity(variants[variant], oracle(name), min_cosine_of(name))
    _assert_parity(variants[variant], variants["all_off"], min_cosine_of(name))


@pytest.mark.parametrize("name", PACKED_CONFIGS)
def test_fully_fused_layer_issues_12_device_ops_13_with_merged_qkv(engine_runs, name):
    counts = engine_runs[name]["op_counts"]
    active = engine_runs[name]["npu_path"]["fusions"]
    # q/k/v through the merged projection (float32, whose npu_grouped_matmul takes one tensor
    # only, or q/k/v biases, `prepare_npu_weights`): one operator more than the grouped
    # matmul (v made contiguous for fused attention).
    has_bias = ENGINE_CONFIGS[name]["overrides"].get("attention_bias", False)
    grouped_qkv = "grouped_qkv" in active and not has_bias
    assert counts["all_on"] <= (12 if grouped_qkv else 13), counts
    # Switching a fusion off never saves operators; rotary/norm/attention/qkv visibly cost.
    assert all(n >= counts["all_on"] for n in counts.values()), counts
    for fusion in ("attention", "rms_norm", "add_rms_norm", "rotary", "grouped_qkv"):
        if fusion == "grouped_qkv" and not grouped_qkv:
            assert counts["no_grouped_qkv"] == counts["all_on"], counts
        elif fusion in active:
            assert counts[f"no_{fusion}"] > counts["all_on"], counts
