"""Fake (meta) kernels of the emulated operators: output shapes and dtypes only.

Each follows the meta registration of the same operator in the pinned torch-npu 2.10.0.post4
wheel (`torch_npu/op_plugin/meta/_meta_registrations.py`, cited as M `function`), which is what
`torch.compile` sees on a real NPU. Only the non-quantised cases the emulator implements are
covered in detail; quantised dtypes follow M's dtype rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .schema import BoundCall, bind_overload

# input_layout -> (query layout, attention_out layout, query rank):
# M `get_query_and_attention_out_layout`.
FIA_LAYOUTS = {
    "BSH": ("BSH", "BSH", 3), "BSND": ("BSND", "BSND", 4), "BNSD": ("BNSD", "BNSD", 4),
    "TND": ("TND", "TND", 3), "NTD": ("NTD", "NTD", 3), "BNSD_BSND": ("BNSD", "BSND", 4),
    "BSH_BNSD": ("BSH", "BNSD", 3), "BSND_BNSD": ("BSND", "BNSD", 4),
    "NTD_TND": ("NTD", "TND", 3), "BSH_NBSD": ("BSH", "NBSD", 3),
    "BSND_NBSD": ("BSND", "NBSD", 4), "BNSD_NBSD": ("BNSD", "NBSD", 4),
    "TND_NTD": ("TND", "NTD", 3), "NSD": ("NSD", "NSD", 3),
}  # fmt: skip
TND_LIKE = ("TND", "NTD", "TND_NTD", "NTD_TND")
INT4_IN_INT32 = 8


def _rstd_shape(x: torch.Tensor, gamma: torch.Tensor) -> list[int]:
    """x's leading dims, 1 over gamma's (M `npu_rms_norm_meta`)."""
    kept = x.dim() - gamma.dim()
    return [x.size(i) if i < kept else 1 for i in range(x.dim())]


def rms_norm(call: BoundCall):
    x = call.input
    rstd = x.new_empty(_rstd_shape(x, call.gamma), dtype=torch.float32)
    return torch.empty_like(x), rstd  # M `npu_rms_norm_meta`


def add_rms_norm(call: BoundCall):
    x1 = call.x1
    rstd = x1.new_empty(_rstd_shape(x1, call.gamma), dtype=torch.float32)
    return torch.empty_like(x1), rstd, torch.empty_like(x1)  # M `npu_add_rms_norm_meta`


def rotary_mul(call: BoundCall):
    return torch.empty_like(call.input)  # M `npu_rotary_mul_meta`


def swiglu(call: BoundCall):
    x = call.input
    size = list(x.shape)
    size[call.dim] = size[call.dim] // 2  # M's floor(size / 2), kept integer for symbolic sizes
    return x.new_empty(size)  # M `npu_swiglu_meta`


def linear(call: BoundCall):
    return call.input.new_empty((call.input.size(0), call.weight.size(0)))  # M `npu_linear_meta`


def grouped_matmul(call: BoundCall):
    """split_item 0: one `[*x_i.shape[:-1], N_i]` per x; 2/3: one `[sum M, N]`
    (M `npu_grouped_matmul_meta`)."""
    x, weight = call.x, call.weight
    single_weight = len(weight) == 1 and weight[0].dim() == 3
    n = weight[0].shape[2] if single_weight else weight[0].shape[1]
    dtype = call.output_dtype if isinstance(call.output_dtype, torch.dtype) else None
    if call.output_dtype is not None and dtype is None:
        raise NotImplementedError("npu_grouped_matmul: integer output_dtype codes are not emulated")
    dtype = dtype or x[0].dtype
    if call.split_item == 0:
        outputs = []
        for index, x_i in enumerate(x):
            width = n if single_weight else weight[index].shape[1]
            width *= INT4_IN_INT32 if weight[index].dtype == torch.int32 else 1
            outputs.append(x_i.new_empty((*x_i.shape[:-1], width), dtype=dtype))
        return outputs
    if call.split_item in (2, 3) and call.group_type != 2:
        return [x[0].new_empty((sum(t.shape[0] for t in x), n), dtype=dtype)]
    raise NotImplementedError(
        f"npu_grouped_matmul: split_item={call.split_item}, group_type={call.group_type} "
        "has a data-dependent output shape; not emulated under tracing"
    )


def _b_s_n_d(query: torch.Tensor, layout: str, num_heads: int) -> tuple[int, int, int, int]:
    """(B, S, N, D) of a non-TND query (M `get_query_b_s_n_d`)."""
    if layout == "BSH":
        return query.size(0), query.size(1), num_heads, query.size(2) // num_heads
    if layout == "BSND":
        return query.size(0), query.size(1), query.size(2), query.size(3)
    if layout == "BNSD":
        return query.size(0), query.size(2), query.size(1), query.size(3)
    return 1, query.size(1), query.size(0), query.size(2)  # NSD


def _fia_value_d(call: BoundCall, query_layout: str, kv_heads: int) -> int:
    """The value head size (M `get_value_d`), x8 for int4 packed in int32
    (M `get_change_d_scale`)."""
    value = call.value
    if call.block_table is not None:
        value_d = {3: lambda: value.size(2) // kv_heads, 4: lambda: value.size(3),
                   5: lambda: value.size(2) * value.size(4)}[value.dim()]()  # fmt: skip
    elif query_layout == "BSH":
        value_d = value.size(2) // kv_heads
    elif query_layout in ("BNSD", "BSND"):
        value_d = value.size(3)
    else:
        value_d = value.size(2)
    return value_d * (INT4_IN_INT32 if value.dtype == torch.int32 else 1)


def _fia_out_shape(call: BoundCall, query_layout: str, out_layout: str, value_d: int):
    """attention_out's shape (M `infer_attention_out_shape`); D falls back to query's when either
    is 0."""
    query = call.query
    if query_layout in ("TND", "NTD"):
        t, n, d = (query.size(0), query.size(1), query.size(2)) if query_layout == "TND" else (
            query.size(1), query.size(0), query.size(2))
        out_d = d if value_d == 0 or d == 0 else value_d
        return [t, n, out_d] if out_layout == "TND" else [n, t, out_d]
    b, s, n, d = _b_s_n_d(query, query_layout, call.num_heads)
    out_d = d if value_d == 0 or d == 0 else value_d
    if out_layout == "BSH":
        out_h = n * value_d
        return [b, s, query.size(2) if out_h == 0 or query.size(2) == 0 else out_h]
    return {"BSND": [b, s, n, out_d], "BNSD": [b, n, s, out_d], "NBSD": [n, b, s, out_d],
            "NSD": [n, s, out_d]}[out_layout]  # fmt: skip


def fused_infer_attention_score(call: BoundCall):
    """(attention_out, softmax_lse): lse `[0]` float32 unless softmax_lse_flag
    (M `npu_fused_infer_attention_score_forward`)."""
    query = call.query
    if call.input_layout not in FIA_LAYOUTS:
        raise ValueError(f"npu_fused_infer_attention_score: layout {call.input_layout!r}")
    query_layout, out_layout, rank = FIA_LAYOUTS[call.input_layout]
    if query.dim() != rank:
        raise ValueError(f"Layout {query_layout}, queryDims({query.dim()}) must be {rank}")
    kv_heads = call.num_key_value_heads or call.num_heads
    value_d = _fia_value_d(call, query_layout, kv_heads)
    shape = _fia_out_shape(call, query_layout, out_layout, value_d)
    if call.quant_scale2 is not None:
        dtype = torch.int8
    elif query.dtype == torch.int8:
        dtype = call.query_rope.dtype if call.query_rope is not None else torch.half
    else:
        dtype = query.dtype
    out = query.new_empty(shape, dtype=dtype)
    if not call.softmax_lse_flag:
        return out, query.new_empty([0], dtype=torch.float32)
    if call.input_layout in TND_LIKE:
        t, n = (query.size(0), query.size(1)) if query_layout == "TND" else (
            query.size(1), query.size(0))
        return out, query.new_empty([t, n, 1], dtype=torch.float32)
    b, s, n, _ = _b_s_n_d(query, query_layout, call.num_heads)
    return out, query.new_empty([b, n, s, 1], dtype=torch.float32)


def fusion_attention(call: BoundCall):
    """(out like query, softmax_max, softmax_sum, softmax_out [0], 0, 0, 0)
    (M `npu_fusion_attention_forward`)."""
    query, heads, layout = call.query, call.head_num, call.input_layout
    batch, seq = query.size(0), query.size(2) if query.dim() > 2 else 0
    if layout == "BSH":
        seq = query.size(1)
    elif layout == "SBH":
        batch, seq = query.size(1), query.size(0)
    elif layout == "BSND":
        seq = query.size(1)
    stat_shape = [batch, heads, 8] if layout == "TND" else [batch, heads, seq, 8]
    softmax_max = query.new_empty(stat_shape, dtype=torch.float32)
    softmax_sum = query.new_empty(stat_shape, dtype=torch.float32)
    return torch.empty_like(query), softmax_max, softmax_sum, query.new_empty([0]), 0, 0, 0


def attention_update(call: BoundCall):
    """(out like local_out[0], lse like lse[0]) for every update_type
    (M `npu_attention_update_meta`)."""
    return torch.empty_like(call.local_out[0]), torch.empty_like(call.lse[0])


def format_cast(call: BoundCall):
    """Like self: a format cast keeps the logical shape and dtype (no meta registration in M;
    the wheel's `_op_plugin_docs.py`, the `npu_format_cast` docstring)."""
    return torch.empty_like(call.input, memory_format=torch.contiguous_format)


def dynamic_quant(call: BoundCall):
    """(y int8 like input, scale float32 of input.shape[:-1]) for int8 per-token
    (M `npu_dynamic_quant`)."""
    x = call.input
    return torch.empty_like(x, dtype=torch.int8), x.new_empty(x.shape[:-1], dtype=torch.float32)


def add_rms_norm_dynamic_quant(call: BoundCall):
    """(y1, y2, x_out, scale1, scale2); y2 `[0]` unless output_mask[1]
    (M `npu_add_rms_norm_dynamic_quant_meta`)."""
    x1, mask = call.x1, call.output_mask
    y2_shape = x1.shape if mask is None or (len(mask) > 1 and mask[1]) else (0,)
    scale = x1.new_empty(x1.shape[:-1], dtype=torch.float32)
    return (torch.empty_like(x1, dtype=torch.int8), x1.new_empty(y2_shape, dtype=torch.int8),
            torch.empty_like(x1), scale, torch.empty_like(scale))  # fmt: skip


def quantize(call: BoundCall):
    """int8 like self for torch.qint8 / int8 (M `npu_quantize_meta`)."""
    return torch.empty_like(call.input, dtype=torch.int8)


def add_rms_norm_quant(call: BoundCall):
    """(y1 int8, y2 int8, x_out like x1), all of x1's shape (M `npu_add_rms_norm_quant`)."""
    x1 = call.x1
    return torch.empty_like(x1, dtype=torch.int8), torch.empty_like(x1, dtype=torch.int8), \
        torch.empty_like(x1)


def mrope(call: BoundCall):
    """New tensors like query and key (M `npu_mrope_meta`)."""
    return torch.empty_like(call.query), torch.empty_like(call.key)


def _fake(op: str, overload: str, shapes: Callable[[BoundCall], Any]) -> Callable[..., Any]:
    def fake(*args: Any, **kwargs: Any) -> Any:
        return shapes(bind_overload(op, overload, args, kwargs))

    fake.__name__ = f"{op}_fake"
    return fake


# "op" or "op.overload" -> its fake kernel. FIA's `.out` and its max-workspace operator have
# no meta registration in M (neither can be traced on the device either).
FAKE_KERNELS: dict[str, Callable[..., Any]] = {
    "npu_rms_norm": _fake("npu_rms_norm", "", rms_norm),
    "npu_add_rms_norm": _fake("npu_add_rms_norm", "", add_rms_norm),
    "npu_rotary_mul": _fake("npu_rotary_mul", "", rotary_mul),
    "npu_swiglu": _fake("npu_swiglu", "", swiglu),
    "npu_linear": _fake("npu_linear", "", linear),
    "npu_grouped_matmul": _fake("npu_grouped_matmul", "", grouped_matmul),
    "npu_grouped_matmul.List": _fake("npu_grouped_matmul", "List", grouped_matmul),
    "npu_fused_infer_attention_score": _fake(
        "npu_fused_infer_attention_score", "", fused_infer_attention_score
    ),
    "npu_fusion_attention": _fake("npu_fusion_attention", "", fusion_attention),
    "npu_attention_update": _fake("npu_attention_update", "", attention_update),
    "npu_format_cast": _fake("npu_format_cast", "", format_cast),
    "npu_dynamic_quant": _fake("npu_dynamic_quant", "", dynamic_quant),
    "npu_add_rms_norm_dynamic_quant": _fake(
        "npu_add_rms_norm_dynamic_quant", "", add_rms_norm_dynamic_quant
    ),
    "npu_quantize": _fake("npu_quantize", "", quantize),
    "npu_add_rms_norm_quant": _fake("npu_add_rms_norm_quant", "", add_rms_norm_quant),
    "npu_mrope": _fake("npu_mrope", "", mrope),
}
