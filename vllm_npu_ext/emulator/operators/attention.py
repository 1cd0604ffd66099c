"""Emulated `npu_fused_infer_attention_score` (FIA) and `npu_fusion_attention` (FA).

Implemented: layouts TND, BSH, BSND, BNSD (FA also SBH); sparse_mode 0 without a mask (full
attention) and sparse_mode 3 (right-down causal) with the compressed 2048x2048 mask; native
GQA; FIA on a paged KV cache in TND (`attention_paged`). Everything else the real operators
offer (quantisation, other paged layouts, padding, prefixes, other sparse modes, dropout)
raises NotImplementedError rather than computing something else.

Documented limits of the TND (varlen) layout, from torch-npu 2.10.0.post4's
`torch_npu/_op_plugin_docs.py` (the docstrings of `npu_fused_infer_attention_score`, "FIA", of
`npu_fused_infer_attention_score_v2`, "FIA v2", and of `npu_fusion_attention`, "FA": each under
约束说明, cited by the passage's heading) and op-plugin's FIA doc
(master `docs/zh/custom_APIs/torch_npu/torch_npu-npu_fused_infer_attention_score.md`, section
"TND布局约束", cited as OPm):

- FIA: bfloat16 only (FIA "TND场景下query、key、value输入的综合限制"; FIA v2
  "TND、TND_NTD、NTD_TND场景下query、key、value输入的综合限制", both "数据类型仅支持BFLOAT16"); Q_D
  = K_D = V_D = 128, or Q_D = K_D = 192 with V_D 128/192 (FIA v2, same passage; OPm, "query D ≠
  512时"); K_N == V_N with Q_N a multiple, ratio <= 64 (FIA v2, same passage); at most 4096
  sequences (FIA v2, "元素个数不大于4096"; OPm); T <= 1M (FIA v2, "T小于等于1M"). Those passages
  document npu_fused_infer_attention_score_v2; FIA's own TND passage (Q_D = K_D = 192 only, Q_N ==
  K_N, T <= 65536) is not applied: op-plugin's newer FIA doc drops it (OPm), and vllm-ascend 0.23
  calls FIA in TND with D = 128 and GQA on every Qwen3 prefill (vllm-ascend 0.23.0.post1
  `AscendAttentionBackendImpl.forward_fused_infer_attention`), tested on Atlas A2 (v0.23.0's
  `tests/ut/attention/a2/test_attention_v1_precision.py`: bfloat16 in
  `_test_npu_attention_correctness`, Qwen/Qwen3-8B in `test_causal_backend_correctness`). Its
  "actual_seq_lengths < actual_seq_lengths_kv" for sparse_mode 3 (FIA and FIA v2, same passages) is
  not applied either: vllm-ascend passes equal lengths
  (`AscendAttentionBackendImpl._get_fia_params`). Fewer queries than keys is the case it
  documents, and the one shared-prefix attention makes (`vllm_npu_ext.ops.shared_prefix`: a
  text's own rows against its prefix's keys and its own): emulated right-down aligned; more
  queries than keys raises (`attention_math.require_visible_keys`).
- FA: at most 1024 sequences ("varlen场景下长度最大支持1K"; B 1~2K, "varlen场景B取值范围1~2K"), T <=
  1M (FA "varlen场景下", "要求T(B*S)取值范围1~1M").
"""

from __future__ import annotations

import torch

from ..runtime.checks import (
    FLOAT16_TYPES,
    FLOAT_TYPES,
    require_choice,
    require_contiguous,
    require_dtype,
    require_real_scale,
    require_same_dtype,
)
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall
from . import attention_workspace
from .attention_contract import (
    FA,
    FA_HANDLED,
    FA_LAYOUTS,
    FA_SPARSE_MODES,
    FA_TND_MAX_BATCH,
    FIA,
    FIA_HANDLED,
    FIA_LAYOUTS,
    FIA_MAX_WORKSPACE,
    FIA_OTHER_LAYOUTS,
    FIA_OUT_ARGUMENTS,
    FIA_SPARSE_MODES,
    MASK_SIDE,
    _causal,
    _kv_heads,
    _require_fia_sizes,
    _require_fia_tnd_domain,
    _require_head_counts,
    _require_layout,
    _require_tnd_size,
)
from .attention_math import (
    Packed,
    pack,
    require_visible_keys,
    unpack_output,
    unpack_rows,
    varlen_attention,
)
from .attention_paged import checked_paged


@emulated_operator(FIA, overloads=("", "out"))
def npu_fused_infer_attention_score(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor]:
    """FIA, as torch_npu documents it (`_attention`); `.out` writes into given tensors.

    `.out` (its own docstring in `_op_plugin_docs.py`) adds `workspace` and `out`. Its registered
    schema takes `Tensor[] out` (torch_npu/lib/libtorch_npu.so; the wheel's codegen YAML lists
    `attention_out, softmax_lse` instead), which is how vllm-ascend calls it:
    `out=[output, softmax_lse]` (vllm-ascend 0.23.0.post1
    `AscendAttentionBackendImpl.update_graph_params`, `update_encoder_graph_params` in
    `vllm_ascend/worker/encoder_acl_graph.py`). The result goes into `out[0]` (shape and dtype of
    the result); `softmax_lse` is "reserved, not supported" in the docs, yet vllm-ascend's CP decode
    reads it with `softmax_lse_flag=True` (`AscendAttentionCPImpl._forward_decode_pcp_dcp`): written
    when the flag is set, untouched otherwise (a dummy `[1]` there). A `workspace` must come from
    `_npu_fused_infer_attention_score_get_max_workspace` for the same shapes
    (`attention_workspace`). Returns `(out[0], out[1])`.
    """
    if call.overload != "out":
        return _attention(call)
    attention_workspace.require_workspace(call)
    return _write_out(call, *_attention(call))


def _write_out(call: BoundCall, out: torch.Tensor, lse: torch.Tensor) -> tuple:
    """`.out`'s results written into `call.out` (class docstring of the kernel above)."""
    targets = call.out
    if len(targets) != 2:
        raise ValueError(f"{FIA}.out: argument 'out' must hold [attention_out, softmax_lse], "
                         f"got {len(targets)} tensors")  # fmt: skip
    attention_out, softmax_lse = targets
    for name, target, result in (("out[0]", attention_out, out), ("out[1]", softmax_lse, lse)):
        if name == "out[1]" and not call.softmax_lse_flag:
            continue
        if target.shape != result.shape or target.dtype != result.dtype:
            raise ValueError(
                f"{FIA}.out: argument {name!r} is {tuple(target.shape)} {target.dtype}; the "
                f"result is {tuple(result.shape)} {result.dtype}"
            )
        target.copy_(result)
    return attention_out, softmax_lse


@emulated_operator(FIA_MAX_WORKSPACE, host_only=True)  # aclnn sizing on the host + an allocation
def _npu_fused_infer_attention_score_get_max_workspace(call: BoundCall) -> torch.Tensor:
    """The workspace FIA `.out` takes for graph capture (torch-npu 2.10.0.post4
    `_op_plugin_docs.py`, the `_npu_fused_infer_attention_score_get_max_workspace` docstring):
    "inputs as npu_fused_infer_attention_score", a 1-D tensor of query's dtype (the
    `npu_fused_infer_attention_score.out` docstring, 参数说明, workspace) whose size is the
    aclnn's maximum over the sequence lengths (aclnnFusedInferAttentionScoreV3GetMaxWorkspace
    Size). The call is checked as FIA checks it; the stand-in cannot know the aclnn's size, so
    the workspace holds query.numel() elements and remembers the shapes it was sized for."""
    _checked(call)
    workspace = torch.zeros(call.query.numel(), dtype=call.query.dtype)
    attention_workspace.remember(workspace, call)
    return workspace


def _attention(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor]:
    """FIA, as torch_npu documents it: softmax(scale * q k^T + mask) v.

    TND: query `[T, N, D]`, key/value `[T_kv, N_kv, D]`, `actual_seq_lengths(_kv)` cumulative Python
    int lists without a leading 0 (last == T); bfloat16 with D 128 or 192 only (module docstring).
    Other layouts: float16/bfloat16 (float32 is not accepted by the real operator). Returns (out
    like query, LSE float32 `[T, N, 1]` when softmax_lse_flag, else an empty float32 `[0]`: what the
    wheel's C++ and meta kernels allocate, `_meta_registrations.py`,
    `npu_fused_infer_attention_score_forward`; the prose docs say `[1]`). `block_size` without a
    `block_table` is inert: page attention needs block_table (the FIA docstring, 约束说明, page
    attention场景, "使能必要条件"; 参数说明, block_size); vllm-ascend passes block_size=128 with no
    block table on a prefill without cached tokens (vllm-ascend 0.23.0.post1
    `AscendAttentionBackendImpl._get_fia_params`).
    """
    packed, causal = _checked(call)
    result = varlen_attention(packed, call.scale, causal)
    out = unpack_output(call.input_layout, result.out.to(call.query.dtype), packed)
    if not call.softmax_lse_flag:
        return out, torch.zeros(0, dtype=torch.float32)
    return out, unpack_rows(call.input_layout, result.lse, packed).unsqueeze(-1)


def _checked(call: BoundCall) -> tuple[Packed, bool]:
    """The call's documented contract checked; (the packed batch, whether causal)."""
    if call.block_table is not None:  # paged KV cache: `attention_paged`
        return checked_paged(call)
    handled = FIA_HANDLED | FIA_OUT_ARGUMENTS
    call.require_defaults(handled | ({"block_size"} if call.block_table is None else set()))
    _require_layout(FIA, call.input_layout, FIA_LAYOUTS, FIA_OTHER_LAYOUTS)
    tensors = {"query": call.query, "key": call.key, "value": call.value}
    require_dtype(FIA, "query", call.query, FLOAT16_TYPES)
    require_same_dtype(FIA, tensors)
    require_contiguous(FIA, tensors)
    require_choice(FIA, "inner_precise", call.inner_precise, (0, 1, 2, 3))
    names = ("num_heads", "num_key_value_heads")
    heads = (call.num_heads, _kv_heads(FIA, names, call.num_heads, call.num_key_value_heads))
    packed = pack(
        FIA, call.input_layout, (call.query, call.key, call.value), heads,
        (call.actual_seq_lengths, call.actual_seq_lengths_kv),
        ("actual_seq_lengths", "actual_seq_lengths_kv"),
    )
    _require_head_counts(FIA, packed, heads, names)
    if call.input_layout == "TND":
        _require_fia_tnd_domain(packed)
    _require_fia_sizes(packed)
    require_real_scale(FIA, "scale", call.scale, packed.query.shape[-1])
    causal = _causal(
        FIA, call, FIA_SPARSE_MODES, (torch.bool, torch.int8, torch.uint8),
        ((MASK_SIDE, MASK_SIDE), (1, MASK_SIDE, MASK_SIDE), (1, 1, MASK_SIDE, MASK_SIDE)),
    )
    require_visible_keys(FIA, packed, causal, without_keys=True)
    return packed, causal


@emulated_operator(FA)
def npu_fusion_attention(call: BoundCall) -> tuple:
    """FA, as torch_npu documents it: softmax(mask(scale * q k^T)) v, without dropout.

    Returns the documented 7-tuple (out like query, softmax_max, softmax_sum, softmax_out,
    seed, offset, numels). TND softmax statistics are `[T, N, 8]` float32 with
    softmax_layout="TND"; the default "" layout's arrangement is not documented, so the
    emulator returns NaN there. Other layouts: `[B, N, S, 8]`.
    """
    call.require_defaults(FA_HANDLED)
    layout = call.input_layout
    _require_layout(FA, layout, FA_LAYOUTS)
    _require_fa_options(call)
    tensors = {"query": call.query, "key": call.key, "value": call.value}
    require_dtype(FA, "query", call.query, FLOAT_TYPES)
    require_same_dtype(FA, tensors)
    if call.key.shape != call.value.shape:
        raise ValueError(f"{FA}: key and value must have the same shape")
    names = ("head_num", "key/value heads")
    heads = (call.head_num, _fa_kv_heads(call))
    packed = pack(
        FA, layout, (call.query, call.key, call.value), heads,
        (call.actual_seq_qlen, call.actual_seq_kvlen), ("actual_seq_qlen", "actual_seq_kvlen"),
    )
    _require_head_counts(FA, packed, heads, names)
    if layout == "TND":
        _require_tnd_size(FA, packed, FA_TND_MAX_BATCH, "actual_seq_qlen")
    head_dim = packed.query.shape[-1]
    if not 1 <= head_dim <= 768 or packed.key.shape[-1] != head_dim:
        raise ValueError(f"{FA}: query and key head_dim must match and lie in 1..768")
    require_real_scale(FA, "scale", call.scale, head_dim)
    mask_shapes = ((MASK_SIDE, MASK_SIDE),)
    causal = _causal(FA, call, FA_SPARSE_MODES, (torch.bool, torch.uint8), mask_shapes)
    require_visible_keys(FA, packed, causal)
    result = varlen_attention(packed, call.scale, causal)
    out = unpack_output(layout, result.out.to(call.query.dtype), packed)
    row_max = _softmax_stat(call, result.row_max, packed)
    row_sum = _softmax_stat(call, result.row_sum, packed)
    softmax_out = torch.empty(0, dtype=call.query.dtype)
    return out, row_max, row_sum, softmax_out, 0, 0, 0


def _softmax_stat(call: BoundCall, rows: torch.Tensor, packed: Packed) -> torch.Tensor:
    """A softmax statistic repeated 8 times on a last axis, as FA returns it."""
    unpacked = unpack_rows(call.input_layout, rows, packed)
    stat = unpacked.unsqueeze(-1).expand(*unpacked.shape, 8).contiguous()
    if call.input_layout == "TND" and call.softmax_layout != "TND":
        return torch.full_like(stat, float("nan"))
    return stat


def _fa_kv_heads(call: BoundCall) -> int:
    """FA has no kv-head argument: the count comes from key's head axis."""
    layout, key, head_num = call.input_layout, call.key, call.head_num
    if layout in ("TND", "BSND"):
        kv_heads = key.shape[-2] if key.dim() >= 2 else 0
    elif layout == "BNSD":
        kv_heads = key.shape[1] if key.dim() == 4 else 0
    else:
        head_dim = call.query.shape[-1] // head_num if head_num > 0 else 0
        kv_heads = key.shape[-1] // head_dim if head_dim else 0
    if not 1 <= head_num <= 256:
        raise ValueError(f"{FA}: argument 'head_num' must lie in 1..256, got {head_num}")
    if kv_heads == 0 or head_num % kv_heads:
        raise ValueError(f"{FA}: head_num={head_num} is not a multiple of key's {kv_heads} heads")
    return kv_heads


def _require_fa_options(call: BoundCall) -> None:
    """padding_mask unsupported, no dropout, documented inner_precise/softmax_layout values."""
    if call.padding_mask is not None:
        raise ValueError(f"{FA}: argument 'padding_mask' is not supported by the operator")
    if not 0.0 < call.keep_prob <= 1.0:
        raise ValueError(f"{FA}: argument 'keep_prob' must lie in (0, 1], got {call.keep_prob}")
    if call.keep_prob < 1.0:
        raise NotImplementedError(f"{FA}: dropout (keep_prob < 1) is not emulated")
    require_choice(FA, "inner_precise", call.inner_precise, (0, 1, 2))
    require_choice(FA, "softmax_layout", call.softmax_layout, ("", "TND"))
    if call.softmax_layout == "TND" and call.input_layout != "TND":
        raise ValueError(f"{FA}: softmax_layout='TND' is only valid with input_layout='TND'")
    for name in ("actual_seq_qlen", "actual_seq_kvlen"):
        lengths = call.arguments[name]
        if call.input_layout == "TND" and lengths and lengths[-1] == 0 and max(lengths) > 0:
            raise NotImplementedError(
                f"{FA}: trailing zeros in {name!r} (batches left out) are not emulated"
            )
