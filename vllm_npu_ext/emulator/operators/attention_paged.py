"""FIA on a paged KV cache (PageAttention): `npu_fused_infer_attention_score` with a
`block_table`, as vllm-ascend 0.23 calls it on every decode step.

Callers (vllm-ascend 0.23.0.post1): the non-CP decode (`AscendAttentionBackendImpl._get_fia_params`
and `forward_fused_infer_attention`: sparse_mode 3 with the compressed mask,
`actual_seq_lengths_kv=seq_lens_list`) and the context-parallel decode
(`AscendAttentionCPImpl._forward_decode_pcp_dcp`: sparse_mode 0 without a mask, `num_heads = dcp *
H`, `actual_seq_lengths_kv` = this rank's token counts per request, a numpy array,
`softmax_lse_flag=True`). Both pass query `[T, N, D]` in TND, the cache viewed as `[num_blocks,
block_size, N_kv * D]` ("BnBsH"), an int32 `[B, max_blocks]` block table and `block_size =
key.shape[1]`.

Rules, from torch-npu 2.10.0.post4's `torch_npu/_op_plugin_docs.py`, the
`npu_fused_infer_attention_score` docstring, cited by section: "P" its 参数说明, "S>1" and "S=1" its
约束说明 passages 当Q_S大于1时 and 当Q_S等于1时, each with a "page attention场景" list ("PA"),
quoted where a list holds several rules. (The error messages give W:line, the line of the rule in
that file of that wheel.)
- Paging is on when `block_table` is given (S>1 PA, "使能必要条件"; S=1 PA, "使能必要条件"); the
  key/value layout argument is then ignored (S>1 PA, "input_layout参数无效"): the cache is
  `(blocknum, blocksize, H)` or `(blocknum, KV_N, blocksize, D)` with query in BNSD or TND (S>1 PA
  and S=1 PA, "kv cache排布"); only the first is emulated, in TND (the 4-D cache and the other query
  layouts raise NotImplementedError). key and value have one shape (S=1 PA,
  "key和value的shape需保证一致"); KV_N * D <= 65535 (S>1 PA, "KV_N*D超过65535"; S=1 PA, "超过64k").
- `block_table`: int32 (P, block_table), 2-D, one row per sequence, at least as many columns as the
  longest sequence needs (S>1 PA and S=1 PA, "必须为二维"). Its block ids are not validated by the
  operator (S>1 PA, "不会对blockid的合法性进行校验"): the stand-in raises for an id outside the
  cache (the device would read other memory). `num_blocks` >= the blocks all sequences need together
  (S>1 PA and S=1 PA, "blocknum不能小于").
- `block_size` equals the cache's block axis: for one query token per sequence (decode) non-zero, <=
  512 and a multiple of 16 for float16/bfloat16 (S=1 PA, block_size); with more query tokens
  128..512 in multiples of 128 (S>1 PA, block_size).
- `actual_seq_lengths_kv` is required (S>1 PA, "必须传入actual_seq_lengths_kv") and, with paging,
  per sequence, not cumulative: "在PA场景下, 其长度等于key/value的Batch值, 代表每个Batch的实际长度,
  值不大于KV_S" (S=1, actual_seq_lengths_kv); the block counts per sequence are computed from it
  (S>1 PA and S=1 PA, "blocknum不能小于" and "必须为二维"); vllm-ascend passes per-request lengths
  in both decodes. The cumulative reading (S>1, actual_seq_lengths_kv) is for key/value in TND
  layout, which paging ignores (S>1 PA, "input_layout参数无效"). `actual_seq_lengths` (query) stays
  cumulative as in every TND call. Non-negative (S=1, actual_seq_lengths_kv), at most 262144 per
  sequence for one query token (S=1, "支持S轴小于等于262144").
- P's input_layout (its Atlas A2 entry) lists page attention among what TND does not support on
  Atlas A2/A3, against the "kv cache排布" rules (TND with the paged cache) and S=1's
  actual_seq_lengths_kv (TND lengths "在PA场景下"); the stand-in follows the latter, which is what
  vllm-ascend 0.23 runs on Atlas A2 on every decode.
- The TND domain (bfloat16, D 128) and the head, mask and scale rules are FIA's own
  (`attention.py`). A sequence with no visible key raises, as without paging, except a decode query
  (one token) whose sequence has no key at all in this cache: vllm-ascend makes that call wherever a
  CP rank holds none of a request's keys yet (short requests, the capture warm-up's dummy batch,
  `pcp_utils._get_cp_local_seq_lens`), and S=1's actual_seq_lengths_kv allows a key count of 0, but
  no passage says what FIA writes for it. Not read from a source: the stand-in writes NaN to that
  row's output and LSE, so only a caller that discards them stays correct (the CP merge masks such
  rows, `vllm_npu_ext.patches.vllm_ascend_cp.empty_shard_masks`).

Token j of sequence b is row j % block_size of block `block_table[b, j // block_size]`; the
gathered keys and values then go through the same float32 attention as unpaged calls.
"""

from __future__ import annotations

import math

import torch

from ..runtime.checks import (
    FLOAT16_TYPES,
    require_choice,
    require_contiguous,
    require_dtype,
    require_ndim,
    require_real_scale,
    require_same_dtype,
    sequence_lengths,
)
from ..runtime.schema import BoundCall
from .attention_contract import (
    FIA,
    FIA_HANDLED,
    FIA_OUT_ARGUMENTS,
    FIA_SPARSE_MODES,
    MASK_SIDE,
    _causal,
    _kv_heads,
    _require_fia_sizes,
    _require_fia_tnd_domain,
    _require_head_counts,
)
from .attention_math import Packed, require_visible_keys

PAGED_HANDLED = FIA_HANDLED | FIA_OUT_ARGUMENTS | {"block_table", "block_size"}
MAX_BLOCK_SIZE = 512
MAX_HIDDEN_PER_TOKEN = 65535  # KV_N * D of a (blocknum, blocksize, H) cache
MAX_DECODE_KV_LEN = 262144
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)
MASK_SHAPES = ((MASK_SIDE, MASK_SIDE), (1, MASK_SIDE, MASK_SIDE), (1, 1, MASK_SIDE, MASK_SIDE))


def checked_paged(call: BoundCall) -> tuple[Packed, bool]:
    """A paged FIA call's contract checked (module docstring); (the gathered TND batch,
    whether causal), for FIA's own attention and output."""
    call.require_defaults(PAGED_HANDLED)
    query, key, value = call.query, call.key, call.value
    _require_paged_layout(call)
    require_dtype(FIA, "query", query, FLOAT16_TYPES)
    require_same_dtype(FIA, {"query": query, "key": key, "value": value})
    require_contiguous(FIA, {"query": query, "key": key, "value": value})
    require_choice(FIA, "inner_precise", call.inner_precise, (0, 1, 2, 3))
    names = ("num_heads", "num_key_value_heads")
    heads = (call.num_heads, _kv_heads(FIA, names, call.num_heads, call.num_key_value_heads))
    head_dim = query.shape[-1]
    _require_cache_shape(key, value, heads[1], head_dim)
    query_lens = sequence_lengths(FIA, "actual_seq_lengths", call.actual_seq_lengths,
                                  query.shape[0])  # fmt: skip
    decode = max(query_lens) <= 1
    key_lens = _per_sequence_lengths(call.actual_seq_lengths_kv, len(query_lens), decode)
    block_size = _block_size(call.block_size, key, decode)
    blocks = _block_ids(call.block_table, key_lens, block_size, key.shape[0])
    packed = Packed(
        query, _gather(key, blocks, key_lens, heads[1]), _gather(value, blocks, key_lens, heads[1]),
        query_lens, key_lens, len(query_lens), 0,
    )  # fmt: skip
    _require_head_counts(FIA, packed, heads, names)
    _require_fia_tnd_domain(packed)
    _require_fia_sizes(packed)
    require_real_scale(FIA, "scale", call.scale, head_dim)
    causal = _causal(FIA, call, FIA_SPARSE_MODES, MASK_DTYPES, MASK_SHAPES)
    require_visible_keys(FIA, packed, causal, without_keys=True)
    return packed, causal


def _require_paged_layout(call: BoundCall) -> None:
    if call.input_layout != "TND":
        raise NotImplementedError(
            f"{FIA}: paged KV (block_table) is emulated for input_layout 'TND' only (vllm-ascend's "
            f"decode), got {call.input_layout!r}"
        )
    require_ndim(FIA, "query", call.query, (3,))
    if call.key.dim() == 4:
        raise NotImplementedError(
            f"{FIA}: the (num_blocks, KV_N, block_size, D) cache layout (W:8241) is not emulated; "
            "pass the cache as (num_blocks, block_size, KV_N * D)"
        )
    require_ndim(FIA, "key", call.key, (3,))


def _require_cache_shape(key: torch.Tensor, value: torch.Tensor, kv_heads: int, head_dim: int):
    """key/value `[num_blocks, block_size, KV_N * D]`, one shape (S=1 PA), KV_N * D <= 65535."""
    if key.shape != value.shape:
        raise ValueError(
            f"{FIA}: paged key and value must have one shape (W:8241), got {tuple(key.shape)} "
            f"and {tuple(value.shape)}"
        )
    if key.shape[-1] != kv_heads * head_dim:
        raise ValueError(
            f"{FIA}: paged key's last axis is {key.shape[-1]}, not num_key_value_heads x head_dim "
            f"= {kv_heads} x {head_dim} (cache [num_blocks, block_size, KV_N * D])"
        )
    if key.shape[-1] > MAX_HIDDEN_PER_TOKEN:
        raise ValueError(
            f"{FIA}: paged cache with KV_N * D = {key.shape[-1]} > {MAX_HIDDEN_PER_TOKEN} "
            "(W:8176, W:8243)"
        )


def _per_sequence_lengths(lengths: list[int] | None, batch: int, decode: bool) -> list[int]:
    """`actual_seq_lengths_kv` with paging: one key count per sequence (S=1,
    actual_seq_lengths_kv)."""
    name = "actual_seq_lengths_kv"
    if lengths is None:
        raise ValueError(f"{FIA}: argument {name!r} is required with block_table (W:8178)")
    if len(lengths) != batch:
        raise ValueError(
            f"{FIA}: argument {name!r} has {len(lengths)} entries but actual_seq_lengths gives "
            f"{batch} sequences; with block_table it holds one key count per sequence (W:8231)"
        )
    limit = MAX_DECODE_KV_LEN if decode else math.inf
    for index, length in enumerate(lengths):
        if not 0 <= length <= limit:
            raise ValueError(
                f"{FIA}: argument {name!r}[{index}] is {length}; per-sequence key counts are "
                f"non-negative (W:8231){' and at most 262144 for decode (W:8227)' * decode}"
            )
    return list(lengths)


def _block_size(block_size: int, key: torch.Tensor, decode: bool) -> int:
    """The cache's block axis; decode: 1..512, multiple of 16 (S=1 PA, block_size); else 128..512,
    multiple of 128 (S>1 PA, block_size)."""
    if block_size != key.shape[1]:
        raise ValueError(
            f"{FIA}: argument 'block_size' is {block_size} but the paged key has blocks of "
            f"{key.shape[1]} tokens ([num_blocks, block_size, KV_N * D])"
        )
    step, rule = (16, "one query token per sequence, W:8236") if decode else (128, "W:8175")
    if not step <= block_size <= MAX_BLOCK_SIZE or block_size % step:
        raise ValueError(
            f"{FIA}: argument 'block_size' must be a multiple of {step} in {step}..."
            f"{MAX_BLOCK_SIZE} ({rule}), got {block_size}"
        )
    return block_size


def _block_ids(table: torch.Tensor, key_lens: list[int], block_size: int, num_blocks: int):
    """Per sequence, the ids of the blocks its keys occupy (P, block_table; S>1 PA and S=1 PA)."""
    if table.dtype != torch.int32:
        raise TypeError(f"{FIA}: argument 'block_table' must be int32 (W:8047), got {table.dtype}")
    if table.dim() != 2 or table.shape[0] != len(key_lens):
        raise ValueError(
            f"{FIA}: argument 'block_table' must be 2-D with one row per sequence "
            f"({len(key_lens)}) (W:8240), got shape {tuple(table.shape)}"
        )
    needed = [math.ceil(length / block_size) for length in key_lens]
    if max(needed, default=0) > table.shape[1]:
        raise ValueError(
            f"{FIA}: a sequence of {max(key_lens)} keys needs {max(needed)} blocks of "
            f"{block_size}; block_table has {table.shape[1]} columns (W:8240)"
        )
    if sum(needed) > num_blocks:
        raise ValueError(
            f"{FIA}: the sequences need {sum(needed)} blocks, the cache has {num_blocks} (W:8241)"
        )
    blocks = [table[row, :count].long() for row, count in enumerate(needed)]
    for row, ids in enumerate(blocks):
        outside = ids[(ids < 0) | (ids >= num_blocks)]
        if outside.numel():
            raise ValueError(
                f"{FIA}: block_table row {row} names block {int(outside[0])}, outside the cache's "
                f"{num_blocks} blocks (the operator does not check ids, W:8174)"
            )
    return blocks


def _gather(cache: torch.Tensor, blocks, key_lens: list[int], kv_heads: int) -> torch.Tensor:
    """The keys (or values) of every sequence, packed `[sum(key_lens), KV_N, D]`."""
    head_dim = cache.shape[-1] // kv_heads
    rows = [cache.index_select(0, ids).reshape(-1, kv_heads, head_dim)[:length]
            for ids, length in zip(blocks, key_lens, strict=True)]  # fmt: skip
    return torch.cat(rows) if rows else cache.new_zeros((0, kv_heads, head_dim))
