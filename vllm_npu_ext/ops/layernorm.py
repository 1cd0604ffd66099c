"""RMSNorm and residual-add + RMSNorm: `npu_rms_norm` / `npu_add_rms_norm` and references.

Each op takes `npu`: the torch_npu module to run the fused operator, or None for the PyTorch
reference (callers get it from `vllm_npu_ext.ops.dispatch`), and an optional `bias` `[H]`
added to the normalised output: vllm-ascend's RMSNorm carries one for quantised checkpoints
whose description lists norm biases and adds it once loaded (vllm-ascend 0.23.0.post1
`AscendRMSNorm.__init__` and `forward_oot`); `norm_bias` says which bias a norm module has.
"""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn


def norm_bias(norm: nn.Module) -> torch.Tensor | None:
    """A norm module's bias where it is loaded (vllm-ascend's RMSNorm: `bias_loaded`; an
    unloaded one is zeros), else None (vLLM's RMSNorm has none)."""
    bias = getattr(norm, "bias", None)
    return bias if bias is not None and getattr(norm, "bias_loaded", True) else None


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    npu: ModuleType | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim (+ bias). x `[..., H]`, weight `[H]` -> `[..., H]` in x's dtype."""
    if npu is not None:
        return _add_bias(npu.npu_rms_norm(x, weight, epsilon=eps)[0], bias)
    return rms_norm_native(x, weight, eps, bias)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    npu: ModuleType | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rms_norm(x + residual) (+ bias), x + residual)`: what a pre-norm decoder layer needs."""
    if npu is not None:
        normed, _, summed = npu.npu_add_rms_norm(x, residual, weight, epsilon=eps)
        return _add_bias(normed, bias), summed
    summed = x + residual
    return rms_norm_native(summed, weight, eps, bias), summed


def rms_norm_native(
    x: torch.Tensor, weight: torch.Tensor, eps: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Hugging Face Qwen3RMSNorm: statistics in float32, scale in the input dtype (+ bias)."""
    x32 = x.float()
    variance = x32.pow(2).mean(-1, keepdim=True)
    return _add_bias(weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype), bias)


def _add_bias(out: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    # In place: `out` is the operator's fresh result.
    return out if bias is None else out.add_(bias)
