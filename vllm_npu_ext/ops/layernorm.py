"""RMSNorm and residual-add + RMSNorm: `npu_rms_norm` / `npu_add_rms_norm` and references.

Each op takes `npu`: the torch_npu module to run the fused operator, or
None for the PyTorch reference. Callers get `npu` from `vllm_npu_ext.ops.dispatch`.
"""

from __future__ import annotations

from types import ModuleType

import torch


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, npu: ModuleType | None = None
) -> torch.Tensor:
    """RMSNorm over the last dim. x `[..., H]`, weight `[H]` -> `[..., H]` in x's dtype."""
    if npu is not None:
        return npu.npu_rms_norm(x, weight, epsilon=eps)[0]
    return rms_norm_native(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    npu: ModuleType | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual), x + residual)`, the pair a pre-norm decoder layer needs."""
    if npu is not None:
        normed, _, summed = npu.npu_add_rms_norm(x, residual, weight, epsilon=eps)
        return normed, summed
    summed = x + residual
    return rms_norm_native(summed, weight, eps), summed


def rms_norm_native(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face Qwen3RMSNorm: statistics in float32, scale in the input dtype."""
    x32 = x.float()
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)
