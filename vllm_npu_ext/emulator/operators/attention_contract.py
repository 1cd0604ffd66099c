"""The attention operators' contract shared by every FIA and FA call the stand-in checks:
names, layouts, sparse modes, head counts, the causal mask and the documented TND limits
(sources in `attention`'s docstring). `attention` (FIA and FA on contiguous key/value) and
`attention_paged` (FIA on a paged KV cache) both check calls with these.
"""

from __future__ import annotations

import torch

from ..runtime.checks import require_choice, require_compressed_causal_mask
from ..runtime.schema import BoundCall
from .attention_math import Packed

FIA = "npu_fused_infer_attention_score"
FIA_MAX_WORKSPACE = "_npu_fused_infer_attention_score_get_max_workspace"
FA = "npu_fusion_attention"
FIA_LAYOUTS = ("TND", "BSH", "BSND", "BNSD")
FIA_OTHER_LAYOUTS = (
    "BNSD_BSND", "NSD", "NTD", "TND_NTD", "NTD_TND", "BSH_BNSD", "BSND_BNSD", "BSH_NBSD",
    "BSND_NBSD", "BNSD_NBSD",
)
FA_LAYOUTS = ("TND", "BSH", "SBH", "BSND", "BNSD")
FIA_SPARSE_MODES = (0, 1, 2, 3, 4, 9)
FA_SPARSE_MODES = (0, 1, 2, 3, 4, 5, 6, 7, 8)
MAX_GQA_RATIO = 64
MASK_SIDE = 2048
FIA_TND_DTYPES = (torch.bfloat16,)
FIA_TND_VALUE_DIMS = {128: (128,), 192: (128, 192)}  # Q_D = K_D -> the V_D it allows
FIA_TND_MAX_BATCH = 4096
FA_TND_MAX_BATCH = 1024
TND_MAX_TOKENS = 1 << 20
FIA_HANDLED = {
    "query", "key", "value", "atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv",
    "num_heads", "scale", "pre_tokens", "next_tokens", "input_layout", "num_key_value_heads",
    "sparse_mode", "inner_precise", "softmax_lse_flag",
}
FIA_OUT_ARGUMENTS = {"workspace", "out"}  # `.out` only; `_write_out` and attention_workspace
FA_HANDLED = {
    "query", "key", "value", "head_num", "input_layout", "padding_mask", "atten_mask", "scale",
    "keep_prob", "pre_tockens", "next_tockens", "inner_precise", "actual_seq_qlen",
    "actual_seq_kvlen", "sparse_mode", "gen_mask_parallel", "sync", "softmax_layout", "seed",
    "offset",
}


def _require_layout(op: str, layout: str, emulated: tuple[str, ...], other=()) -> None:
    if layout in other:
        raise NotImplementedError(f"{op}: input_layout {layout!r} is not emulated; use {emulated}")
    require_choice(op, "input_layout", layout, emulated)


def _kv_heads(op: str, names: tuple[str, str], num_heads: int, num_kv_heads: int) -> int:
    """Key/value head count (0 means num_heads); must divide num_heads, ratio <= 64."""
    if num_heads <= 0:
        raise ValueError(f"{op}: argument {names[0]!r} must be > 0, got {num_heads}")
    if num_kv_heads < 0:
        raise ValueError(f"{op}: argument {names[1]!r} must be >= 0, got {num_kv_heads}")
    num_kv_heads = num_kv_heads or num_heads
    if num_heads % num_kv_heads:
        raise ValueError(
            f"{op}: {names[0]}={num_heads} is not divisible by {names[1]}={num_kv_heads}"
        )
    if num_heads // num_kv_heads > MAX_GQA_RATIO:
        raise ValueError(
            f"{op}: {names[0]} / {names[1]} = {num_heads // num_kv_heads} exceeds {MAX_GQA_RATIO}"
        )
    return num_kv_heads


def _require_head_counts(op: str, packed: Packed, heads: tuple[int, int], names) -> None:
    """The packed tensors' head axes must match the head-count arguments."""
    for tensor, name, expected, arg in (
        (packed.query, "query", heads[0], names[0]),
        (packed.key, "key", heads[1], names[1]),
        (packed.value, "value", heads[1], names[1]),
    ):
        if tensor.shape[1] != expected:
            raise ValueError(
                f"{op}: argument {name!r} has {tensor.shape[1]} heads but {arg} says {expected}"
            )


def _causal(op: str, call: BoundCall, modes: tuple[int, ...], mask_dtypes, mask_shapes) -> bool:
    """Whether the call asks for right-down causal masking (sparse_mode 3); rejects the rest."""
    mode, mask = call.sparse_mode, call.atten_mask
    require_choice(op, "sparse_mode", mode, modes)
    if mode == 3:
        require_compressed_causal_mask(op, mask, mode, mask_dtypes, mask_shapes)
        return True
    if mode == 0 and mask is None:
        return False
    if mask is None:
        raise ValueError(
            f"{op}: sparse_mode={mode} needs atten_mask (without one npu_fusion_attention "
            "silently computes full attention and FIA rejects the call)"
        )
    raise NotImplementedError(f"{op}: sparse_mode={mode} with an atten_mask is not emulated")


def _require_fia_sizes(packed: Packed) -> None:
    """Documented limits: N <= 256, D <= 512, D % 16 == 0 when a sequence has > 1 query token."""
    heads, head_dim = packed.query.shape[1], packed.query.shape[-1]
    if heads > 256:
        raise ValueError(f"{FIA}: query has {heads} heads; the operator supports at most 256")
    if packed.key.shape[-1] != head_dim or packed.value.shape[-1] != head_dim:
        raise ValueError(f"{FIA}: query, key and value must share head_dim {head_dim}")
    if head_dim > 512:
        raise ValueError(f"{FIA}: head_dim {head_dim} exceeds the operator's limit of 512")
    if max(packed.query_lens, default=0) > 1 and head_dim % 16:
        raise ValueError(
            f"{FIA}: head_dim {head_dim} must be a multiple of 16 for float16/bfloat16 inputs "
            "when a sequence has more than one query token"
        )


def _require_fia_tnd_domain(packed: Packed) -> None:
    """The TND limits in the module docstring: bf16, D 128 (or 192), <= 4096 sequences."""
    query, value = packed.query, packed.value
    if query.dtype not in FIA_TND_DTYPES:
        raise TypeError(
            f"{FIA}: input_layout 'TND' takes bfloat16 only (torch-npu 2.10.0.post4 docs), got "
            f"query dtype {query.dtype}; use npu_fusion_attention for other dtypes"
        )
    head_dim, value_dim = query.shape[-1], value.shape[-1]
    if value_dim not in FIA_TND_VALUE_DIMS.get(head_dim, ()):
        raise ValueError(
            f"{FIA}: input_layout 'TND' needs Q_D = K_D = V_D = 128, or Q_D = K_D = 192 with "
            f"V_D 128/192; got Q_D {head_dim}, V_D {value_dim}"
        )
    _require_tnd_size(FIA, packed, FIA_TND_MAX_BATCH, "actual_seq_lengths")


def _require_tnd_size(op: str, packed: Packed, max_batch: int, name: str) -> None:
    """At most `max_batch` sequences and TND_MAX_TOKENS tokens in one TND call."""
    if packed.batch > max_batch:
        raise ValueError(
            f"{op}: argument {name!r} has {packed.batch} sequences; the operator takes at most "
            f"{max_batch} in input_layout 'TND'"
        )
    if max(packed.query.shape[0], packed.key.shape[0]) > TND_MAX_TOKENS:
        raise ValueError(
            f"{op}: input_layout 'TND' takes at most {TND_MAX_TOKENS} tokens (T), got "
            f"{packed.query.shape[0]} query and {packed.key.shape[0]} key tokens"
        )
