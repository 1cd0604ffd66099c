"""Projections: `npu_linear`, `npu_grouped_matmul` and their references."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch
import torch.nn.functional as F


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
    so q, k and v need no split.
    """
    if npu is not None:
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
