"""Causal attention for cache-free layers on vLLM 0.23's CPU backend.

0.32's CPU kernel reads `metadata.causal`; 0.23's (`v1/attention/backends/cpu_attn.py`,
`_run_sdpa_forward`) decides it from `attn_type == DECODER` and ignores the metadata, so our
cache-free causal layer (an ENCODER_ONLY layer) got bidirectional attention there: embeddings
at cosine 0.65-0.98 to Hugging Face. `causal_impl_cls` gives such a backend an implementation
that honours the metadata (the engine parity tests and the reranker's fail on 0.23 without
it). 0.23's SDPA path also runs one `scaled_dot_product_attention` per request and layer, with
its Python around it; in the CPU engine that cost several times the batched kernel stock vLLM's
decoder layers use. So the cache-free builder gives each step a scratch K/V buffer
(`ScratchKV`, what 0.32 does for encoder-only layers), and that implementation runs the same
kernel on it.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from typing import Any

import torch
from vllm.v1.attention.backend import AttentionType

# Attribute the cache-free metadata builder adds to the backend's metadata object.
SCRATCH_KV_ATTR = "npu_ext_scratch_kv"


def set_causal(common_attn_metadata: Any) -> Any:
    """vLLM's CommonAttentionMetadata with plain causal attention: itself where it says so
    already (the runner's, every step), else a copy."""
    from copy import copy

    if common_attn_metadata.causal is True:
        return common_attn_metadata
    common = copy(common_attn_metadata)
    common.causal = True
    return common


def causal_impl_cls(impl_cls: type) -> type:
    """`impl_cls`, or a subclass of it whose encoder-only attention is causal when the metadata
    says so.

    vLLM 0.23's CPU implementation runs encoder-only layers through
    `_run_sdpa_forward(query, key, value, output, attn_metadata, attn_type)`, with
    `is_causal = attn_type == DECODER`; 0.32's has no such method (its kernel takes
    `metadata.causal`), nor has any other backend: those are returned unchanged. The subclass
    runs vLLM's batched CPU kernel where the builder attached a `ScratchKV`
    (`attach_scratch_kv`), else causal SDPA.
    """
    if not needs_causal_impl(impl_cls):
        return impl_cls

    class CausalSdpaImpl(impl_cls):  # type: ignore[misc, valid-type]
        def _run_sdpa_forward(self, query, key, value, output, attn_metadata, attn_type):
            scratch = getattr(attn_metadata, SCRATCH_KV_ATTR, None)
            if scratch is not None and scratch.serves(self):
                return scratch.attend(self, query, key, value, output)
            if getattr(attn_metadata, "causal", False) is True:
                attn_type = AttentionType.DECODER  # the only value 0.23 runs causally
            return super()._run_sdpa_forward(query, key, value, output, attn_metadata, attn_type)

    CausalSdpaImpl.__name__ = CausalSdpaImpl.__qualname__ = f"CausalSdpa{impl_cls.__name__}"
    return CausalSdpaImpl


def needs_causal_impl(impl_cls: type) -> bool:
    """Whether `impl_cls` is vLLM 0.23's CPU implementation (`causal_impl_cls`)."""
    run_sdpa = getattr(impl_cls, "_run_sdpa_forward", None)
    return run_sdpa is not None and "attn_type" in inspect.signature(run_sdpa).parameters


@dataclasses.dataclass(frozen=True)
class ScratchKV:
    """One step's K/V buffer for vLLM 0.23's batched CPU attention kernel.

    Each request gets whole blocks of its own (`block_table`); every layer writes its keys and
    values to the same slots (`slot_mapping`) before attending, so one buffer serves all
    layers of the step. The kernel also reads, and masks, the rest of each request's last
    block: the buffer is zeroed when allocated (uninitialised memory may hold NaN, which a
    masked position still multiplies) and later holds earlier steps' keys and values there,
    as the blocks of vLLM's own KV cache hold earlier requests' after reuse.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    scheduler_metadata: torch.Tensor
    isa: str

    def serves(self, impl: Any) -> bool:
        """Plain causal attention only: what the SDPA path it replaces computes for Qwen3."""
        return (
            impl.alibi_slopes is None
            and impl.sinks is None
            and tuple(impl.sliding_window) == (-1, -1)
        )

    def attend(self, impl: Any, query, key, value, output) -> torch.Tensor:
        from vllm import _custom_ops as ops

        tokens = self.slot_mapping.shape[0]
        ops.cpu_attn_reshape_and_cache(
            key[:tokens], value[:tokens], self.key_cache, self.value_cache,
            self.slot_mapping, self.isa,
        )  # fmt: skip
        ops.cpu_attention_with_kv_cache(
            query=query[:tokens],
            key_cache=self.key_cache,
            value_cache=self.value_cache,
            output=output[:tokens],
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            scale=impl.scale,
            causal=True,
            alibi_slopes=None,
            sliding_window=(-1, -1),
            block_table=self.block_table,
            softcap=impl.logits_soft_cap,
            scheduler_metadata=self.scheduler_metadata,
            s_aux=None,
        )
        return output


# Slots per block of the scratch K/V buffer: the smallest the kernel's ISA choice accepts
# unchanged (`_get_attn_isa` depends on the block size only through `% 32` and `% 16`).
SCRATCH_BLOCK_SIZE = 32
_SCRATCH_BUFFER_ATTR = "_npu_ext_scratch_kv_buffer"


def attach_scratch_kv(builder: Any, metadata: Any) -> None:
    """Give vLLM 0.23 CPU metadata of a cache-free prefill step a `ScratchKV`.

    `metadata` is what the backend's builder built with `causal=True`: its scheduler metadata
    is then the causal kernel's. Steps it cannot serve exactly keep the SDPA path: a cached
    or earlier-chunked prefix (sequence longer than its query), an empty request, a quantised
    KV-cache dtype, or a builder that split decodes from prefills (`use_sdpa_prefill`).
    It runs once per step, and at batch size 1 a step of a small model takes a few
    milliseconds: host lists, a handful of tensor operations, and one buffer kept by the
    builder across steps (fresh memory for every step cost more in page faults than the
    kernel saved).
    """
    scheduler_metadata = getattr(metadata, "scheduler_metadata", None)
    if (
        not isinstance(scheduler_metadata, torch.Tensor)
        or getattr(metadata, "use_sdpa_prefill", True)
        or builder.vllm_config.cache_config.cache_dtype != "auto"
    ):
        return
    query_start_loc, seq_lens = metadata.query_start_loc, metadata.seq_lens
    if query_start_loc.device.type != "cpu" or seq_lens.device.type != "cpu":
        return
    starts = query_start_loc.tolist()
    lens = [end - start for start, end in itertools.pairwise(starts)]
    if not lens or min(lens) < 1 or seq_lens.tolist() != lens:
        return
    block_size = builder.block_size
    if block_size % SCRATCH_BLOCK_SIZE == 0:
        block_size = SCRATCH_BLOCK_SIZE
    num_tokens = starts[-1]
    blocks = [-(-length // block_size) for length in lens]
    first_blocks = list(itertools.accumulate(blocks, initial=0))
    offsets = torch.arange(max(blocks), dtype=torch.int32)
    slot_mapping = torch.arange(num_tokens, dtype=torch.long)
    if len(lens) == 1:
        block_table = offsets[None, :]
    else:
        first = torch.tensor(first_blocks[:-1], dtype=torch.int32)
        block_table = first[:, None] + offsets[None, :]
        # token t of request i (from starts[i]) goes to slot first_blocks[i] * block_size + t
        shifts = [b * block_size - start for b, start in zip(first_blocks, starts, strict=True)]
        shift, repeats = torch.tensor([shifts[:-1], lens])
        slot_mapping += shift.repeat_interleave(repeats, output_size=num_tokens)
    cache = _scratch_buffer(builder, first_blocks[-1], block_size)
    key_cache, value_cache = cache.chunk(2, dim=2)
    scratch = ScratchKV(
        key_cache, value_cache, slot_mapping, block_table, query_start_loc, seq_lens,
        scheduler_metadata, builder.isa,
    )  # fmt: skip
    setattr(metadata, SCRATCH_KV_ATTR, scratch)


def _scratch_buffer(builder: Any, num_blocks: int, block_size: int) -> torch.Tensor:
    """`num_blocks` blocks of the backend's cache layout `[blocks, kv heads, block, 2 * head]`,
    viewed as its forward views it, from a zeroed buffer the builder keeps (replaced by a
    larger one when too small)."""
    shape = (num_blocks, builder.num_kv_heads, 2 * block_size, builder.head_dim)
    buffer = getattr(builder, _SCRATCH_BUFFER_ATTR, None)
    if buffer is None or buffer.shape[0] < num_blocks or buffer.shape[1:] != shape[1:]:
        buffer = torch.zeros(shape, dtype=builder.dtype)
        setattr(builder, _SCRATCH_BUFFER_ATTR, buffer)
    return buffer[:num_blocks]
