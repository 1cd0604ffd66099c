"""Emulated int8 quantisation: `npu_dynamic_quant` and `npu_add_rms_norm_dynamic_quant`
(per-token symmetric), `npu_quantize` and `npu_add_rms_norm_quant` (static scales).

vllm-ascend 0.23 needs both in graph mode for every float16/bfloat16 model, quantised or not: its
norm-quant fusion pass registers the pattern add_rms_norm -> dynamic_quant and its fused replacement
(vllm-ascend 0.23.0.post1 `AddRMSNormDynamicQuantPattern`, registered for eps 1e-5 and 1e-6 in
`AddRMSNormQuantFusionPass.__init__`), and registering traces both on example `npu` tensors. Our
models never quantise, so the passes match nothing in them; without these operators a bf16 model did
not start in graph mode under the stand-in.

From torch-npu 2.10.0.post4 `_op_plugin_docs.py` (each operator's docstring there):
- npu_dynamic_quant: `scale = rowMax(|x * smooth_scales|) / DTYPE_MAX`,
  `y = round(x * smooth_scales / scale)`; x float16/bfloat16 with more than one dimension;
  smooth_scales 1-D of x's last size and x's dtype; scale float32 of x's shape without the last
  dimension. Emulated: int8 output (dst_type None or 1, torch.int8's enum), quant_mode "pertoken",
  no group_index (MoE).
- npu_add_rms_norm_dynamic_quant: x_out = x1 + x2, y = rms_norm(x_out) * gamma (+ beta), then up to
  two such quantisations (smooth_scale1, smooth_scale2); x1/x2 2-8 dimensions, float16/bfloat16;
  gamma, beta and the smooth scales 1-D of x1's last size and its dtype; the output_mask rules of
  its 约束说明 ("当outputMaskOptional不为空时..."). y2 and scale2 carry no meaning without
  smooth_scale2; y2 is then `[0]`, as the wheel's meta kernel gives it (the prose says `[1]`).
  Emulated: int8 output (y_dtype None or torch.int8).

vllm-ascend's static-quant patterns of the same pass (`AddRMSNormQuantPattern` and its SP and bias
variants, registered in `AddRMSNormQuantFusionPass.__init__` where its operator library loads,
`enable_custom_op()`) trace `torch.ops.vllm.quantize`, which calls `npu_quantize(x,
scale_reciprocal, offset, torch.qint8, -1, False)` (`vllm_ascend/ops/register_custom_ops.py`,
`_quantize_impl` and `_quantize_impl_fake`), and the replacement `npu_add_rms_norm_quant`:
- npu_quantize: div_mode True `y = input / scales + zero_points`, False
  `y = input * scales + zero_points`; scales (and zero_points, of scales' shape) 1-D of the
  quantised axis' size or 1, or input's rank with 1s outside that axis; with div_mode False the axis
  is the last one unless axis is -2. Emulated: int8 output (dtype torch.qint8 or its enum 12,
  torch.int8's 1; the wheel's meta kernel `npu_quantize_meta` gives int8 for both), the last axis
  (axis -1, or any axis > -2 with div_mode False, or the last of the input's with div_mode True);
  input float32/float16/bfloat16, scales float32/float16/bfloat16.
- npu_add_rms_norm_quant: x_out = x1 + x2, y = rms_norm(x_out) * gamma (+ beta), y1 = quantize(y,
  scales1, zero_points1) (division by scales1 when div_mode, as npu_quantize), y2 the same with
  scales2 where given; x1/x2 1-8 dimensions float16/bfloat16, gamma and beta of x1's dtype and its
  normalised shape, scales1/2 float32 or bfloat16 and zero_points1/2 int32 or bfloat16 of gamma's
  shape; axis -1 only (the meta kernel checks it, `npu_add_rms_norm_quant` in
  `_meta_registrations.py`, which gives y2 x1's shape: zeros here without scales2).

Computed in float32 (the normalised value is not rounded to x1's dtype before quantising);
ties round to even (`torch.round`; the docs say "round"); a row of zeros gets scale 0 and y 0.
"""

from __future__ import annotations

import torch

from ..runtime.checks import FLOAT16_TYPES, require_dtype, require_ndim
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall
from .norm import _rms_norm

DYNAMIC_QUANT = "npu_dynamic_quant"
ADD_RMS_NORM_DYNAMIC_QUANT = "npu_add_rms_norm_dynamic_quant"
INT8_MAX = 127.0
INT8_ENUM = 1  # torch_npu's dst_type enum value of torch.int8 (the meta kernel's default)
QINT8_ENUM = 12  # torch.qint8's ScalarType value: vllm-ascend passes torch.qint8 as `int dtype`
# (torch binds it as 12 before the kernel sees it; torch.int8 is 1, INT8_ENUM)
QUANTIZE = "npu_quantize"
ADD_RMS_NORM_QUANT = "npu_add_rms_norm_quant"
SCALE_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def _require_row_vector(op: str, name: str, tensor: torch.Tensor | None, x: torch.Tensor) -> None:
    if tensor is None:
        return
    if tensor.dim() != 1 or tensor.shape[0] != x.shape[-1] or tensor.dtype != x.dtype:
        raise ValueError(
            f"{op}: argument {name!r} must be 1-D of size {x.shape[-1]} and dtype {x.dtype}, got "
            f"{tuple(tensor.shape)} {tensor.dtype}"
        )


def _require_add_norm_inputs(op: str, call: BoundCall, ranks: range) -> None:
    """x1 of `ranks` dimensions, float16/bfloat16; x2 like x1; gamma and beta its row vectors."""
    x1, x2 = call.x1, call.x2
    require_ndim(op, "x1", x1, ranks)
    require_dtype(op, "x1", x1, FLOAT16_TYPES)
    if x2.shape != x1.shape or x2.dtype != x1.dtype:
        raise ValueError(f"{op}: x2 must have x1's shape {tuple(x1.shape)} and dtype {x1.dtype}")
    _require_row_vector(op, "gamma", call.gamma, x1)
    _require_row_vector(op, "beta", call.beta, x1)


def _add_norm(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor]:
    """x1 + x2 and rms_norm(x1 + x2) * gamma (+ beta), both in float32."""
    x_sum = call.x1.float() + call.x2.float()
    y, _ = _rms_norm(x_sum, call.gamma, call.epsilon)
    return x_sum, (y if call.beta is None else y + call.beta.float())


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
    op, x1 = ADD_RMS_NORM_DYNAMIC_QUANT, call.x1
    _require_add_norm_inputs(op, call, range(2, 9))
    for name in ("smooth_scale1", "smooth_scale2"):
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
    x_sum, y = _add_norm(call)
    y1, scale1 = quantize_rows(y, smooth1)
    if len(mask) == 2 and mask[1]:
        y2, scale2 = quantize_rows(y, smooth2)
    else:  # no meaning without smooth_scale2 (the meta kernel's shapes)
        y2, scale2 = y1.new_zeros((0,)), torch.zeros_like(scale1)
    return y1, y2, x_sum.to(x1.dtype), scale1, scale2


def _require_quant_vector(op: str, name: str, tensor, size: int, dtypes) -> None:
    """`tensor` (if given) holds one value per element of the quantised last axis, or one for
    all: shape [size] or [1], or input-rank with 1s elsewhere; dtype in `dtypes`."""
    if tensor is None:
        return
    if tensor.dtype not in dtypes:
        raise TypeError(f"{op}: argument {name!r} must be one of {list(dtypes)}, got "
                        f"{tensor.dtype}")
    if tensor.shape[-1:] not in ((size,), (1,)) or any(d != 1 for d in tensor.shape[:-1]):
        raise ValueError(f"{op}: argument {name!r} must hold {size} values (or 1) along the "
                         f"quantised last axis, got shape {tuple(tensor.shape)}")  # fmt: skip


def quantize_static(y32: torch.Tensor, scales, zero_points, div_mode: bool) -> torch.Tensor:
    """int8 codes of float32 `y32` with per-column `scales` and `zero_points` (saturating)."""
    scales32 = scales.float().reshape(-1)
    q = y32 / scales32 if div_mode else y32 * scales32
    if zero_points is not None:
        q = q + zero_points.float().reshape(-1)
    return torch.round(q).clamp(-128, 127).to(torch.int8)


@emulated_operator(QUANTIZE)
def npu_quantize(call: BoundCall) -> torch.Tensor:
    """int8 codes of input with static scales; see the module docstring."""
    op, x, scales, zero_points = QUANTIZE, call.input, call.scales, call.zero_points
    require_dtype(op, "input", x, SCALE_TYPES)
    if x.dim() < 1:
        raise ValueError(f"{op}: argument 'self' must have at least one dimension")
    if call.dtype not in (QINT8_ENUM, INT8_ENUM):  # torch passes a dtype as its value
        raise NotImplementedError(f"{op}: only int8 output (dtype torch.qint8) is emulated, got "
                                  f"{call.dtype!r}")  # fmt: skip
    last = call.axis in (-1, x.dim() - 1) or (not call.div_mode and call.axis > -2)
    if not last:
        raise NotImplementedError(
            f"{op}: only the last axis is emulated, got axis={call.axis} "
            f"(div_mode={call.div_mode}) for {x.dim()} dimensions"
        )
    _require_quant_vector(op, "scales", scales, x.shape[-1], SCALE_TYPES)
    if zero_points is not None and not call.div_mode and (
            zero_points.shape != scales.shape or zero_points.dtype != scales.dtype):  # fmt: skip
        raise ValueError(f"{op}: with div_mode False zero_points must have scales' shape and dtype")
    zero_types = SCALE_TYPES if not call.div_mode else (torch.int8, torch.uint8, torch.int32,
                                                          torch.bfloat16)  # fmt: skip
    _require_quant_vector(op, "zero_points", zero_points, x.shape[-1], zero_types)
    return quantize_static(x.float(), scales, zero_points, call.div_mode)


@emulated_operator(ADD_RMS_NORM_QUANT)
def npu_add_rms_norm_quant(call: BoundCall):
    """(y1 int8, y2 int8, x_out like x1); see the module docstring."""
    op, x1, gamma = ADD_RMS_NORM_QUANT, call.x1, call.gamma
    _require_add_norm_inputs(op, call, range(1, 9))
    if call.axis != -1:
        raise ValueError(f"{op}: axis must be -1, got {call.axis}")
    if call.dst_type not in (None, INT8_ENUM):
        raise NotImplementedError(f"{op}: only int8 output (dst_type None) is emulated")
    pairs = ((call.scales1, call.zero_points1, "1"), (call.scales2, call.zero_points2, "2"))
    for scales, zero_points, n in pairs:
        checks = ((f"scales{n}", scales, (torch.float32, torch.bfloat16)),
                  (f"zero_points{n}", zero_points, (torch.int32, torch.bfloat16)))  # fmt: skip
        for name, tensor, dtypes in checks:
            if tensor is not None and (tensor.shape != gamma.shape or tensor.dtype not in dtypes):
                raise ValueError(f"{op}: argument {name!r} must have gamma's shape "
                                 f"{tuple(gamma.shape)} and a dtype of {list(dtypes)}, got "
                                 f"{tuple(tensor.shape)} {tensor.dtype}")  # fmt: skip
    if call.scales2 is None and call.zero_points2 is not None:
        raise ValueError(f"{op}: zero_points2 needs scales2")
    x_sum, y = _add_norm(call)
    y1 = quantize_static(y, call.scales1, call.zero_points1, call.div_mode)
    y2 = (torch.zeros_like(y1) if call.scales2 is None
          else quantize_static(y, call.scales2, call.zero_points2, call.div_mode))  # fmt: skip
    return y1, y2, x_sum.to(x1.dtype)
