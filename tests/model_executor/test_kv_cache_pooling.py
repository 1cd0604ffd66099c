"""Pooling with and without vLLM's KV cache, measured in real engines.

The engine runs of tests/support/engines.py (the same runs
tests/model_executor/test_model_parity.py checks against Hugging Face) report vLLM's own
figures: the KV cache it planned (`kv_cache_config`) and the tensors it allocated, and for one
text embedded twice in a row (on the NPU path and on the platform path) each request's
`num_cached_tokens` and the change of vLLM's prefix-cache counters.

- Cache-free pooling (the default) allocates no KV cache and caches no prefix.
- `VLLM_NPU_EXT_KV_CACHE_FREE=0` and an explicit `--enable-prefix-caching` keep the KV cache;
  the second request is then a prefix-cache hit and must give the same embedding (vllm-ascend
  #5725 reported cosine 0.585 on a hit).
"""

from __future__ import annotations

import pytest
import torch
from support.engines import ENGINE_CONFIGS, KV_CACHE_BYTES, REPEAT_TEXTS, min_cosine_of
from support.hf_oracle import cosines, hf_embeddings

KV_CONFIGS = [name for name, config in ENGINE_CONFIGS.items() if config.get("kv_cache")]
CACHE_FREE_CONFIGS = [name for name in ENGINE_CONFIGS if name not in KV_CONFIGS]
PATHS = {"npu": 0, "platform": 1}  # path -> its text in REPEAT_TEXTS


@pytest.fixture(scope="module")
def repeat_oracle(engine_runs):
    cache = {}

    def get(name: str, path: str) -> torch.Tensor:
        if name not in cache:
            cache[name] = hf_embeddings(engine_runs.model_dir(name), REPEAT_TEXTS)
        return cache[name][PATHS[path]]

    return get


@pytest.mark.parametrize("name", CACHE_FREE_CONFIGS)
def test_cache_free_pooling_allocates_no_kv_cache(engine_runs, name):
    figures = engine_runs[name]["kv_cache"]
    assert figures["planned_bytes"] == 0, figures
    assert figures["allocated_bytes"] == 0, figures


@pytest.mark.parametrize("name", KV_CONFIGS)
def test_kv_cache_modes_allocate_the_kv_cache(engine_runs, name):
    figures = engine_runs[name]["kv_cache"]
    assert figures["num_blocks"] > 0, figures
    assert 0 < figures["allocated_bytes"] == figures["planned_bytes"] <= KV_CACHE_BYTES, figures


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", KV_CONFIGS)
def test_repeated_input_is_a_prefix_cache_hit_with_the_same_embedding(
    engine_runs, repeat_oracle, name, path
):
    run = engine_runs[name]
    repeat = run["repeat"][path]
    block = run["block_size"]
    # vLLM reuses whole blocks and computes at least the last token again.
    expected_hit = (repeat["prompt_tokens"] - 1) // block * block
    assert expected_hit >= block, f"the text must fill a {block}-token block: {repeat}"
    assert repeat["num_cached_tokens"] == [0, expected_hit], repeat
    assert repeat["vllm:prefix_cache_hits"] == expected_hit, repeat
    _assert_same_embedding(repeat["embeddings"], repeat_oracle(name, path), min_cosine_of(name))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", CACHE_FREE_CONFIGS)
def test_cache_free_pooling_computes_a_repeated_input_again(
    engine_runs, repeat_oracle, name, path
):
    repeat = engine_runs[name]["repeat"][path]
    assert repeat["num_cached_tokens"] == [0, 0], repeat
    assert repeat["vllm:prefix_cache_queries"] == 0, repeat
    _assert_same_embedding(repeat["embeddings"], repeat_oracle(name, path), min_cosine_of(name))


def _assert_same_embedding(pair: torch.Tensor, expected: torch.Tensor, min_cosine: float):
    first, second = pair
    assert cosines(first, second).item() >= min_cosine
    worst = cosines(pair, expected.expand_as(pair)).min().item()
    assert worst >= min_cosine, f"worst cosine to Hugging Face {worst:.7f} < {min_cosine}"
