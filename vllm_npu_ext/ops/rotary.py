"""Rotary position embedding (neox / "half" style): `npu_rotary_mul` per tensor, `npu_mrope` for
q and k in one launch, and their references."""

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


# npu_mrope's domain (aclnnRopeWithSinCosCache, hicann ops-transformer
# `posembedding/rope_with_sin_cos_cache/docs/aclnnRopeWithSinCosCache.md`, 约束说明; torch-npu
# 2.10.0.post4 `_op_plugin_docs.py`, npu_mrope): head_size and rotary_dim multiples of 32 for
# bf16/fp16, of 16 for float32, rotary_dim <= head_size; one dtype for q, k and the cache.
MROPE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def mrope_unsupported_reason(dtype: torch.dtype, head_dim: int, rotary_dim: int) -> str | None:
    """Why `npu_mrope` cannot rotate q/k of this dtype and shape; None when it can."""
    if dtype not in MROPE_DTYPES:
        return f"npu_mrope does not take {dtype}"
    multiple = 16 if dtype == torch.float32 else 32
    if head_dim % multiple or rotary_dim % multiple or rotary_dim > head_dim:
        return (f"npu_mrope needs head_dim and rotary_dim multiples of {multiple} for {dtype} "
                f"(rotary_dim <= head_dim), got {head_dim} and {rotary_dim}")  # fmt: skip
    return None


def apply_rotary_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    npu: ModuleType | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q `[T, Nq, D]` and k `[T, Nk, D]` rotated (neox) by vLLM's `cos_sin_cache`
    `[max_pos, rotary_dim]` (cos half || sin half) at `positions` `[T]`: one `npu_mrope` launch
    for both, or the reference. A rotary_dim below D leaves each head's tail as it is."""
    tokens, _, head_dim = q.shape
    if npu is not None:
        q_out, k_out = npu.npu_mrope(
            positions, q.reshape(tokens, -1), k.reshape(tokens, -1), cos_sin_cache, head_dim,
            rotary_mode="half",
        )  # fmt: skip
        return q_out.view(q.shape), k_out.view(k.shape)
    return rotate_from_cache(q, positions, cos_sin_cache), rotate_from_cache(
        k, positions, cos_sin_cache
    )


def rotate_from_cache(
    x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> torch.Tensor:
    """The reference of `apply_rotary_qk` for one tensor `[T, N, D]`, in x's dtype."""
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = full_width_tables(cos_sin_cache.index_select(0, positions).to(x.dtype))
    rotated = apply_rotary_native(x[..., :rotary_dim], cos, sin)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
