"""When pooling runs without a KV cache, and when the user's flags keep it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_npu_ext.model_executor.models.qwen3 import Qwen3ForCausalLM, Qwen3KVCacheForCausalLM
from vllm_npu_ext.model_executor.models.qwen3_config import cache_free_allowed


def _config(prefix_caching: bool, chunked_prefill: bool):
    return SimpleNamespace(
        cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked_prefill),
    )


@pytest.mark.parametrize(
    ("prefix_caching", "chunked_prefill", "allowed"),
    [(False, False, True), (True, False, False), (False, True, False), (True, True, False)],
)
def test_prefix_caching_or_chunked_prefill_keep_the_kv_cache(
    prefix_caching, chunked_prefill, allowed
):
    assert cache_free_allowed(_config(prefix_caching, chunked_prefill)) is allowed


def test_only_the_cache_free_class_asks_vllm_for_encoder_only_scheduling():
    # vLLM reads attn_type for pooling runs only: "encoder_only" turns its prefix caching
    # and chunked prefill defaults off; "decoder" keeps them.
    assert Qwen3ForCausalLM.attn_type == "encoder_only"
    assert Qwen3KVCacheForCausalLM.attn_type == "decoder"
