"""Emulated `npu_rms_norm` and `npu_add_rms_norm` (float32 math, output in the input dtype).

Input ranks: npu_rms_norm takes 2-8 dimensions ("输入shape支持2-8维", torch-npu 2.10.0.post4
`_op_plugin_docs.py`, the `npu_rms_norm` docstring); npu_add_rms_norm 1-8 ("支持1-8维张量",
op-plugin `docs/zh/custom_APIs/torch_npu/torch_npu-npu_add_rms_norm.md`, 参数说明, x1 and x2; the
wheel's docs have no entry for it).
"""

from __future__ import annotations

import torch

from ..runtime.checks import FLOAT_TYPES, require_dtype, require_ndim, require_same_dtype
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall

RMS_NORM = "npu_rms_norm"
ADD_RMS_NORM = "npu_add_rms_norm"
INPUT_RANKS = {RMS_NORM: range(2, 9), ADD_RMS_NORM: range(1, 9)}


def _require_norm_inputs(op: str, x_name: str, x: torch.Tensor, gamma: torch.Tensor) -> None:
    """x: INPUT_RANKS[op] dims, float16/bfloat16/float32; gamma: x's dtype and trailing shape."""
    require_ndim(op, x_name, x, INPUT_RANKS[op])
    require_dtype(op, x_name, x, FLOAT_TYPES)
    require_same_dtype(op, {x_name: x, "gamma": gamma})
    if gamma.dim() == 0 or gamma.dim() > x.dim() or gamma.shape != x.shape[x.dim() - gamma.dim():]:
        raise ValueError(
            f"{op}: argument 'gamma' shape {tuple(gamma.shape)} must equal the trailing "
            f"dimensions of {x_name} {tuple(x.shape)}"
        )


def _rms_norm(x32: torch.Tensor, gamma: torch.Tensor, epsilon: float):
    """(x * rstd * gamma, rstd) in float32; rstd keeps 1s over gamma's dimensions."""
    dims = tuple(range(x32.dim() - gamma.dim(), x32.dim()))
    rstd = torch.rsqrt(x32.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return x32 * rstd * gamma.float(), rstd


@emulated_operator(RMS_NORM)
def npu_rms_norm(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x / sqrt(mean(x^2) + epsilon) * gamma over gamma's dimensions.

    Returns (y like x, rstd float32 of shape x.shape[:-gamma.dim()] + (1,) * gamma.dim()).
    """
    x, gamma = call.input, call.gamma
    _require_norm_inputs(RMS_NORM, "input", x, gamma)
    y, rstd = _rms_norm(x.float(), gamma, call.epsilon)
    return y.to(x.dtype), rstd


@emulated_operator(ADD_RMS_NORM)
def npu_add_rms_norm(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x_sum = x1 + x2, y = rms_norm(x_sum) * gamma, with the sum kept in float32 for y.

    Returns (y like x1, rstd float32 as for npu_rms_norm, x_sum like x1).
    """
    x1, x2, gamma = call.x1, call.x2, call.gamma
    _require_norm_inputs(ADD_RMS_NORM, "x1", x1, gamma)
    require_same_dtype(ADD_RMS_NORM, {"x1": x1, "x2": x2})
    if x1.shape != x2.shape:
        raise ValueError(
            f"{ADD_RMS_NORM}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must have one shape"
        )
    x_sum = x1.float() + x2.float()
    y, rstd = _rms_norm(x_sum, gamma, call.epsilon)
    return y.to(x1.dtype), rstd, x_sum.to(x1.dtype)
