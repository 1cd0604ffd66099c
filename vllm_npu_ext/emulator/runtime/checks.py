"""Contract checks shared by several emulated operators. Every failure names the operator,
the argument and what the real operator expects."""

from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT16_TYPES = (torch.float16, torch.bfloat16)
FLOAT_TYPES = (torch.float16, torch.bfloat16, torch.float32)
COMPRESSED_MASK_SIZE = 2048


def require_dtype(op: str, name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    """TypeError unless `tensor.dtype` is one of `allowed`."""
    if tensor.dtype not in allowed:
        raise TypeError(
            f"{op}: argument {name!r} has dtype {tensor.dtype}; the operator accepts "
            f"{[str(dtype) for dtype in allowed]}"
        )


def require_same_dtype(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """TypeError unless every tensor in `tensors` has the same dtype."""
    dtypes = {name: tensor.dtype for name, tensor in tensors.items()}
    if len(set(dtypes.values())) > 1:
        raise TypeError(f"{op}: arguments must share one dtype, got {dtypes}")


def require_ndim(op: str, name: str, tensor: torch.Tensor, ndims: Sequence[int]) -> None:
    """ValueError unless `tensor.dim()` is one of `ndims`."""
    if tensor.dim() not in ndims:
        raise ValueError(
            f"{op}: argument {name!r} must have {' or '.join(map(str, ndims))} dimensions, "
            f"got shape {tuple(tensor.shape)}"
        )


def require_contiguous(op: str, tensors: dict[str, torch.Tensor]) -> None:
    """ValueError for a non-contiguous tensor (operators documented as not accepting them)."""
    for name, tensor in tensors.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f"{op}: argument {name!r} must be contiguous, got stride {tensor.stride()}"
            )


def require_choice(op: str, name: str, value: object, allowed: Sequence[object]) -> None:
    """ValueError unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{op}: argument {name!r} must be one of {list(allowed)}, got {value!r}")


def sequence_lengths(op: str, name: str, cumulative: Sequence[int] | None, total: int) -> list[int]:
    """Per-sequence lengths from a cumulative list without a leading 0 (TND layouts).

    The list must be non-empty, non-negative and non-decreasing (each entry >= the previous),
    and its last entry must equal `total`, the token count of the packed tensor.
    """
    if cumulative is None:
        raise ValueError(f"{op}: argument {name!r} is required for the TND layout")
    if len(cumulative) == 0:
        raise ValueError(f"{op}: argument {name!r} must not be empty")
    previous = 0
    for index, value in enumerate(cumulative):
        if value < previous:
            raise ValueError(
                f"{op}: argument {name!r} must be cumulative (non-decreasing, non-negative, no "
                f"leading 0): entry {index} is {value} after {previous}; got {list(cumulative)}"
            )
        previous = value
    if previous != total:
        raise ValueError(
            f"{op}: argument {name!r} must end at the token count {total} (last entry == T), "
            f"got last entry {previous}"
        )
    return [b - a for a, b in zip([0, *cumulative[:-1]], cumulative, strict=True)]


def require_real_scale(op: str, name: str, scale: float, head_dim: int) -> None:
    """ValueError for scale 1.0 with head_dim > 1: the schema default, never the intended value."""
    if scale == 1.0 and head_dim > 1:
        raise ValueError(
            f"{op}: argument {name!r} is 1.0 (its schema default) with head_dim {head_dim}; "
            f"pass head_dim ** -0.5 = {head_dim ** -0.5:.6g} (the emulator treats 1.0 as a bug)"
        )


def require_compressed_causal_mask(
    op: str, mask: torch.Tensor | None, sparse_mode: int,
    dtypes: Sequence[torch.dtype], shapes: Sequence[tuple[int, ...]],
) -> None:
    """The compressed 2048x2048 mask of sparse modes 2/3/4: triu(ones, diagonal=1), 1 = masked."""
    size = COMPRESSED_MASK_SIZE
    if mask is None:
        raise ValueError(
            f"{op}: sparse_mode={sparse_mode} needs atten_mask = torch.triu(torch.ones({size}, "
            f"{size}), diagonal=1) as bool; without it the kernel does not apply causal masking"
        )
    require_dtype(op, "atten_mask", mask, dtypes)
    if tuple(mask.shape) not in shapes:
        raise ValueError(
            f"{op}: argument 'atten_mask' for sparse_mode={sparse_mode} must have shape "
            f"{' or '.join(map(str, shapes))}, got {tuple(mask.shape)}"
        )
    expected = torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=1)
    if not torch.equal(mask.reshape(size, size) != 0, expected):
        raise ValueError(
            f"{op}: argument 'atten_mask' for sparse_mode={sparse_mode} must be the compressed "
            f"mask torch.triu(torch.ones({size}, {size}), diagonal=1) (1 = masked, upper triangle)"
        )
