"""Emulated `npu_mrope` (aclnnRopeWithSinCosCache): q and k rotated in one launch, from vLLM's
`cos_sin_cache` and the token positions.

Contract, from torch-npu 2.10.0.post4's docs (the `npu_mrope` docstring of
`_op_plugin_docs.py`, cited as W with its section and parameter) and the aclnn operator's
(hicann ops-transformer `posembedding/rope_with_sin_cos_cache/docs/aclnnRopeWithSinCosCache.md`,
"约束说明", cited as AD):
- positions 1-D `[T]` (rope mode) or 2-D `[3, T]` (mrope mode), int32/int64 (W 参数说明, positions;
  AD lists int64), values < cos_sin_cache's max_seq_len (W 约束说明, "越界"; AD);
- query `[T, Nq*head_size]`, key `[T, Nk*head_size]`, cos_sin_cache `[max_seq_len, rotary_dim]`,
  all 2-D (W 约束说明, "只支持2维"; AD) and of one dtype (AD), bfloat16/float16/float32 (W 参数说明,
  queryIn, keyIn, cosSinCache);
- head_size and rotary_dim multiples of 32 for bfloat16/float16 and of 16 for float32,
  rotary_dim <= head_size (AD; W 约束说明 states the rotary_dim rule);
- `cos, sin = cos_sin_cache[positions].chunk(2, -1)`; on the first rotary_dim elements of each
  head, 'half' (GPT-NeoX): `o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin` over the two halves,
  'interleave' (GPT-J): the same over even/odd elements; the rest of the head passes (AD's
  formula). Returns new tensors like query and key (the wheel's meta, `npu_mrope_meta` in
  `torch_npu/op_plugin/meta/_meta_registrations.py`).

Emulated: rope mode (1-D positions; `mrope_section` None or [0, 0, 0], which W 参数说明,
mropeSection, names the rope mode) with cache_mode 'default'. mrope mode (2-D positions) and
cache_mode 'interleave' raise NotImplementedError. Computed in float32, returned in the input dtype.
"""

from __future__ import annotations

import torch

from ..runtime.checks import FLOAT_TYPES, require_choice, require_dtype, require_ndim
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall

MROPE = "npu_mrope"
POSITION_TYPES = (torch.int32, torch.int64)
ROPE_MODE_SECTIONS = (None, [0, 0, 0])


def _multiple(dtype: torch.dtype) -> int:
    return 16 if dtype == torch.float32 else 32


@emulated_operator(MROPE)
def npu_mrope(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor]:
    """`(query_out, key_out)`: query and key rotated by cos_sin_cache[positions] (module
    docstring)."""
    positions, query, key, cache = call.positions, call.query, call.key, call.cos_sin_cache
    head_size = call.head_size
    _require_inputs(positions, query, key, cache, head_size)
    require_choice(MROPE, "rotary_mode", call.rotary_mode, ("half", "interleave"))
    if call.cache_mode != "default":
        raise NotImplementedError(f"{MROPE}: cache_mode {call.cache_mode!r} is not emulated")
    if positions.dim() == 2 or call.mrope_section not in ROPE_MODE_SECTIONS:
        raise NotImplementedError(f"{MROPE}: mrope mode (2-D positions, mrope_section) is not "
                                  "emulated; pass 1-D positions")  # fmt: skip
    cos, sin = cache.index_select(0, positions.long()).float().chunk(2, dim=-1)
    neox = call.rotary_mode == "half"
    return (_rotate(query, cos, sin, head_size, neox), _rotate(key, cos, sin, head_size, neox))


def _require_inputs(positions, query, key, cache, head_size: int) -> None:
    require_ndim(MROPE, "positions", positions, (1, 2))
    require_dtype(MROPE, "positions", positions, POSITION_TYPES)
    for name, tensor in (("query", query), ("key", key), ("cos_sin_cache", cache)):
        require_ndim(MROPE, name, tensor, (2,))
        require_dtype(MROPE, name, tensor, FLOAT_TYPES)
        if tensor.dtype != query.dtype:
            raise TypeError(f"{MROPE}: query, key and cos_sin_cache must share one dtype, got "
                            f"{query.dtype} and {name} {tensor.dtype}")  # fmt: skip
    multiple, rotary_dim = _multiple(query.dtype), cache.shape[-1]
    if head_size <= 0 or head_size % multiple:
        raise ValueError(f"{MROPE}: head_size must be a positive multiple of {multiple} for "
                         f"{query.dtype}, got {head_size}")  # fmt: skip
    if rotary_dim % multiple or not 0 < rotary_dim <= head_size:
        raise ValueError(f"{MROPE}: cos_sin_cache's rotary_dim ({rotary_dim}) must be a "
                         f"multiple of {multiple} and at most head_size {head_size}")  # fmt: skip
    tokens = positions.shape[-1]
    for name, tensor in (("query", query), ("key", key)):
        if tensor.shape[0] != tokens or tensor.shape[1] % head_size:
            raise ValueError(f"{MROPE}: {name} must be [{tokens}, heads * {head_size}], got "
                             f"{tuple(tensor.shape)}")  # fmt: skip
    if tokens and (positions.min() < 0 or positions.max() >= cache.shape[0]):
        raise ValueError(f"{MROPE}: positions must lie in [0, {cache.shape[0]}) (cos_sin_cache's "
                         f"max_seq_len), got {positions.min()}..{positions.max()}")  # fmt: skip


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_size: int, neox: bool):
    """x `[T, N*head_size]` with each head's first rotary_dim elements rotated."""
    tokens, rotary_dim = x.shape[0], 2 * cos.shape[-1]
    heads = x.view(tokens, -1, head_size).float()
    rot, rest = heads[..., :rotary_dim], heads[..., rotary_dim:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., ::2], rot[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rotated, rest), dim=-1).to(x.dtype).view(tokens, -1)
