"""torch_npu's ATB operators that vllm-ascend's worker calls (`torch_npu.op_plugin.atb`).

ATB operators are torch operators of their own library, `torch.ops.atb.<name>`, which torch_npu
loads from `lib/libop_plugin_atb.so` and binds as `torch_npu.<name>` (the wheel's
`op_plugin/atb/_atb_ops.py:118-122`: `setattr(torch_npu, api_name, getattr(torch.ops.atb,
api_name))`). The stand-in defines them so, with the schema strings that library registers
(`SCHEMAS`), a CPU kernel each (checked and counted like the others) and no result: a dispatch
mode sees one operator, one launch, as on the device.

`_npu_matmul_add_fp32(x, weight, C)`: C += x^T @ weight in float32, in place (MindSpeed's
`docs/ops/npu_matmul_add.md`: x and weight float16/bfloat16, C float32; "product =
torch.mm(x.T, weight); result = product + C"). vllm-ascend calls it once, to warm ATB up
(`worker/worker.py:798-802`, `compile_or_warm_up_model`).

`_npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style)`: rotary
embedding in place on query `[T, N*head_size]` and key `[T, N_kv*head_size]`, cos and sin
gathered by position from `cos_sin_cache` `[max_position, head_size]` (cos in the first half,
sin in the second: vLLM's cache layout, which vllm-ascend passes unchanged,
`ops/rotary_embedding.py:189-212`); neox style rotates the two halves, otherwise interleaved
pairs (vLLM's `RotaryEmbedding.forward_static`, the operator vllm-ascend replaces with it).
Computed in float32, written back in the input dtype.

`_npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)`: ATB's
ReshapeAndCacheOperation (op-plugin `op_plugin/ops/atb/ReshapeAndCachAtb.cpp`; CANN 8.0 ATB
API reference, ReshapeAndCacheOperation): key `[T, N, D_k]` and value `[T, N, D_v]` written in
place into key_cache `[num_blocks, block_size, N, D_k]` and value_cache `[..., D_v]` at the
flat slot `slot_indices[t]` (block * block_size + offset), slot_indices int32 `[T]`; key,
value and the caches float16, bfloat16 or int8, all one dtype (float32 is not in the list).
vllm-ascend calls it for every KV-cached attention layer before attention
(`attention/attention_v1.py:1444`, `device/device_op.py:48-51`). A negative slot is skipped:
ATB's kernel leaves the caches untouched for it (hicann/ascend-transformer-boost
`src/kernels/mixkernels/reshape_and_cache/op_kernel/reshape_and_cache_nd.cpp`,
ProcessKVEqual / ProcessKVUnequalIncrement: `if (slotValue < 0) continue;`, and
`reshape_and_cache_base.h` CopyToCache: `if (slotValue < 0) return;`), and vllm-ascend's
context-parallel slot mapping marks every token another rank stores with -1
(`worker/block_table.py:253-276`). A slot at or past the caches' end is a ValueError here
(the kernel would write past the cache).
"""

from __future__ import annotations

import torch

from ..runtime.registry import calls

HALF_TYPES = (torch.float16, torch.bfloat16)
CACHE_TYPES = (*HALF_TYPES, torch.int8)
FLOAT_TYPES = (torch.float32, *HALF_TYPES)


# Registered by torch_npu 2.10.0.post4's lib/libop_plugin_atb.so (its schema strings).
NAMESPACE = "atb"
SCHEMAS = {
    "_npu_matmul_add_fp32": "(Tensor x, Tensor weight, Tensor(a!) C) -> ()",
    "_npu_rotary_embedding": "(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
                             "Tensor cos_sin_cache, bool is_neox_style) -> ()",
    "_npu_reshape_and_cache": "(Tensor key, Tensor value, Tensor(a!) key_cache, "
                              "Tensor(b!) value_cache, Tensor slot_indices) -> ()",
}  # fmt: skip


def _npu_matmul_add_fp32(x: torch.Tensor, weight: torch.Tensor, c: torch.Tensor) -> None:
    name = "_npu_matmul_add_fp32"
    calls[name] += 1
    for arg, tensor in (("x", x), ("weight", weight), ("C", c)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
            raise ValueError(f"{name}: {arg!r} must be a 2-D tensor")
    if x.dtype not in HALF_TYPES or weight.dtype != x.dtype:
        raise TypeError(f"{name}: x and weight must share float16 or bfloat16, got "
                        f"{x.dtype} and {weight.dtype}")  # fmt: skip
    if c.dtype != torch.float32:
        raise TypeError(f"{name}: C must be float32, got {c.dtype}")
    if x.shape[0] != weight.shape[0] or tuple(c.shape) != (x.shape[1], weight.shape[1]):
        raise ValueError(
            f"{name}: C {tuple(c.shape)} must be x^T @ weight's shape for x {tuple(x.shape)} "
            f"and weight {tuple(weight.shape)}"
        )
    if len({x.device, weight.device, c.device}) != 1:
        raise ValueError(f"{name}: x, weight and C must be on one device")
    c.add_(x.float().t() @ weight.float())


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
    if neox:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _npu_rotary_embedding(
    positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
    cos_sin_cache: torch.Tensor, is_neox_style: bool,
) -> None:  # fmt: skip
    name = "_npu_rotary_embedding"
    calls[name] += 1
    if positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: positions must be a 1-D int32/int64 tensor")
    tokens = positions.shape[0]
    for arg, tensor in (("query", query), ("key", key)):
        if tensor.dim() != 2 or tensor.shape[0] != tokens or tensor.shape[1] % head_size:
            raise ValueError(
                f"{name}: {arg!r} must be [T, heads * head_size] with T={tokens}, "
                f"head_size={head_size}; got {tuple(tensor.shape)}"
            )
        if not tensor.is_contiguous():
            raise ValueError(f"{name}: {arg!r} must be contiguous")
        if tensor.dtype not in FLOAT_TYPES:
            raise TypeError(f"{name}: {arg!r} dtype {tensor.dtype} not supported")
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_size:
        raise ValueError(
            f"{name}: cos_sin_cache must be [max_position, head_size={head_size}], got "
            f"{tuple(cos_sin_cache.shape)}"
        )
    if tokens and int(positions.max()) >= cos_sin_cache.shape[0]:
        raise ValueError(f"{name}: a position exceeds cos_sin_cache's {cos_sin_cache.shape[0]}")
    cos, sin = cos_sin_cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, head_size / 2]
    for tensor in (query, key):
        heads = tensor.view(tokens, -1, head_size)
        heads.copy_(_rotate(heads.float(), cos, sin, is_neox_style).to(tensor.dtype))


def _npu_reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:  # fmt: skip
    name = "_npu_reshape_and_cache"
    calls[name] += 1
    tensors = {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
               "slot_indices": slot_indices}  # fmt: skip
    for arg, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: {arg!r} must be a tensor")
    if len({tensor.device for tensor in tensors.values()}) != 1:
        raise ValueError(f"{name}: all tensors must be on one device")
    if key.dtype not in CACHE_TYPES:
        raise TypeError(f"{name}: key dtype {key.dtype} not supported (float16, bfloat16, int8)")
    if len({key.dtype, value.dtype, key_cache.dtype, value_cache.dtype}) != 1:
        raise TypeError(f"{name}: key, value, key_cache and value_cache must share one dtype")
    if slot_indices.dtype != torch.int32 or slot_indices.dim() != 1:
        raise TypeError(f"{name}: slot_indices must be a 1-D int32 tensor")
    tokens = slot_indices.shape[0]
    for arg, tensor, cache in (("key", key, key_cache), ("value", value, value_cache)):
        if tensor.dim() != 3 or tensor.shape[0] != tokens:
            raise ValueError(f"{name}: {arg!r} must be [T={tokens}, heads, head_size], got "
                             f"{tuple(tensor.shape)}")  # fmt: skip
        if cache.dim() != 4 or tuple(cache.shape[2:]) != tuple(tensor.shape[1:]):
            raise ValueError(
                f"{name}: {arg}_cache must be [num_blocks, block_size, "
                f"{tensor.shape[1]}, {tensor.shape[2]}], got {tuple(cache.shape)}"
            )
        if not cache.is_contiguous():
            raise ValueError(f"{name}: {arg}_cache must be contiguous (ND)")
    if tuple(key_cache.shape[:2]) != tuple(value_cache.shape[:2]):
        raise ValueError(f"{name}: key_cache and value_cache must share num_blocks and block_size")
    slots = key_cache.shape[0] * key_cache.shape[1]
    if tokens and int(slot_indices.max()) >= slots:
        raise ValueError(f"{name}: slot_indices must lie below {slots} (the caches' slots); "
                         "a negative slot is skipped")  # fmt: skip
    kept = (slot_indices >= 0).nonzero().squeeze(1)  # the kernel skips slot < 0 (docstring)
    index = slot_indices.long().index_select(0, kept)
    for tensor, cache in ((key, key_cache), (value, value_cache)):
        cache.view(slots, *cache.shape[2:]).index_copy_(0, index, tensor.index_select(0, kept))


def _register() -> torch.library.Library | None:
    """Define `torch.ops.atb.<name>` for each of `SCHEMAS` with its CPU kernel (once)."""
    if torch._C._jit_get_schemas_for_operator(f"{NAMESPACE}::_npu_reshape_and_cache"):
        return None  # registered by an earlier import
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in SCHEMAS.items():
        library.define(name + schema)
        library.impl(name, globals()[name], "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{name}", lambda *args: None, lib=library)
    return library


_LIBRARY = _register()
# What torch_npu binds as `torch_npu.<name>`: the operator packets.
_npu_matmul_add_fp32 = torch.ops.atb._npu_matmul_add_fp32  # noqa: F811
_npu_rotary_embedding = torch.ops.atb._npu_rotary_embedding  # noqa: F811
_npu_reshape_and_cache = torch.ops.atb._npu_reshape_and_cache  # noqa: F811
