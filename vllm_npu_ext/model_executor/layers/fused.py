"""NPU paths for vLLM's own norm and linear modules.

The model keeps vLLM's `RMSNorm` and parallel linear modules (same parameter names, same
weight loaders, tensor parallelism, and on Ascend whatever vllm-ascend substitutes for them).
With `step is None` these functions simply call the module (vLLM's kernel for the platform);
with an `NpuStep` they run the torch_npu operator on the module's parameters, or the PyTorch
reference when that fusion is switched off. A norm's bias, where vllm-ascend's RMSNorm carries
one, is added as `ops.layernorm` says.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import tensor_model_parallel_all_reduce
from vllm.model_executor.layers.linear import (
    LinearBase,
    RowParallelLinear,
    UnquantizedLinearMethod,
)

from vllm_npu_ext.model_executor.layers.npu_step import NpuStep
from vllm_npu_ext.ops import layernorm, linear


def rms_norm(norm: nn.Module, x: torch.Tensor, step: NpuStep | None) -> torch.Tensor:
    if step is None:
        return norm(x)
    return layernorm.rms_norm(
        x, norm.weight, norm.variance_epsilon, npu=step.ops("rms_norm"),
        bias=layernorm.norm_bias(norm),
    )  # fmt: skip


def add_rms_norm(
    norm: nn.Module, x: torch.Tensor, residual: torch.Tensor, step: NpuStep | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(norm(x + residual), x + residual)`."""
    if step is None:
        return norm(x, residual)
    return layernorm.add_rms_norm(
        x, residual, norm.weight, norm.variance_epsilon, npu=step.ops("add_rms_norm"),
        bias=layernorm.norm_bias(norm),
    )  # fmt: skip


def project(layer: LinearBase, x: torch.Tensor, step: NpuStep | None) -> torch.Tensor:
    """`layer(x)` without the bias tuple; on the NPU path `npu_linear` (+ TP all-reduce)."""
    if step is None or not supports_npu_linear(layer):
        return layer(x)[0]
    out = linear.linear(x, npu_weight(layer), _bias(layer), npu=step.ops("linear"))
    if isinstance(layer, RowParallelLinear) and layer.reduce_results and layer.tp_size > 1:
        out = tensor_model_parallel_all_reduce(out)
    return out


def supports_npu_linear(layer: LinearBase) -> bool:
    """Plain (unquantized) weights, and input already split for row-parallel layers."""
    if not isinstance(getattr(layer, "quant_method", None), UnquantizedLinearMethod):
        return False
    return not isinstance(layer, RowParallelLinear) or layer.input_is_parallel


def npu_weight(layer: LinearBase) -> torch.Tensor:
    """`layer.weight`, which the NPU platform keeps after loading (in ND or NZ format)."""
    weight = layer.weight
    if weight.numel() == 0:
        raise RuntimeError(
            f"{getattr(layer, 'prefix', type(layer).__name__)}: the platform repacked and "
            "dropped this weight after loading, so the NPU path cannot read it"
        )
    return weight


def _bias(layer: LinearBase) -> torch.Tensor | None:
    if layer.bias is None or layer.skip_bias_add:
        return None
    if isinstance(layer, RowParallelLinear) and layer.tp_rank > 0:
        return None  # added once, before the all-reduce
    return layer.bias
