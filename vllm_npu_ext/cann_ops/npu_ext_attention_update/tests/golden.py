"""Golden reference of NpuExtAttentionUpdate, in float64 NumPy.

Its arguments follow the op definition (op_host/npu_ext_attention_update_def.cpp): the
inputs lse and go, then the attribute update_type; it returns the outputs out and lse_out.
"""

from __future__ import annotations

import numpy as np


def npu_ext_attention_update_golden(
    lse: np.ndarray, go: np.ndarray, update_type: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Merge sp partial attention results.

    lse: `[sp, N]` partial log-sum-exps (-inf for a shard with no keys).
    go: `[sp, N, D]` partial outputs (any float dtype; computed in float64).
    update_type: 1 to also return the merged lse.
    Returns (out `[N, D]` float64, lse_out `[N]` float64 or None when update_type == 0).
    A shard whose weight is 0 contributes nothing, even if its go rows are not finite; a row
    where every shard is -inf merges to 0 with lse_out -inf.
    """
    if update_type not in (0, 1):
        raise ValueError(f"update_type must be 0 or 1, got {update_type!r}")
    lse = np.asarray(lse, dtype=np.float64)
    go = np.asarray(go, dtype=np.float64)
    if lse.ndim != 2 or go.shape[:2] != lse.shape or go.ndim != 3:
        raise ValueError(f"lse must be [sp, N] and go [sp, N, D], got {lse.shape}, {go.shape}")
    lse_max = lse.max(axis=0)
    lse_max = np.where(np.isneginf(lse_max), 0.0, lse_max)
    weights = np.exp(lse - lse_max)  # [sp, N]
    total = weights.sum(axis=0)
    with np.errstate(divide="ignore"):
        lse_out = lse_max + np.log(total)
    scales = np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)
    contributions = np.where(scales[..., None] > 0, go, 0.0) * scales[..., None]
    out = contributions.sum(axis=0)
    return out, (lse_out if update_type == 1 else None)
