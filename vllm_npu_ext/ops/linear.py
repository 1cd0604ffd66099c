"""Projections: `npu_linear`, `npu_grouped_matmul` and their references.

npu_grouped_matmul takes float32 only with a single x, weight and y tensor ("torch.float32
(仅x/weight/y均为单张量)", torch-npu 2.10.0.post4 `_op_plugin_docs.py`, the `npu_grouped_matmul`
docstring, 约束说明, 表1 数据类型约束场景; aclnnGroupedMatmulV4 says the same). q/k/v need three, so
float32 models use the merged projection instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
import torch.nn.functional as F

# Dtypes npu_grouped_matmul takes with several x/weight/y tensors (group_type -1).
GROUPED_MULTI_TENSOR_DTYPES = (torch.float16, torch.bfloat16)


def grouped_linear_supports(dtype: torch.dtype, groups: int = 3) -> bool:
    """Whether `grouped_linear` can run `groups` projections of `dtype` as one NPU operator."""
    return groups == 1 or dtype in GROUPED_MULTI_TENSOR_DTYPES


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    npu: ModuleType | None = None,
) -> torch.Tensor:
    """x `[T, K]` @ weight `[N, K]`^T (+ bias `[N]`) -> `[T, N]`."""
    if npu is not None:
        return npu.npu_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def grouped_linear(
    x: torch.Tensor,
    weights_kn: Sequence[torch.Tensor],
    biases: Sequence[torch.Tensor] | None = None,
    npu: ModuleType | None = None,
) -> list[torch.Tensor]:
    """One input against several pre-transposed weights in one operator.

    x `[T, K]`, weights_kn[i] `[K, N_i]` (the transpose of F.linear's layout, prepared once
    after loading) -> `[x @ weights_kn[i] (+ biases[i])]`, each `[T, N_i]` and contiguous,
    so q, k and v need no split. On the NPU path float32 takes a single weight only
    (`grouped_linear_supports`); ValueError otherwise.
    """
    if npu is not None:
        if not grouped_linear_supports(x.dtype, len(weights_kn)):
            raise ValueError(
                f"x: npu_grouped_matmul takes {x.dtype} only with a single weight, got "
                f"{len(weights_kn)}; use linear() on the merged weight"
            )
        return list(
            npu.npu_grouped_matmul(
                [x] * len(weights_kn),
                list(weights_kn),
                bias=list(biases) if biases is not None else None,
                split_item=0,
                group_type=-1,
            )
        )
    outputs = [x @ w for w in weights_kn]
    if biases is not None:
        outputs = [y + b for y, b in zip(outputs, biases, strict=True)]
    return outputs
