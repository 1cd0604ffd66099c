"""Inputs the stand-in's operator tests build alike: the causal mask its attention operators
take and normal noise."""

from __future__ import annotations

import torch

BF16 = torch.bfloat16
# The causal mask of the fused attention operators' sparse mode 3: 2048 x 2048, True above the
# diagonal.
MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def rand(*shape, dtype=BF16):
    """Standard normal noise from torch's global generator, cast to `dtype`."""
    return torch.randn(*shape).to(dtype)


def seeded_rand(*shape, dtype=BF16, seed=0):
    """Standard normal noise from a generator of its own seeded with `seed` (the same call gives
    the same tensor), cast to `dtype`."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
