"""Last-token pooling on packed hidden states."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def last_token_pool(
    hidden_states: torch.Tensor, cu_seqlens: torch.Tensor, normalize: bool = True
) -> torch.Tensor:
    """hidden_states `[T, H]`, cu_seqlens int `[B + 1]` -> `[B, H]` (L2-normalised if asked).

    Reads rows `cu_seqlens[1:] - 1` of the packed states directly; nothing is padded or
    regathered per sequence. vLLM's LAST pooler indexes the same rows.
    """
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states must be [T, H], got shape {tuple(hidden_states.shape)}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be [B + 1] with B >= 1, got {tuple(cu_seqlens.shape)}")
    pooled = hidden_states.index_select(0, cu_seqlens[1:].long() - 1)
    return F.normalize(pooled.float(), dim=-1).to(pooled.dtype) if normalize else pooled
