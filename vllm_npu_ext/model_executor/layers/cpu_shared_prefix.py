"""Shared-prefix attention on vLLM's CPU attention kernel (the platform path).

In a step with shared prefixes (`model_executor/shared_prefix.py`) a layer's query, key and
value hold the step's unique rows, while the metadata the cache-free builder built describes
the step's texts: each text's blocks in a scratch K/V buffer and the slot of every step row
(vLLM 0.32's encoder-only `encoder_cache`, vLLM 0.23's `ScratchKV`). Each text's keys are
gathered from the unique rows (the group's prefix rows, then its own) and written to its
blocks, one K/V write of the step's rows as without sharing; then vLLM's CPU kernel runs
with the texts' own rows as queries, causally aligned to the end of each text's keys, as it
runs a prefix-cache hit. Texts with no own rows (equal to their prefix) are left out: their
hidden states are the prefix's. Where no scratch buffer is there (vLLM 0.23's SDPA cases, an
ALiBi, sliding-window or sink layer) the PyTorch reference computes the same attention.

A step without shared prefixes runs the backend's own implementation, unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from vllm_npu_ext.model_executor import forward_context
from vllm_npu_ext.model_executor.layers import cpu_causal_attention
from vllm_npu_ext.ops.shared_prefix import SharedPrefixPlan, shared_prefix_attention

CPU_BACKEND_MODULE = "vllm.v1.attention.backends.cpu_attn"


@dataclasses.dataclass(frozen=True)
class CpuSharedLayout:
    """One step's kernel arguments for the texts with own rows (module docstring)."""

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [T_kv] slots of those texts' rows
    block_table: torch.Tensor  # [texts, blocks]
    seq_lens: torch.Tensor  # [texts] whole lengths (keys)
    query_start_loc: torch.Tensor  # [texts + 1] over the unique rows
    scheduler_metadata: torch.Tensor
    isa: str


def shared_prefix_impl_cls(impl_cls: type) -> type:
    """`impl_cls` where it is not vLLM's CPU implementation, else a subclass whose forward
    runs shared-prefix attention in steps that share a prefix (module docstring)."""
    if not any(klass.__module__ == CPU_BACKEND_MODULE for klass in impl_cls.__mro__):
        return impl_cls

    class SharedPrefixImpl(impl_cls):  # type: ignore[misc, valid-type]
        def forward(self, layer, query, key, value, kv_cache, attn_metadata, *args, **kwargs):
            plan = forward_context.shared_prefix_plan()
            if plan is None or attn_metadata is None:
                return super().forward(layer, query, key, value, kv_cache, attn_metadata,
                                       *args, **kwargs)  # fmt: skip
            output = kwargs["output"] if "output" in kwargs else args[0]
            attend(self, layer, plan, (query, key, value), attn_metadata, output)
            return output

    SharedPrefixImpl.__name__ = SharedPrefixImpl.__qualname__ = f"SharedPrefix{impl_cls.__name__}"
    return SharedPrefixImpl


def attend(impl: Any, layer: Any, plan: SharedPrefixPlan, qkv, metadata: Any,
           output: torch.Tensor) -> None:  # fmt: skip
    """Attention of the unique rows `qkv` (query `[U, Nq, D]`, key/value `[U, Nkv, D]`) into
    `output` (`[U, Nq * D]` or `[U, Nq, D]`)."""
    query, key, value = qkv
    rows = query.shape[0]
    out = output.view(rows, query.shape[1], -1)
    kv_rows = plan.tensor("kv_rows", query.device, rows)
    layout = _layout(impl, layer, plan, metadata, query.dtype)
    if layout is None:
        shared_prefix_attention(query, key, value, plan.attention_layout(rows), kv_rows,
                                impl.scale, out=out)  # fmt: skip
        return
    from vllm import _custom_ops as ops

    ops.cpu_attn_reshape_and_cache(
        key.index_select(0, kv_rows), value.index_select(0, kv_rows), layout.key_cache,
        layout.value_cache, layout.slot_mapping, layout.isa,
    )  # fmt: skip
    ops.cpu_attention_with_kv_cache(
        query=query, key_cache=layout.key_cache, value_cache=layout.value_cache, output=out,
        query_start_loc=layout.query_start_loc, seq_lens=layout.seq_lens, scale=impl.scale,
        causal=True, alibi_slopes=None, sliding_window=impl.sliding_window,
        block_table=layout.block_table, softcap=impl.logits_soft_cap,
        scheduler_metadata=layout.scheduler_metadata, s_aux=None,
    )  # fmt: skip


def _layout(impl: Any, layer: Any, plan: SharedPrefixPlan, metadata: Any,
            dtype: torch.dtype) -> CpuSharedLayout | None:  # fmt: skip
    """The step's `CpuSharedLayout` for `metadata` (made by the step's first layer), or None
    where the kernel cannot serve it (module docstring)."""
    return plan.cached(("cpu_layout", id(metadata)),
                       lambda: _make_layout(impl, layer, plan, metadata, dtype))  # fmt: skip


def _scratch_of(layer: Any, metadata: Any) -> tuple | None:
    """(key cache, value cache, slot mapping, block table, seq lens, isa) of the step."""
    scratch = getattr(metadata, cpu_causal_attention.SCRATCH_KV_ATTR, None)
    if scratch is not None:  # vLLM 0.23
        return (scratch.key_cache, scratch.value_cache, scratch.slot_mapping,
                scratch.block_table, scratch.seq_lens, scratch.isa)  # fmt: skip
    cache = getattr(metadata, "encoder_cache", None)
    if cache is None or not hasattr(layer, "isa"):
        return None
    num_blocks, num_kv_heads, block_size, _ = cache.shape  # vLLM 0.32's encoder-only layout
    key_cache, value_cache = cache.view(num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, 2)
    return (key_cache, value_cache, metadata.slot_mapping, metadata.block_table,
            metadata.seq_lens, layer.isa)  # fmt: skip


def _make_layout(impl, layer, plan: SharedPrefixPlan, metadata, dtype) -> CpuSharedLayout | None:
    scratch = _scratch_of(layer, metadata)
    plain = (getattr(impl, "alibi_slopes", None) is None and getattr(impl, "sinks", None) is None
             and np.all(np.asarray(impl.sliding_window) == -1))  # fmt: skip
    if scratch is None or not plain or getattr(impl, "kv_cache_dtype", "auto") != "auto":
        return None
    key_cache, value_cache, slot_mapping, block_table, seq_lens, isa = scratch
    attending = plan.q_lens > 0
    lens = np.asarray(plan.seqs.seq_lens)
    row_of_attending = torch.from_numpy(np.repeat(attending, lens))
    texts = torch.from_numpy(np.flatnonzero(attending))
    q_lens = plan.q_lens[attending]
    query_start_loc = torch.from_numpy(np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    seq_lens = seq_lens[texts].contiguous()
    from vllm import _custom_ops as ops
    from vllm import envs as vllm_envs

    scheduler_metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=int(texts.shape[0]), num_heads=impl.num_heads, num_kv_heads=impl.num_kv_heads,
        head_dim=impl.head_size, seq_lens=seq_lens, dtype=dtype, query_start_loc=query_start_loc,
        causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=bool(getattr(vllm_envs, "VLLM_CPU_ATTN_SPLIT_KV", False)),
    )  # fmt: skip
    return CpuSharedLayout(
        key_cache, value_cache, slot_mapping[: plan.num_tokens][row_of_attending].contiguous(),
        block_table[texts].contiguous(), seq_lens, query_start_loc, scheduler_metadata, isa,
    )  # fmt: skip
