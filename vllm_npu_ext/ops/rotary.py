"""Rotary position embedding (neox / "half" style): `npu_rotary_mul` and its reference."""

from __future__ import annotations

from types import ModuleType

import torch


def full_width_tables(cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's `cos_sin_cache` `[max_pos, D]` (cos half || sin half) -> cos, sin `[max_pos, D]`.

    `npu_rotary_mul` in half mode multiplies the whole head by `r1`/`r2`, so each half-width
    table is repeated to the full head width. Done once per model, not per forward.
    """
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    return torch.cat((cos, cos), dim=-1).contiguous(), torch.cat((sin, sin), dim=-1).contiguous()


def gather_tables(
    cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token cos, sin `[T, D]` for `positions` `[T]`; done once per forward."""
    return cos_table.index_select(0, positions), sin_table.index_select(0, positions)


def apply_rotary(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, npu: ModuleType | None = None
) -> torch.Tensor:
    """Rotate x `[T, N, D]` by per-token cos, sin `[T, D]` -> `[T, N, D]`."""
    tokens, heads, head_dim = x.shape
    if cos.shape != (tokens, head_dim) or sin.shape != (tokens, head_dim):
        raise ValueError(
            f"cos and sin must be [T, D] = [{tokens}, {head_dim}], got {tuple(cos.shape)} "
            f"and {tuple(sin.shape)}"
        )
    if npu is not None:
        # npu_rotary_mul takes 4-D input only: TND viewed as (1, T, N, D).
        rotated = npu.npu_rotary_mul(
            x.view(1, tokens, heads, head_dim),
            cos.view(1, tokens, 1, head_dim),
            sin.view(1, tokens, 1, head_dim),
            rotary_mode="half",
        )
        return rotated.view(tokens, heads, head_dim)
    return apply_rotary_native(x, cos, sin)


def apply_rotary_native(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Hugging Face `x * cos + rotate_half(x) * sin`, in x's dtype."""
    first, second = x.chunk(2, dim=-1)
    rotated_half = torch.cat((-second, first), dim=-1)
    return x * cos.unsqueeze(1) + rotated_half * sin.unsqueeze(1)
