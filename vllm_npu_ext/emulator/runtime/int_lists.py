"""The integer sequences torch's own binder takes for an `int[]` or `SymInt[]` argument.

torch binds a Python value to a list-of-int schema argument in `toIValue`
(torch/csrc/jit/python/pybind_utils.cpp, `case TypeKind::ListType`): for `int[]`, pybind11's
list caster (any sequence but str/bytes, each item cast to int64); for `SymInt[]`, an
iteration of the value with each item cast to int64, or to SymInt when an item is a tensor
(its `item()`, for a one-element integer tensor: torch/csrc/utils/pybind.cpp). Seen on torch
2.11 with `torch.ops.aten.view.default(x, size)` (`SymInt[] size`): a list, tuple or range of
ints, numpy integer items, a 1-D integer numpy array (any width), a 1-D integer tensor and a
list of 0-d integer tensors all bind. vllm-ascend 0.23.0.post1 relies on it: its CP decode passes
FIA's `actual_seq_lengths_kv` as a numpy array (built in `AscendAttentionCPMetadataBuilder.build`,
passed in `AscendAttentionCPImpl._forward_decode_pcp_dcp`), its DCP prefill a CPU tensor
(`torch.cumsum` in `AscendAttentionCPMetadataBuilder.build`, passed in
`AscendAttentionCPImpl.forward_impl`).

torch also binds values that are not integer sequences: a dict (its keys), a set, bytes,
float32 numpy items, Decimal items, Python bools, 2-D arrays of one column, and an iterator,
which its first pass consumes so that an empty list is bound. The stand-in refuses those
(TypeError naming the argument): on an NPU they would pass lengths nobody meant.
"""

from __future__ import annotations

import operator
from typing import Any

import torch


def _integer_tensor(value: torch.Tensor) -> bool:
    dtype = value.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _numpy_integer_kind(value: Any) -> bool:
    """A numpy array or scalar of a signed/unsigned integer dtype (numpy is not imported)."""
    dtype = getattr(value, "dtype", None)
    return type(value).__module__ == "numpy" and getattr(dtype, "kind", "") in ("i", "u")


def _item(item: Any) -> int | None:
    if isinstance(item, bool):
        return None
    if isinstance(item, int):
        return item
    if isinstance(item, torch.Tensor):
        return int(item.item()) if item.numel() == 1 and _integer_tensor(item) else None
    if _numpy_integer_kind(item) and getattr(item, "ndim", 0) == 0:
        return operator.index(item)
    return None


def integer_list(value: Any) -> list[int] | None:
    """`value` as Python ints when it is an integer sequence torch binds to `int[]`/`SymInt[]`
    (module docstring), else None. A tensor's elements are read on the host (`tolist`)."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or not _integer_tensor(value):
            return None
        return [int(item) for item in value.tolist()]
    if _numpy_integer_kind(value):
        return [int(item) for item in value.tolist()] if value.ndim == 1 else None
    if not isinstance(value, (list, tuple, range)):
        return None
    items = [_item(item) for item in value]
    return None if any(item is None for item in items) else items
