"""SwiGLU on a merged gate/up projection: `npu_swiglu` and its reference."""

from __future__ import annotations

from types import ModuleType

import torch
import torch.nn.functional as F


def swiglu(x: torch.Tensor, npu: ModuleType | None = None) -> torch.Tensor:
    """x `[T, 2I]` (gate || up) -> `silu(gate) * up` `[T, I]`."""
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim must be even (gate || up), got {x.shape[-1]}")
    if npu is not None:
        return npu.npu_swiglu(x, dim=-1)
    return swiglu_native(x)


def swiglu_native(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
