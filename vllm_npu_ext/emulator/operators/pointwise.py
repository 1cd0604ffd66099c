"""Emulated `npu_rotary_mul` and `npu_swiglu` (float32 math, output in the input dtype).

npu_swiglu rejects non-contiguous input: "不支持非连续的Tensor" (op-plugin
`docs/zh/custom_APIs/torch_npu/（beta）torch_npu-npu_swiglu.md`, 参数说明, input; the wheel's docs,
the `npu_swiglu` docstring of `_op_plugin_docs.py`, say nothing on contiguity).
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
)
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall

ROTARY_MUL = "npu_rotary_mul"
SWIGLU = "npu_swiglu"
ROTARY_MAX_HEAD_DIM = 896
# Which of cos/sin's first three axes may be full-size (1 = full, 0 = broadcast 1): the
# documented 11SD/B1SD/BNSD (BNSD input), 1S1D/BS1D/BSND (BSND) and S11D/SB1D/SBND (SBND).
ROTARY_BROADCASTS = {(0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 0), (1, 1, 0), (1, 0, 0)}


def _require_rotary_table(name: str, table: torch.Tensor, x: torch.Tensor) -> None:
    """cos/sin: 4-D, last axis D, a documented broadcast of x's first three axes, in [-1, 1]."""
    require_ndim(ROTARY_MUL, name, table, (4,))
    require_dtype(ROTARY_MUL, name, table, FLOAT_TYPES)
    allowed = any(
        all(table.shape[axis] == (x.shape[axis] if full else 1) for axis, full in enumerate(p))
        for p in ROTARY_BROADCASTS
    )
    if table.shape[-1] != x.shape[-1] or not allowed:
        raise ValueError(
            f"{ROTARY_MUL}: argument {name!r} shape {tuple(table.shape)} is not a documented "
            f"broadcast of input {tuple(x.shape)} (e.g. 1S1D for BSND input, 11SD for BNSD)"
        )
    if table.numel() and table.abs().max().item() > 1.0:
        raise ValueError(f"{ROTARY_MUL}: argument {name!r} values must lie in [-1, 1] (cos/sin)")


def _rotated(x32: torch.Tensor, mode: str, rotate: torch.Tensor | None) -> torch.Tensor:
    """rotate_half(x) for 'half', the pairwise rotation for 'interleave', or x @ rotate."""
    if rotate is not None:
        return x32 @ rotate.float()
    if mode == "half":
        first, second = x32.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)
    even, odd = x32[..., ::2], x32[..., 1::2]
    return torch.stack((-odd, even), dim=-1).flatten(-2)


@emulated_operator(ROTARY_MUL)
def npu_rotary_mul(call: BoundCall) -> torch.Tensor:
    """out = r1 * x + r2 * rotated(x), x 4-D `[B, S, N, D]`-like, D even and < 896.

    r1/r2 (cos/sin) are cast to x's dtype first, as the operator does for mixed dtypes.
    A TND tensor is passed as `(1, T, N, D)` with cos/sin `(1, T, 1, D)`.
    """
    x, mode, rotate = call.input, call.rotary_mode, call.rotate
    require_ndim(ROTARY_MUL, "input", x, (4,))
    require_dtype(ROTARY_MUL, "input", x, FLOAT_TYPES)
    require_choice(ROTARY_MUL, "rotary_mode", mode, ("half", "interleave"))
    head_dim = x.shape[-1]
    if head_dim % 2 or head_dim >= ROTARY_MAX_HEAD_DIM:
        raise ValueError(f"{ROTARY_MUL}: head_dim {head_dim} must be even and below 896")
    for name in ("r1", "r2"):
        _require_rotary_table(name, call.arguments[name], x)
    if rotate is not None:
        require_dtype(ROTARY_MUL, "rotate", rotate, FLOAT_TYPES)
        if tuple(rotate.shape) != (head_dim, head_dim):
            raise ValueError(f"{ROTARY_MUL}: argument 'rotate' must be [{head_dim}, {head_dim}]")
    cos, sin = (call.arguments[name].to(x.dtype).float() for name in ("r1", "r2"))
    x32 = x.float()
    return (cos * x32 + sin * _rotated(x32, mode, rotate)).to(x.dtype)


@emulated_operator(SWIGLU)
def npu_swiglu(call: BoundCall) -> torch.Tensor:
    """silu(a) * b with (a, b) the two halves of x along `dim` (which must be even-sized)."""
    x, dim = call.input, call.dim
    require_ndim(SWIGLU, "input", x, range(1, 9))
    require_dtype(SWIGLU, "input", x, FLOAT_TYPES)
    require_contiguous(SWIGLU, {"input": x})
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"{SWIGLU}: argument 'dim' {dim} is out of range for {x.dim()}-D input")
    if x.shape[dim] % 2:
        raise ValueError(
            f"{SWIGLU}: input size {x.shape[dim]} along dim {dim} must be even (gate and up halves)"
        )
    gate, up = x.float().chunk(2, dim=dim)
    return (F.silu(gate) * up).to(x.dtype)
