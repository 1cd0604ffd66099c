"""Emulated `npu_grouped_matmul` (non-quantised) and `npu_linear` (float32 accumulation).

npu_grouped_matmul takes float32 only with a single x, weight and y tensor: the non-quantised
column of its Tensor group_list table reads "torch.float32(仅x/weight/y均为单张量)"
(torch-npu 2.10.0.post4 `_op_plugin_docs.py`, the `npu_grouped_matmul` docstring, 约束说明, 表1
数据类型约束场景), and aclnnGroupedMatmulV4's doc says the
same ("仅x、weight、y都为单tensor场景支持"). With several x/weight tensors (one y each) a float32
call is rejected with TypeError, like any other dtype the operator does not take.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.checks import (
    FLOAT_TYPES,
    require_choice,
    require_contiguous,
    require_dtype,
    require_ndim,
    require_same_dtype,
)
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall

GROUPED_MATMUL = "npu_grouped_matmul"
LINEAR = "npu_linear"
MAX_LIST_LENGTH = 128
MAX_GROUPS = 1024
INNER_LIMIT = 65536
# x dtype -> the bias dtype the operator's non-quantised table requires.
GMM_BIAS_DTYPE = {
    torch.float16: torch.float16, torch.bfloat16: torch.float32, torch.float32: torch.float32,
}
GMM_HANDLED = {
    "x", "weight", "bias", "group_list", "split_item", "group_type", "group_list_type",
    "act_type", "tuning_config", "output_dtype",
}


def _require_gmm_inputs(call: BoundCall) -> None:
    """Lists of 1..128 float tensors of one dtype, contiguous x, documented options only."""
    x, weight = call.x, call.weight
    for name, tensors in (("x", x), ("weight", weight)):
        if not 1 <= len(tensors) <= MAX_LIST_LENGTH:
            raise ValueError(f"{GROUPED_MATMUL}: argument {name!r} must hold 1..128 tensors")
    require_dtype(GROUPED_MATMUL, "x[0]", x[0], FLOAT_TYPES)
    if x[0].dtype == torch.float32 and (len(x) > 1 or len(weight) > 1):
        raise TypeError(
            f"{GROUPED_MATMUL}: float32 is supported only with a single x, weight and y tensor "
            f"(torch-npu docs); got {len(x)} x and {len(weight)} weight tensors"
        )
    named_x = {f"x[{i}]": t for i, t in enumerate(x)}
    named_weight = {f"weight[{i}]": t for i, t in enumerate(weight)}
    require_same_dtype(GROUPED_MATMUL, {**named_x, **named_weight})
    require_contiguous(GROUPED_MATMUL, named_x)
    transposed = {not w.is_contiguous() and w.dim() == 2 and w.t().is_contiguous() for w in weight}
    if len(transposed) > 1:
        raise ValueError(f"{GROUPED_MATMUL}: weights must be all transposed views or none")
    if call.act_type != 0:
        raise NotImplementedError(f"{GROUPED_MATMUL}: act_type={call.act_type} is not emulated")
    if call.output_dtype not in (None, x[0].dtype):
        raise ValueError(
            f"{GROUPED_MATMUL}: argument 'output_dtype' must be None or x's dtype {x[0].dtype} "
            "without quantisation"
        )


def _require_pair(index: int, x: torch.Tensor, weight: torch.Tensor) -> None:
    """weight[index] must be laid out [K, N] with K == x's last axis."""
    require_ndim(GROUPED_MATMUL, f"weight[{index}]", weight, (2,))
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"{GROUPED_MATMUL}: weight[{index}] has shape {tuple(weight.shape)} but x has K = "
            f"{x.shape[-1]}; weights must be pre-transposed [K, N] (F.linear's weight is [N, K])"
        )
    if x.shape[-1] >= INNER_LIMIT or weight.shape[-1] >= INNER_LIMIT:
        raise ValueError(f"{GROUPED_MATMUL}: group {index}: K and N must be below {INNER_LIMIT}")


def _biases(call: BoundCall, out_features: list[int]) -> list[torch.Tensor | None]:
    """One 1-D `[N_i]` bias per group (or None), in the dtype the operator requires."""
    if call.bias is None:
        return [None] * len(out_features)
    if len(call.bias) != len(out_features):
        raise ValueError(f"{GROUPED_MATMUL}: bias must hold one tensor per group")
    dtype = GMM_BIAS_DTYPE[call.x[0].dtype]
    for index, (bias, size) in enumerate(zip(call.bias, out_features, strict=True)):
        require_dtype(GROUPED_MATMUL, f"bias[{index}]", bias, (dtype,))
        if tuple(bias.shape) != (size,):
            raise ValueError(f"{GROUPED_MATMUL}: bias[{index}] must have shape ({size},)")
    return list(call.bias)


def _matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight (+ bias) with float32 accumulation, in x's dtype."""
    y = x.float() @ weight.float()
    return (y if bias is None else y + bias.float()).to(x.dtype)


def _group_sizes(call: BoundCall, rows: int, groups: int) -> list[int]:
    """Rows per group from the int64 `group_list` tensor (cumulative or counts)."""
    group_list = call.group_list
    if group_list is None:
        raise ValueError(f"{GROUPED_MATMUL}: group_type=0 with a single x needs group_list")
    require_dtype(GROUPED_MATMUL, "group_list", group_list, (torch.int64,))
    require_choice(GROUPED_MATMUL, "group_list_type", call.group_list_type, (0, 1))
    values = group_list.tolist() if group_list.dim() == 1 else None
    if values is None or len(values) != groups or groups > MAX_GROUPS:
        raise ValueError(f"{GROUPED_MATMUL}: group_list must be 1-D with one entry per group")
    sizes = values if call.group_list_type == 1 else [
        b - a for a, b in zip([0, *values[:-1]], values, strict=True)]
    if min(sizes) < 0 or sum(sizes) != rows:
        raise ValueError(
            f"{GROUPED_MATMUL}: group_list {values} (group_list_type={call.group_list_type}) "
            f"must split x's {rows} rows into non-negative groups"
        )
    return sizes


def _per_group(call: BoundCall) -> list[torch.Tensor]:
    """group_type=-1: y_i = x_i @ weight_i (+ bias_i), one output per group."""
    x, weight = call.x, call.weight
    require_choice(GROUPED_MATMUL, "split_item", call.split_item, (0, 1))
    if call.group_list is not None:
        raise ValueError(f"{GROUPED_MATMUL}: group_type=-1 requires group_list=None")
    if len(x) != len(weight):
        raise ValueError(f"{GROUPED_MATMUL}: x and weight must hold the same number of tensors")
    if {t.dim() for t in x} - set(range(2, 7)) or len({t.dim() for t in x}) > 1:
        raise ValueError(f"{GROUPED_MATMUL}: x tensors must share one rank in 2..6")
    for index, (x_i, w_i) in enumerate(zip(x, weight, strict=True)):
        _require_pair(index, x_i, w_i)
    biases = _biases(call, [w.shape[1] for w in weight])
    return [_matmul(*group) for group in zip(x, weight, biases, strict=True)]


def _split_m(call: BoundCall) -> list[torch.Tensor]:
    """group_type=0: groups along M, results stacked into one `[M, N]` tensor."""
    x, weight = call.x, call.weight
    require_choice(GROUPED_MATMUL, "split_item", call.split_item, (2, 3))
    for index, x_i in enumerate(x):
        require_ndim(GROUPED_MATMUL, f"x[{index}]", x_i, (2,))
    weights = list(weight[0].unbind(0)) if len(weight) == 1 and weight[0].dim() == 3 else weight
    if len(x) == 1:
        chunks = x[0].split(_group_sizes(call, x[0].shape[0], len(weights)))
    elif len(x) == len(weights):
        if call.group_list is not None:
            _group_sizes(call, sum(t.shape[0] for t in x), len(weights))
        chunks = x
    else:
        raise ValueError(f"{GROUPED_MATMUL}: x must hold one tensor or one per weight")
    for index, (x_i, w_i) in enumerate(zip(chunks, weights, strict=True)):
        _require_pair(index, x_i, w_i)
    if len({w.shape[1] for w in weights}) > 1:
        raise ValueError(f"{GROUPED_MATMUL}: every weight must have the same N with group_type=0")
    biases = _biases(call, [w.shape[1] for w in weights])
    return [torch.cat([_matmul(*group) for group in zip(chunks, weights, biases, strict=True)])]


@emulated_operator(GROUPED_MATMUL)
def npu_grouped_matmul(call: BoundCall) -> list[torch.Tensor]:
    """Non-quantised grouped matmul: y_i = x_i @ weight_i + bias_i with weights `[K, N]`.

    group_type=-1 (split_item 0/1): lists of x `[..., K]` and weight `[K, N]`, one output per
    group. group_type=0 (split_item 2/3): groups along M of one `[M, K]` x (group_list int64
    tensor, cumulative or counts) or of several x; one stacked `[M, N]` output. The List[int]
    group_list overload, quantisation and activations raise NotImplementedError.
    """
    call.require_defaults(GMM_HANDLED)
    _require_gmm_inputs(call)
    if call.group_type == -1:
        return _per_group(call)
    if call.group_type == 0:
        return _split_m(call)
    raise ValueError(
        f"{GROUPED_MATMUL}: group_type must be -1 or 0 on Atlas A2/A3 (with a tensor or no "
        f"group_list), got {call.group_type}"
    )


@emulated_operator(LINEAR)
def npu_linear(call: BoundCall) -> torch.Tensor:
    """F.linear for 2-D input `[M, K]` and weight `[N, K]` (+ bias `[N]`), float32 accumulation."""
    x, weight, bias = call.input, call.weight, call.bias
    tensors = {"input": x, "weight": weight, **({"bias": bias} if bias is not None else {})}
    if x.dtype in (torch.int8, torch.int32):
        raise NotImplementedError(f"{LINEAR}: integer inputs are not emulated")
    require_dtype(LINEAR, "input", x, FLOAT_TYPES)
    require_same_dtype(LINEAR, tensors)
    require_ndim(LINEAR, "input", x, (2,))
    require_ndim(LINEAR, "weight", weight, (2,))
    if weight.shape[1] != x.shape[1]:
        raise ValueError(
            f"{LINEAR}: weight {tuple(weight.shape)} must be [N, K] with K = input's "
            f"{x.shape[1]} (F.linear layout)"
        )
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"{LINEAR}: bias must have shape ({weight.shape[0]},)")
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
