"""Emulated `npu_dynamic_quant` and `npu_add_rms_norm_dynamic_quant`: per-token symmetric int8.

vllm-ascend 0.23 needs both in graph mode for every float16/bfloat16 model, quantised or not:
its norm-quant fusion pass registers the pattern add_rms_norm -> dynamic_quant and its fused
replacement (`compilation/passes/norm_quant_fusion_pass.py:283-323`, registered for eps 1e-5
and 1e-6 at :714-716), and registering traces both on example `npu` tensors. Our models
never quantise, so the passes match nothing in them; without these operators a bf16 model did
not start in graph mode under the stand-in.

From torch-npu 2.10.0.post4 `_op_plugin_docs.py` (W:line):
- npu_dynamic_quant (W:4611-4650): `scale = rowMax(|x * smooth_scales|) / DTYPE_MAX`,
  `y = round(x * smooth_scales / scale)`; x float16/bfloat16 with more than one dimension;
  smooth_scales 1-D of x's last size and x's dtype; scale float32 of x's shape without the last
  dimension. Emulated: int8 output (dst_type None or 1, torch.int8's enum), quant_mode
  "pertoken", no group_index (MoE).
- npu_add_rms_norm_dynamic_quant (W:12138-12175): x_out = x1 + x2, y = rms_norm(x_out) * gamma
  (+ beta), then up to two such quantisations (smooth_scale1, smooth_scale2); x1/x2 2-8
  dimensions, float16/bfloat16; gamma, beta and the smooth scales 1-D of x1's last size and
  its dtype; the output_mask rules of W:12161-12164. y2 and scale2 carry no meaning without
  smooth_scale2; y2 is then `[0]`, as the wheel's meta kernel gives it (the prose says `[1]`).
  Emulated: int8 output (y_dtype None or torch.int8).

Computed in float32 (the normalised value is not rounded to x1's dtype before quantising);
ties round to even (`torch.round`; the docs say "round"); a row of zeros gets scale 0 and y 0.
"""

from __future__ import annotations

import torch

from ._checks import FLOAT16_TYPES, require_dtype, require_ndim
from ._runtime import emulated_operator
from ._schema import BoundCall
from .norm import _rms_norm

DYNAMIC_QUANT = "npu_dynamic_quant"
ADD_RMS_NORM_DYNAMIC_QUANT = "npu_add_rms_norm_dynamic_quant"
INT8_MAX = 127.0
INT8_ENUM = 1  # torch_npu's dst_type enum value of torch.int8 (the meta kernel's default)


def _require_row_vector(op: str, name: str, tensor: torch.Tensor | None, x: torch.Tensor) -> None:
    if tensor is None:
        return
    if tensor.dim() != 1 or tensor.shape[0] != x.shape[-1] or tensor.dtype != x.dtype:
        raise ValueError(
            f"{op}: argument {name!r} must be 1-D of size {x.shape[-1]} and dtype {x.dtype}, got "
            f"{tuple(tensor.shape)} {tensor.dtype}"
        )


def quantize_rows(
    x32: torch.Tensor, smooth: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 y, float32 scale) of per-row symmetric quantisation of float32 `x32`."""
    if smooth is not None:
        x32 = x32 * smooth.float()
    scale = x32.abs().amax(dim=-1) / INT8_MAX
    # A row of zeros divides by 1 instead of 0: its codes are 0 either way.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale)).unsqueeze(-1)
    return torch.round(x32 / safe).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


@emulated_operator(DYNAMIC_QUANT)
def npu_dynamic_quant(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor]:
    """(y int8 like x, scale float32 of x.shape[:-1]); see the module docstring."""
    x = call.input
    require_ndim(DYNAMIC_QUANT, "input", x, range(2, 9))
    require_dtype(DYNAMIC_QUANT, "input", x, FLOAT16_TYPES)
    _require_row_vector(DYNAMIC_QUANT, "smooth_scales", call.smooth_scales, x)
    if call.group_index is not None:
        raise NotImplementedError(f"{DYNAMIC_QUANT}: group_index (MoE) is not emulated")
    if call.dst_type not in (None, INT8_ENUM) or call.quant_mode != "pertoken":
        raise NotImplementedError(
            f"{DYNAMIC_QUANT}: only int8 per-token output is emulated, got dst_type="
            f"{call.dst_type!r}, quant_mode={call.quant_mode!r}"
        )
    if call.dst_type_max != 0.0:
        raise NotImplementedError(f"{DYNAMIC_QUANT}: dst_type_max is not emulated")
    return quantize_rows(x.float(), call.smooth_scales)


@emulated_operator(ADD_RMS_NORM_DYNAMIC_QUANT)
def npu_add_rms_norm_dynamic_quant(call: BoundCall):
    """(y1, y2, x_out, scale1, scale2); see the module docstring."""
    op, x1, x2, gamma = ADD_RMS_NORM_DYNAMIC_QUANT, call.x1, call.x2, call.gamma
    require_ndim(op, "x1", x1, range(2, 9))
    require_dtype(op, "x1", x1, FLOAT16_TYPES)
    if x2.shape != x1.shape or x2.dtype != x1.dtype:
        raise ValueError(f"{op}: x2 must have x1's shape {tuple(x1.shape)} and dtype {x1.dtype}")
    for name in ("gamma", "beta", "smooth_scale1", "smooth_scale2"):
        _require_row_vector(op, name, call.arguments[name], x1)
    if call.y_dtype not in (None, torch.int8):
        raise NotImplementedError(f"{op}: only int8 output (y_dtype None or int8) is emulated")
    mask, smooth1, smooth2 = list(call.output_mask or []), call.smooth_scale1, call.smooth_scale2
    if mask:
        if len(mask) != 2 or not any(mask):
            raise ValueError(f"{op}: output_mask must be empty or two flags, not both False")
        if (smooth1 is not None and not mask[0]) or (smooth2 is not None and not mask[1]):
            raise ValueError(f"{op}: a given smooth_scale needs its output_mask flag True")
    elif smooth2 is not None and smooth1 is None:
        raise ValueError(f"{op}: smooth_scale2 needs smooth_scale1 when output_mask is empty")
    x_sum = x1.float() + x2.float()
    y, _ = _rms_norm(x_sum, gamma, call.epsilon)
    if call.beta is not None:
        y = y + call.beta.float()
    y1, scale1 = quantize_rows(y, smooth1)
    if len(mask) == 2 and mask[1]:
        y2, scale2 = quantize_rows(y, smooth2)
    else:  # no meaning without smooth_scale2 (the meta kernel's shapes)
        y2, scale2 = y1.new_zeros((0,)), torch.zeros_like(scale1)
    return y1, y2, x_sum.to(x1.dtype), scale1, scale2
