"""Causal attention that needs no KV cache, for prefill-only pooling runs.

An embedding request is one prefill: its keys are never read again, so the KV cache vLLM
would allocate (by default most of free memory) and write every layer is pure cost. vLLM's
`EncoderOnlyAttention` already skips the cache but forces bidirectional attention; this
layer is the same with causal attention, which decoder embedding models like Qwen3 need.

The builder records the batch's sequence boundaries as host lists (`PackedSeqs`) on the
metadata, where the NPU path reads them without a device-to-host sync. What else it builds
depends on the path that reads the metadata, decided as the model decides it for each forward
(`compat.npu_path_expected()` and `ops.dispatch` for the runner's device):

- Platform path (vLLM's CPU platform without the torch_npu emulator): vLLM's own attention
  implementation runs these layers and needs the backend's full metadata, so the backend's
  builder builds it and PackedSeqs is added to it. On vLLM 0.23 the builder also adds a
  per-step scratch K/V buffer (`cpu_causal_attention.attach_scratch_kv`), so that these
  layers run the batched CPU kernel stock vLLM's decoder layers use instead of SDPA per
  request.
- NPU path (an Ascend NPU, or CPU tensors under the emulator): the only reader is our op
  (`cache_free/op.py`, through `forward_context.packed_seqs_for_layer`), which reads PackedSeqs and
  nothing else, so the backend's `build` is not called. On vllm-ascend 0.23.0.post1 that `build`
  (`AscendAttentionMetadataBuilder.build`) did, per step and per KV cache group, work that nothing
  reads on this path: `AttentionMaskBuilder.get_attention_mask`, which for pooling runs returns the
  2048x2048 bool mask (4 MiB) copied to the device on every call
  (`AttentionMaskBuilder.get_attn_mask`), and a pinned host copy of `query_start_loc_cpu` sent to
  the device, though the runner already holds that tensor there
  (`common_attn_metadata.query_start_loc`, `NPUModelRunner._build_attention_metadata`).
  Counted in `tests/with_vllm_ascend/test_metadata_builder.py`, with the runner's own metadata.
  Instead the builder returns the backend's declared metadata type (`M` of
  `AttentionMetadataBuilder[M]`) filled with `CacheFreeMetadata`'s fields: host values and
  tensors the runner already built, no copy and no device work. That needs `M` to be a
  dataclass whose required fields are among them; vllm-ascend's `AscendMetadata`
  (`attention/attention_v1.py`) has defaults for all, and its code outside the attention
  backend reads `num_actual_tokens` from it (`NPUPlatform.set_additional_forward_context`,
  the forward context of its model runner v2). Fields left at their defaults (mask, decode/prefill
  split, KV-cache events) are read only by the backend's own implementation, which does not
  run these layers. Any other `M` (vLLM's CPU backend requires its scheduler metadata)
  gives way to `CacheFreeMetadata` itself.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

import torch
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionMetadataBuilder,
    AttentionType,
    subclass_attention_backend_with_overrides,
)
from vllm.v1.attention.selector import get_attn_backend

from vllm_npu_ext import compat
from vllm_npu_ext.model_executor import forward_context
from vllm_npu_ext.model_executor.layers import cpu_causal_attention, cpu_shared_prefix
from vllm_npu_ext.ops import dispatch
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass
class CacheFreeMetadata:
    """Per-step metadata of cache-free layers on the NPU path (module docstring).

    Names and meanings follow vllm-ascend 0.23.0.post1's `AscendMetadata`:
    `seq_lens`, `seq_lens_cpu` and `seq_lens_list` are host-side; `query_start_loc`,
    `block_tables` and `slot_mapping` are the runner's own tensors, passed on uncopied.
    """

    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    actual_seq_lengths_q: list[int]
    block_tables: torch.Tensor | None = None
    slot_mapping: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    seq_lens_list: list[int] | None = None
    causal: bool = True
    attn_state: Any = None
    model_runner_type: str = ""


def npu_path_reads_metadata(device: torch.device | str) -> bool:
    """Whether the metadata built for `device` is read by the NPU path (only its PackedSeqs):
    the model's own per-forward test (`Qwen3Model.forward`) for tensors on `device`."""
    device = torch.device(device)
    return compat.npu_path_expected() and dispatch.npu_ops_for_device(device) is not None


def declared_metadata_cls(builder_cls: type) -> type | None:
    """`M` of the `AttentionMetadataBuilder[M]` that `builder_cls` derives from, if a class."""
    for klass in builder_cls.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is AttentionMetadataBuilder:
                (metadata_cls,) = typing.get_args(base)
                return metadata_cls if isinstance(metadata_cls, type) else None
    return None


def _host_seq_lens(common: Any) -> torch.Tensor | None:
    """Host `[num_reqs]` sequence lengths where the runner provides them, else None (never a
    device-to-host copy). Dataclass fields only: vLLM 0.23's `seq_lens_cpu` property warns and
    may copy; vllm-ascend's `AscendCommonAttentionMetadata` makes it a field."""
    fields = vars(common)
    for name in ("_seq_lens_cpu", "seq_lens_cpu"):
        value = fields.get(name)
        if value is not None:
            return value[: common.num_reqs]
    return None


def light_metadata(metadata_cls: type | None, common: Any, runner_type: str) -> Any:
    """The NPU path's metadata for one step: `metadata_cls` filled with `CacheFreeMetadata`'s
    fields where it is a dataclass they cover, else a `CacheFreeMetadata`."""
    num_reqs, num_tokens = common.num_reqs, common.num_actual_tokens
    seq_lens = _host_seq_lens(common)
    values = CacheFreeMetadata(
        num_actual_tokens=num_tokens,
        max_query_len=common.max_query_len,
        max_seq_len=common.max_seq_len,
        query_start_loc=common.query_start_loc,
        actual_seq_lengths_q=common.query_start_loc_cpu[1 : num_reqs + 1].tolist(),
        block_tables=common.block_table_tensor,
        slot_mapping=common.slot_mapping[:num_tokens],
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens,
        seq_lens_list=None if seq_lens is None else seq_lens.tolist(),
        attn_state=getattr(common, "attn_state", None),
        model_runner_type=runner_type,
    )
    if metadata_cls is None or not dataclasses.is_dataclass(metadata_cls):
        return values
    given = {name: value for name, value in vars(values).items() if value is not None}
    accepted = {field.name: field for field in dataclasses.fields(metadata_cls) if field.init}
    required = {
        name for name, field in accepted.items()
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    }  # fmt: skip
    if not required <= given.keys():
        return values
    return metadata_cls(**{name: given[name] for name in accepted.keys() & given.keys()})


@functools.cache
def cache_free_causal_backend(backend: type[AttentionBackend]) -> type[AttentionBackend]:
    """`backend` with a metadata builder that keeps attention causal and records PackedSeqs
    (and skips the backend's own build where the NPU path reads the metadata: module
    docstring), and an implementation that honours that causality on every vLLM version we
    support (`cpu_causal_attention.causal_impl_cls`) and, on vLLM's CPU kernel, runs the steps
    with shared prefixes (`cpu_shared_prefix.shared_prefix_impl_cls`)."""
    base_builder = backend.get_builder_cls()
    metadata_cls = declared_metadata_cls(base_builder)
    scratch_kv = cpu_causal_attention.needs_causal_impl(backend.get_impl_cls())

    class CacheFreeCausalBuilder(base_builder):  # type: ignore[misc, valid-type]
        def build(self, common_prefix_len, common_attn_metadata, *args, **kwargs):
            seqs = PackedSeqs.from_query_start_loc(compat.query_start_loc_cpu(common_attn_metadata))
            if npu_path_reads_metadata(self.device):
                runner_type = self.vllm_config.model_config.runner_type
                metadata = light_metadata(metadata_cls, common_attn_metadata, runner_type)
            else:
                common = cpu_causal_attention.set_causal(common_attn_metadata)
                metadata = super().build(common_prefix_len, common, *args, **kwargs)
                if scratch_kv:  # vLLM 0.23's CPU backend: its batched kernel, not SDPA
                    cpu_causal_attention.attach_scratch_kv(self, metadata)
            setattr(metadata, forward_context.PACKED_SEQS_ATTR, seqs)
            return metadata

    impl = cpu_shared_prefix.shared_prefix_impl_cls(
        cpu_causal_attention.causal_impl_cls(backend.get_impl_cls())
    )
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
