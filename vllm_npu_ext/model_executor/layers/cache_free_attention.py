"""Causal attention that needs no KV cache, for prefill-only pooling runs.

An embedding request is one prefill: its keys are never read again, so the KV cache vLLM
would allocate (by default most of free memory) and write every layer is pure cost. vLLM's
`EncoderOnlyAttention` already skips the cache but forces bidirectional attention; this
layer is the same with causal attention, which decoder embedding models like Qwen3 need.

The builder also records the batch's sequence boundaries as host lists (`PackedSeqs`) on
the metadata, where the NPU path reads them without a device-to-host sync.
"""

from __future__ import annotations

import functools

import torch
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionType,
    subclass_attention_backend_with_overrides,
)
from vllm.v1.attention.selector import get_attn_backend

from vllm_npu_ext import compat
from vllm_npu_ext.ops.packed import PackedSeqs


@functools.cache
def cache_free_causal_backend(backend: type[AttentionBackend]) -> type[AttentionBackend]:
    """`backend` with a metadata builder that keeps attention causal and records PackedSeqs,
    and an implementation that honours that causality on every vLLM version we support
    (`compat.causal_impl_cls`)."""
    base_builder = backend.get_builder_cls()

    class CacheFreeCausalBuilder(base_builder):  # type: ignore[misc, valid-type]
        def build(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
            common = compat.set_causal(common_attn_metadata)
            metadata = super().build(common_prefix_len, common, *args, **kwargs)
            seqs = PackedSeqs.from_query_start_loc(compat.query_start_loc_cpu(common))
            setattr(metadata, compat.PACKED_SEQS_ATTR, seqs)
            return metadata

    impl = compat.causal_impl_cls(backend.get_impl_cls())
    overrides = {
        "get_builder_cls": staticmethod(lambda: CacheFreeCausalBuilder),
        "get_impl_cls": staticmethod(lambda: impl),
    }
    return subclass_attention_backend_with_overrides("CacheFreeCausal_", backend, overrides)


class CacheFreeCausalAttention(Attention):
    """vLLM attention layer with causal masking and no KV cache (`get_kv_cache_spec` is None)."""

    def __init__(self, num_heads: int, head_size: int, scale: float, cache_config=None, **kwargs):
        kv_cache_dtype = cache_config.cache_dtype if cache_config is not None else "auto"
        backend = get_attn_backend(
            head_size, torch.get_default_dtype(), kv_cache_dtype,
            attn_type=AttentionType.ENCODER_ONLY,
        )  # fmt: skip
        super().__init__(
            num_heads=num_heads,
            head_size=head_size,
            scale=scale,
            cache_config=cache_config,
            attn_backend=cache_free_causal_backend(backend),
            attn_type=AttentionType.ENCODER_ONLY,
            **kwargs,
        )

    def get_kv_cache_spec(self, vllm_config):
        return None
