"""torch_npu's ATB operators that vllm-ascend's worker calls (`torch_npu.op_plugin.atb`).

ATB operators are torch operators of their own library, `torch.ops.atb.<name>`, which torch_npu
loads from `lib/libop_plugin_atb.so` and binds as `torch_npu.<name>` (the wheel's
`op_plugin/atb/_atb_ops.py`, `_patch_atb_ops`: `setattr(torch_npu, api_name, getattr(torch.ops.atb,
api_name))`). The stand-in defines them so, with the schema strings that library registers
(`SCHEMAS`), a CPU kernel each (checked and counted like the others) and no result: a dispatch mode
sees one operator, one launch, as on the device.

`_npu_matmul_add_fp32(x, weight, C)`: C += x^T @ weight in float32, in place (MindSpeed's
`docs/ops/npu_matmul_add.md`: x and weight float16/bfloat16, C float32; "product =
torch.mm(x.T, weight); result = product + C"). vllm-ascend calls it once, to warm ATB up
(vllm-ascend 0.23.0.post1 `NPUWorker._warm_up_atb`, from `compile_or_warm_up_model`).

`_npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style)`: rotary
embedding in place on query `[T, N*head_size]` and key `[T, N_kv*head_size]`, cos and sin gathered
by position from `cos_sin_cache` `[max_position, head_size]` (cos in the first half, sin in the
second: vLLM's cache layout, which vllm-ascend passes unchanged: vllm-ascend 0.23.0.post1
`rope_forward_oot`); neox style rotates the two halves, otherwise interleaved pairs (vLLM's
`RotaryEmbedding.forward_static`, the operator vllm-ascend replaces with it). Computed in float32,
written back in the input dtype.

`_npu_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)`: ATB's
ReshapeAndCacheOperation (op-plugin `op_plugin/ops/atb/ReshapeAndCachAtb.cpp`; CANN 8.0 ATB API
reference, ReshapeAndCacheOperation): key `[T, N, D_k]` and value `[T, N, D_v]` written in place
into key_cache `[num_blocks, block_size, N, D_k]` and value_cache `[..., D_v]` at the flat slot
`slot_indices[t]` (block * block_size + offset), slot_indices int32 `[T]`; key, value and the caches
float16, bfloat16 or int8, all one dtype (float32 is not in the list). vllm-ascend calls it for
every KV-cached attention layer before attention (vllm-ascend 0.23.0.post1
`AscendAttentionBackendImpl.reshape_and_cache`, through `BaseDeviceAdaptor.reshape_and_cache`). A
negative slot is skipped: ATB's kernel leaves the caches untouched for it
(hicann/ascend-transformer-boost
`src/kernels/mixkernels/reshape_and_cache/op_kernel/reshape_and_cache_nd.cpp`, ProcessKVEqual /
ProcessKVUnequalIncrement: `if (slotValue < 0) continue;`, and `reshape_and_cache_base.h`
CopyToCache: `if (slotValue < 0) return;`), and vllm-ascend's context-parallel slot mapping marks
every token another rank stores with -1 (`BlockTable._compute_pcp_dcp_slot_mapping`). A slot at or
past the caches' end is a ValueError here (the kernel would write past the cache).

`torch_npu.atb.npu_paged_cache_load(key_cache, value_cache, block_table, context_lens, *,
seq_starts=None, cumsum=False, key, value)`: ATB's PagedCacheLoadOperation, the reverse of
ReshapeAndCache ("reshapeandcache反向", hicann/ascend-transformer-boost
`include/atb/infer_op_params.h`, `struct PagedCacheLoadParam`), which vllm-ascend calls to load a
request's context keys and values out of the paged cache: chunked context and prefix-cache hits
under context parallelism (vllm-ascend 0.23.0.post1 `AscendAttentionCPImpl._load_kv_for_chunk`,
through `BaseDeviceAdaptor.kv_cache_load`), MLA's chunked context
(`AscendMLAImpl._compute_prefill_context`) and the Mooncake connectors. op-plugin registers two
overloads of one operator, the `.out` one (key and value written in place, returned) that
vllm-ascend calls and a functional one that allocates them (Ascend/op-plugin branch 26.0.0
`op_plugin/ops/atb/PagedCacheLoadAtb.cpp`, its `TORCH_LIBRARY_FRAGMENT(atb, m)` and
`TORCH_LIBRARY_IMPL(atb, PrivateUse1, m)`); torch_npu binds the packet as
`torch_npu.atb.npu_paged_cache_load`, `torch_npu.atb` being a module of its own
(`op_plugin/python/atb/_atb_ops.py`: `ATB_API_LIST`, `_add_atb_module`, `_patch_atb_ops`:
`setattr(ATB_MODULE, api_name, getattr(torch.ops.atb, api_name))`). The cache layout is
chosen by the key cache's storage format (`PagedCacheLoadAtb.cpp`, `kv_cache_cfg` in
`npu_paged_cache_load_out`: FRACTAL_NZ selects K_CACHE_V_CACHE_NZ, anything else
K_CACHE_V_CACHE_ND); the host keeps every tensor ND (`format_cast`), and only ND is emulated:
key_cache `[num_blocks, block_size, N, D_k]`, value_cache `[..., D_v]`, key `[T, N, D_k]`, value
`[T, N, D_v]` (NZ's 2-D key/value raise NotImplementedError). The ND kernel
(`src/kernels/mixkernels/paged_cache_load/op_kernel/paged_cache_load_nd.cpp`,
`PagedCacheLoadNd<T>::Process`) walks the requests in order: request b's n_b tokens (n_b =
context_lens[b], or context_lens[b+1] - context_lens[b] with cumsum, whose first output row is
context_lens[0]) are packed after the previous request's, token j read from row j % block_size of
block block_table[b, seq_starts[b] // block_size + j // block_size]. seq_starts offsets whole
blocks: the kernel divides it by block_size (`Process`: `tableOffset =
inSeqStartsGM.GetValue(batchId) / blockSize`), as the golden references do (ATB's opstest
`paged_cache_load/test_paged_cache_load_operation_nd.py`, `generate_data`: `block_table_offset =
seq_starts[i] // block_size`; op-plugin `test/test_custom_ops/test_atb_paged_cache_load.py`,
`TestPagedCacheLoadSeqStarts._gather_cache_torch`), so for a multiple of block_size, which
vllm-ascend always passes (zeros in vllm-ascend 0.23.0.post1
`AscendAttentionCPMetadataBuilder.build`, chunk starts rounded down to block_size in
`AscendMLAMetadataBuilder.build_chunked_metadata`), it loads tokens [seq_starts[b], seq_starts[b] +
n_b) of the request. The contract checks are ATB's
(`src/kernels/mixkernels/paged_cache_load/paged_cache_load_operation.cpp`,
`PagedCacheLoadOperation::CheckCommonPagedCacheLoad` and `CheckPagedCacheLoadNd`;
`src/ops/ops_infer/paged_cache_load/paged_cache_load_operation.cpp`,
`PagedCacheLoadOperation::DimCheck` and `KVCacheDimCheck910BND`); what the device reads from its
index tensors it cannot check (a block id outside the cache, a row past the block table's, more
tokens than key holds: the kernel would read or write out of bounds), and those are ValueErrors
here.
"""

from __future__ import annotations

import torch

from ..runtime.registry import calls
from ..runtime.strict import strict_module

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
    # Ascend/op-plugin 26.0.0 op_plugin/ops/atb/PagedCacheLoadAtb.cpp, its
    # TORCH_LIBRARY_FRAGMENT(atb, m) (also master and 7.3.0): one operator, two overloads.
    "npu_paged_cache_load.out": "(Tensor key_cache, Tensor value_cache, Tensor block_table, "
                                "Tensor context_lens, *, Tensor? seq_starts=None, "
                                "bool cumsum=False, Tensor(a!) key, Tensor(b!) value) "
                                "-> (Tensor(a!), Tensor(b!))",
    "npu_paged_cache_load": "(Tensor key_cache, Tensor value_cache, Tensor block_table, "
                            "Tensor context_lens, *, Tensor? seq_starts=None, "
                            "bool cumsum=False) -> (Tensor, Tensor)",
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


PAGED_CACHE_LOAD = "npu_paged_cache_load"
# ATB's kernel operation checks (hicann/ascend-transformer-boost
# src/kernels/mixkernels/paged_cache_load/paged_cache_load_operation.cpp, class
# PagedCacheLoadOperation: "PCL op" below, its CheckCommonPagedCacheLoad and
# CheckPagedCacheLoadNd cited by their messages) and its ND kernel
# (src/kernels/mixkernels/paged_cache_load/op_kernel/paged_cache_load_nd.cpp, "nd.cpp" below,
# PagedCacheLoadNd<T>::Process unless named).
# PCL op CheckPagedCacheLoadNd, "dim_2*dim_3 of KCache should be 32B aligned": num_heads *
# head_size * element size, 32-byte aligned.
_ALIGN_BYTES = 32


def _paged_cache_load_checks(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
    context_lens: torch.Tensor, seq_starts: torch.Tensor | None, cumsum: bool,
    key: torch.Tensor | None, value: torch.Tensor | None,
) -> None:  # fmt: skip
    """The shape, dtype and device contract, before any value is read (key and value None:
    the functional overload, which allocates them)."""
    name = PAGED_CACHE_LOAD
    tensors = {"key_cache": key_cache, "value_cache": value_cache, "block_table": block_table,
               "context_lens": context_lens, "seq_starts": seq_starts, "key": key,
               "value": value}  # fmt: skip
    tensors = {arg: tensor for arg, tensor in tensors.items() if tensor is not None}
    for arg, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name}: {arg!r} must be a tensor")
    if len({tensor.device for tensor in tensors.values()}) != 1:
        raise ValueError(f"{name}: all tensors must be on one device")
    for arg, tensor in tensors.items():
        if tensor.numel() == 0:
            # PCL op CheckCommonPagedCacheLoad: "... inTensor should not be null tensor", Mki's
            # CheckEmptyTensor (no elements and no data: ascend-boost-comm, public copy
            # repo-mirror-test/ascend-boost-comm, src/utils/checktensor/check_tensor.cpp,
            # CheckEmptyTensor). Assumed, not read from torch_npu's source: a tensor of no
            # elements reaches ATB without data (vllm-ascend calls only when total_toks > 0,
            # vllm-ascend 0.23.0.post1 AscendAttentionCPImpl._load_kv_for_chunk).
            raise ValueError(f"{name}: {arg!r} must not be empty (ATB refuses an empty "
                             f"tensor), got shape {tuple(tensor.shape)}")  # fmt: skip
    if key is not None and value is not None and (key.dim() == 2 or value.dim() == 2):
        # 2-D key/value [T, num_heads * head_size] belong to K_CACHE_V_CACHE_NZ (PCL op
        # CheckPagedCacheLoadNz, "K&V's dim num should be 2"; ATB ops_infer
        # paged_cache_load_operation.cpp, PagedCacheLoadOperation::SetupCheckImpl's NZ branch),
        # which op-plugin selects for a FRACTAL_NZ key cache (PagedCacheLoadAtb.cpp,
        # kv_cache_cfg in npu_paged_cache_load_out).
        raise NotImplementedError(
            f"{name}: the FRACTAL_NZ cache layout (kvCacheCfg K_CACHE_V_CACHE_NZ, 2-D key and "
            "value) is not emulated; only ND (kvCacheCfg K_CACHE_V_CACHE_ND) is"
        )
    if key_cache.dtype not in CACHE_TYPES:  # PCL op: "K&V&KCache&VCache should be either int8 ..."
        raise TypeError(f"{name}: key_cache dtype {key_cache.dtype} not supported (float16, "
                        "bfloat16, int8)")  # fmt: skip
    if value_cache.dtype != key_cache.dtype:
        # The ND kernel reads both caches as one element type T (nd.cpp: the GlobalTensor<T>
        # members inKeyCacheGM and inValueCacheGM, T chosen in paged_cache_load_nd from typeByte);
        # PCL op checks only the key cache's dtype against the outputs' ("K&V's dtype must be
        # same as KCache&VCache").
        raise TypeError(f"{name}: value_cache dtype {value_cache.dtype} must be key_cache's "
                        f"{key_cache.dtype}")  # fmt: skip
    for arg, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4:  # PCL op: "KCache&VCache's dim num should be 4"
            raise ValueError(f"{name}: {arg} must be 4-D [num_blocks, block_size, num_heads, "
                             f"head_size] (ND), got {tuple(cache.shape)}")  # fmt: skip
        if not cache.is_contiguous():
            # The kernel addresses block * block_size * num_heads * head_size
            # (nd.cpp: the DataCopy reads of inKeyCacheGM and inValueCacheGM): a dense ND cache.
            raise ValueError(f"{name}: {arg} must be contiguous (ND)")
        row_bytes = cache.shape[2] * cache.shape[3] * cache.element_size()
        # PCL op: "dim_2*dim_3 of KCache/VCache should be 32B aligned"; torch_npu 2.10.0.post4
        # op_plugin/atb/_atb_api_docs.py, npu_paged_cache_load's key_cache/value_cache: "32B对齐".
        if row_bytes % _ALIGN_BYTES:
            raise ValueError(f"{name}: {arg}'s num_heads * head_size * element size "
                             f"({row_bytes} bytes) must be a multiple of 32")  # fmt: skip
    if tuple(key_cache.shape[:3]) != tuple(value_cache.shape[:3]):
        # num_blocks, block_size: PCL op, "dim_0, dim_1 of KCache/VCache should be same";
        # num_heads: ATB ops_infer paged_cache_load_operation.cpp, DimCheck, "numHeads should be
        # same".
        raise ValueError(f"{name}: key_cache {tuple(key_cache.shape)} and value_cache "
                         f"{tuple(value_cache.shape)} must share num_blocks, block_size and "
                         "num_heads")  # fmt: skip
    if key_cache.shape[1] == 0:  # ops_infer DimCheck: "blockSize cannot be zero"
        raise ValueError(f"{name}: key_cache's block_size must not be 0")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:  # PCL op: "blockTables ..."
        raise TypeError(f"{name}: block_table must be a 2-D int32 tensor [batch, max_blocks], "
                        f"got {block_table.dtype} {tuple(block_table.shape)}")  # fmt: skip
    if context_lens.dtype != torch.int32 or context_lens.dim() != 1:  # PCL op: "contextLens ..."
        raise TypeError(f"{name}: context_lens must be a 1-D int32 tensor, got "
                        f"{context_lens.dtype} {tuple(context_lens.shape)}")  # fmt: skip
    batch = block_table.shape[0]
    want = batch + 1 if cumsum else batch  # PCL op: "contextLens's dim_0 must be ..." (cumsum: +1)
    if context_lens.shape[0] != want:
        raise ValueError(
            f"{name}: context_lens must have {want} entries for block_table's {batch} rows "
            f"(cumsum={cumsum}), got {context_lens.shape[0]}"
        )
    # seq_starts=None (op-plugin's default, hasSeqStarts false: PagedCacheLoadAtb.cpp,
    # has_seq_starts) reads from each request's first block (nd.cpp: tableOffset stays 0). Not
    # determined from the sources: whether ATB's ND operation, which counts 7 inputs (ops_infer
    # paged_cache_load_operation.cpp, PagedCacheLoadOperation::GetInputNum), accepts the
    # 6-tensor pack op-plugin then builds (atb_acl_paged_cache_load.cpp,
    # AtbPagedCacheLoadGetWorkspaceSize); vllm-ascend always passes seq_starts.
    if seq_starts is not None:  # PCL op: "seqStarts ..." checks, under param.hasSeqStarts
        if seq_starts.dtype != torch.int32 or seq_starts.dim() != 1:
            raise TypeError(f"{name}: seq_starts must be a 1-D int32 tensor, got "
                            f"{seq_starts.dtype} {tuple(seq_starts.shape)}")  # fmt: skip
        if seq_starts.shape[0] != batch:
            raise ValueError(f"{name}: seq_starts must have block_table's {batch} entries, "
                             f"got {seq_starts.shape[0]}")  # fmt: skip
    for arg, out, cache in (("key", key, key_cache), ("value", value, value_cache)):
        if out is None:
            continue
        if out.dim() != 3:  # PCL op: "K&V's dim num should be 3"
            raise ValueError(f"{name}: {arg!r} must be 3-D [tokens, num_heads, head_size] (ND), "
                             f"got {tuple(out.shape)}")  # fmt: skip
        if out.dtype != key_cache.dtype:  # PCL op: "K&V's dtype must be same as KCache&VCache"
            raise TypeError(f"{name}: {arg!r} dtype {out.dtype} must be the caches' "
                            f"{key_cache.dtype}")  # fmt: skip
        if tuple(out.shape[1:]) != tuple(cache.shape[2:]):  # PCL op: "dim_1/2 of K must be ..."
            raise ValueError(f"{name}: {arg!r} {tuple(out.shape)} must be [tokens, "
                             f"{cache.shape[2]}, {cache.shape[3]}] (its cache's num_heads and "
                             "head_size)")  # fmt: skip
        if not out.is_contiguous():
            # The kernel writes row (token * num_heads * head_size) of a dense output
            # (nd.cpp: the DataCopy writes of outKeyGM and outValueGM).
            raise ValueError(f"{name}: {arg!r} must be contiguous")
    if key is not None and value is not None and key.shape[0] != value.shape[0]:
        # PCL op: "K&V's dim_0 must be same".
        raise ValueError(f"{name}: 'key' and 'value' must have one token count, got "
                         f"{key.shape[0]} and {value.shape[0]}")  # fmt: skip


def _paged_cache_load_plan(
    key_cache: torch.Tensor, block_table: torch.Tensor, context_lens: torch.Tensor,
    seq_starts: torch.Tensor | None, cumsum: bool,
) -> tuple[int, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(rows the outputs need, output row per loaded token, cache slot per loaded token), the
    ND kernel's walk (`PagedCacheLoadNd<T>::Process`, its loop over batchId), with the index
    checks the device cannot make."""
    name = PAGED_CACHE_LOAD
    num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    batch, table_width = block_table.shape
    lens = [int(v) for v in context_lens.tolist()]
    if cumsum:  # nd.cpp, cuSeqLens: tokenStart = context_lens[0], rows from there
        bounds = list(zip(lens[:-1], lens[1:], strict=True))
        if any(end < start for start, end in bounds) or (lens and lens[0] < 0):
            raise ValueError(f"{name}: context_lens must be non-negative and non-decreasing "
                             "with cumsum=True")  # fmt: skip
    else:  # nd.cpp, numToken = context_lens[b]; op-plugin npu_paged_cache_load: "Invalid
        # context_lens: negative value encountered"
        if any(n < 0 for n in lens):
            raise ValueError(f"{name}: context_lens must be non-negative, got {lens}")
        starts = [sum(lens[:b]) for b in range(batch)]
        bounds = [(start, start + n) for start, n in zip(starts, lens, strict=True)]
    offsets = [int(v) for v in seq_starts.tolist()] if seq_starts is not None else [0] * batch
    if any(s < 0 for s in offsets):
        raise ValueError(f"{name}: seq_starts must be non-negative, got {offsets}")
    rows, slots = [], []
    for b, ((start, end), offset) in enumerate(zip(bounds, offsets, strict=True)):
        tokens = torch.arange(end - start)
        # Whole blocks: the kernel reads seq_starts[b] / block_size (nd.cpp, tableOffset).
        columns = offset // block_size + tokens // block_size
        if len(tokens) and int(columns[-1]) >= table_width:
            raise ValueError(
                f"{name}: request {b} reads block_table column {int(columns[-1])} (seq_starts "
                f"{offset}, {end - start} tokens, block_size {block_size}); block_table has "
                f"{table_width} columns"
            )
        blocks = block_table[b].long().index_select(0, columns.to(block_table.device))
        # The ND kernel reads any id it is given (nd.cpp, blockID from inBlockTableGM, unchecked);
        # ATB's golden skips a negative id (test_paged_cache_load_operation_nd.py,
        # generate_data: `if block_id < 0: continue`), the kernel does not.
        if len(tokens) and (int(blocks.min()) < 0 or int(blocks.max()) >= num_blocks):
            raise ValueError(f"{name}: block_table row {b} holds a block id outside the "
                             f"caches' {num_blocks} blocks: {blocks.tolist()}")  # fmt: skip
        rows.append(start + tokens)
        slots.append(blocks.cpu() * block_size + tokens % block_size)
    needed = bounds[-1][1] if bounds else (lens[0] if lens else 0)
    empty = torch.zeros(0, dtype=torch.long)
    return needed, torch.cat([empty, *rows]), torch.cat([empty, *slots])


def _paged_cache_load_kernel(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
    context_lens: torch.Tensor, seq_starts: torch.Tensor | None, cumsum: bool,
    key: torch.Tensor, value: torch.Tensor,
) -> None:  # fmt: skip
    name = PAGED_CACHE_LOAD
    needed, rows, slots = _paged_cache_load_plan(
        key_cache, block_table, context_lens, seq_starts, cumsum
    )
    if needed > key.shape[0]:
        # The kernel writes request after request from row 0 (or context_lens[0]) with no
        # bound (nd.cpp, the outKeyGM/outValueGM writes); ATB checks only that key and value
        # agree (PCL op: "K&V's dim_0 must be same").
        raise ValueError(f"{name}: 'key' and 'value' hold {key.shape[0]} tokens; context_lens "
                         f"needs {needed}")  # fmt: skip
    rows, slots = rows.to(key.device), slots.to(key.device)
    for out, cache in ((key, key_cache), (value, value_cache)):
        flat = cache.view(cache.shape[0] * cache.shape[1], *cache.shape[2:])
        out.index_copy_(0, rows, flat.index_select(0, slots))  # rows past `needed`: untouched


def npu_paged_cache_load_out(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
    context_lens: torch.Tensor, *, seq_starts: torch.Tensor | None = None, cumsum: bool = False,
    key: torch.Tensor, value: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The `.out` overload (op-plugin `npu_paged_cache_load_out`): key and value in place."""
    calls[PAGED_CACHE_LOAD] += 1
    _paged_cache_load_checks(key_cache, value_cache, block_table, context_lens, seq_starts,
                             cumsum, key, value)  # fmt: skip
    _paged_cache_load_kernel(key_cache, value_cache, block_table, context_lens, seq_starts,
                             cumsum, key, value)  # fmt: skip
    return key, value


def npu_paged_cache_load(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
    context_lens: torch.Tensor, *, seq_starts: torch.Tensor | None = None, cumsum: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The functional overload (op-plugin `npu_paged_cache_load`): key and value of
    sum(context_lens) tokens (context_lens[-1] with cumsum), allocated like the caches."""
    calls[PAGED_CACHE_LOAD] += 1
    _paged_cache_load_checks(key_cache, value_cache, block_table, context_lens, seq_starts,
                             cumsum, None, None)  # fmt: skip
    needed, _, _ = _paged_cache_load_plan(key_cache, block_table, context_lens, seq_starts,
                                          cumsum)  # fmt: skip
    if needed == 0:  # outputs of no token: an empty tensor, which ATB refuses (see checks)
        raise ValueError(f"{PAGED_CACHE_LOAD}: context_lens select no token; 'key' and "
                         "'value' would be empty (ATB refuses an empty tensor)")  # fmt: skip
    key = key_cache.new_empty((needed, *key_cache.shape[2:]))  # op-plugin: at::empty(...)
    value = value_cache.new_empty((needed, *value_cache.shape[2:]))
    _paged_cache_load_kernel(key_cache, value_cache, block_table, context_lens, seq_starts,
                             cumsum, key, value)  # fmt: skip
    return key, value


def _fake_paged_cache_load_out(*args, key, value, **kwargs):
    return key, value  # the schema's `-> (Tensor(a!), Tensor(b!))`: the outputs given


# Fake kernels: the `-> ()` operators return nothing; the functional npu_paged_cache_load has
# none, as in torch_npu (its output length is read from context_lens on the device, and the
# wheel's `op_plugin/atb/_atb_meta_registrations.py` registers no meta kernel for it).
FAKES = {name: (lambda *args: None) for name in SCHEMAS if not name.startswith(PAGED_CACHE_LOAD)}
FAKES["npu_paged_cache_load.out"] = _fake_paged_cache_load_out


def _register() -> torch.library.Library | None:
    """Define `torch.ops.atb.<name>` for each of `SCHEMAS` with its CPU kernel (once)."""
    if torch._C._jit_get_schemas_for_operator(f"{NAMESPACE}::_npu_reshape_and_cache"):
        return None  # registered by an earlier import
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in SCHEMAS.items():  # "op" or "op.overload": kernel `op` / `op_overload`
        library.define(name + schema)
        library.impl(name, globals()[name.replace(".", "_")], "CPU")
        if name in FAKES:
            torch.library.register_fake(f"{NAMESPACE}::{name}", FAKES[name], lib=library)
    return library


_LIBRARY = _register()
# What torch_npu binds as `torch_npu.<name>`: the operator packets.
_npu_matmul_add_fp32 = torch.ops.atb._npu_matmul_add_fp32  # noqa: F811
_npu_rotary_embedding = torch.ops.atb._npu_rotary_embedding  # noqa: F811
_npu_reshape_and_cache = torch.ops.atb._npu_reshape_and_cache  # noqa: F811
# What torch_npu binds as `torch_npu.atb.<name>` (its `ATB_API_LIST`): the packet, whose
# overload torch picks from the arguments (key= and value= select `.out`).
npu_paged_cache_load = torch.ops.atb.npu_paged_cache_load  # noqa: F811
# `torch_npu.atb`: torch_npu's module of ATB operators (`_atb_ops.py` `_add_atb_module`:
# `torch_npu.atb`, also `sys.modules["torch_npu.atb"]`); only the names above are emulated.
ATB_MODULE = strict_module(
    "torch_npu.atb", "ATB operators bound by torch_npu as torch_npu.atb.<name>.",
    npu_paged_cache_load=npu_paged_cache_load,
)  # fmt: skip
