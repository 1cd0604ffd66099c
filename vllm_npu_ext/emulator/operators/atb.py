"""torch_npu's ATB operators that vllm-ascend's worker calls (`torch_npu.op_plugin.atb`).

ATB operators are not torch_npu schema operators (the wheel lists their names in
`op_plugin/atb/_atb_ops.py` `API_LIST` and loads them from its ATB library), so they are plain
functions here, checked and counted like the others.

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
(`attention/attention_v1.py:1444`, `device/device_op.py:48-51`). A slot outside the cache is
a ValueError here (the documented contract gives no meaning to one).
"""

from __future__ import annotations

import torch

from ..runtime.registry import calls

HALF_TYPES = (torch.float16, torch.bfloat16)
CACHE_TYPES = (*HALF_TYPES, torch.int8)
FLOAT_TYPES = (torch.float32, *HALF_TYPES)


def _npu_matmul_add_fp32(x: torch.Tensor, weight: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
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
    return c.add_(x.float().t() @ weight.float())


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
    if tokens and (int(slot_indices.min()) < 0 or int(slot_indices.max()) >= slots):
        raise ValueError(f"{name}: slot_indices must lie in [0, {slots}) (the caches' slots)")
    index = slot_indices.long()
    for tensor, cache in ((key, key_cache), (value, value_cache)):
        cache.view(slots, *cache.shape[2:]).index_copy_(0, index, tensor)
