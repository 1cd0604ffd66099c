"""Triton kernels that vLLM and vllm-ascend launch on the `npu` device, run by PyTorch.

On Ascend, triton-ascend compiles vLLM's Triton kernels for the NPU. Here there is no Triton
backend: vLLM's `vllm.triton_utils` then holds a placeholder whose `triton.jit` returns the
function itself, and a launch `kernel[grid](...)` fails (`TypeError: 'function' object is not
subscriptable`). `install()` makes that placeholder's `jit` wrap each kernel defined after it
in an `EmulatedKernel`: launching one binds the arguments to the kernel's own signature, checks
the launch contract, and runs the implementation listed in `KERNELS` for it, written from the
kernel's source in PyTorch on the same tensors. A kernel with no implementation, or whose
parameters differ from the implemented version's, raises NotImplementedError naming it when
launched; calling a kernel without a grid is a TypeError, as
with Triton. vllm-ascend's own Triton operators (`vllm_ascend/ops/triton/`) are never launched
here: it chooses its torch_npu paths when `HAS_TRITON` is false (vllm-ascend 0.23.0.post1: the
`if HAS_TRITON` imports of module `vllm_ascend.ops`, and `rope_forward_oot` in
`vllm_ascend/ops/rotary_embedding.py`), as here, where Triton has no active driver.

Implemented (`calls["triton:<kernel>"]` counts launches; each launch is one custom operator,
`torch.ops.triton_kernel.<kernel>`, as a launch is one operator on the device):
- `vllm.v1.worker.block_table._compute_slot_mapping_kernel`, which vllm-ascend 0.23's block table
  launches for every KV-cached model (vllm-ascend 0.23.0.post1
  `vllm_ascend.worker.block_table.BlockTable.compute_slot_mapping`): grid
  `(num_reqs + 1,)`; program r < num_reqs writes the KV-cache slot of each token of request r
  (`block_table[r, pos // (block_size * cp)] * block_size` plus the offset within the block,
  the token's context-parallel rank's share only, PAD_ID for other ranks' tokens), stored in
  slot_mapping's own integer type (int32 in vllm-ascend); the last program writes PAD_ID to
  `slot_mapping[num_tokens:max_num_tokens]` (vLLM 0.23.0
  `vllm.v1.worker.block_table._compute_slot_mapping_kernel`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

from ..runtime.registry import calls

KERNELS: dict[str, Callable[..., None]] = {}


def kernel_name(fn: Callable) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


class EmulatedKernel:
    """A Triton kernel under the placeholder: `kernel[grid](*args, **kwargs)` runs the
    PyTorch implementation registered for it in `KERNELS`."""

    def __init__(self, fn: Callable) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.name = kernel_name(fn)
        self.signature = inspect.signature(fn)

    def __getitem__(self, grid) -> Callable[..., None]:
        if callable(grid):
            raise NotImplementedError(
                f"Triton kernel {self.name}: a grid function (autotuned launch) is not emulated"
            )
        grid = tuple(grid) if isinstance(grid, tuple | list) else (grid,)
        if not grid or not all(isinstance(g, int) and g >= 0 for g in grid):
            raise ValueError(f"Triton kernel {self.name}: grid must be non-negative ints, "
                             f"got {grid!r}")  # fmt: skip
        return functools.partial(self._launch, grid)

    def _launch(self, grid: tuple[int, ...], *args, **kwargs) -> None:
        implementation = KERNELS.get(self.name)
        if implementation is None:
            raise NotImplementedError(
                f"Triton kernel {self.name} is not emulated by the torch_npu stand-in "
                f"({__name__}); add its PyTorch implementation, from its source, to KERNELS"
            )
        expected = _parameters(implementation)
        if list(self.signature.parameters) != expected:
            raise NotImplementedError(
                f"Triton kernel {self.name}: its parameters {list(self.signature.parameters)} "
                f"are not the ones emulated ({expected}, vLLM 0.23's)"
            )
        bound = self.signature.bind(*args, **kwargs)  # TypeError for what Triton rejects
        calls[f"triton:{self.fn.__name__}"] += 1
        implementation(grid, **bound.arguments)

    def __call__(self, *args, **kwargs):
        raise TypeError(f"Triton kernel {self.name} is launched as kernel[grid](...), "
                        "not called")  # fmt: skip


@functools.cache
def _parameters(implementation: Callable[..., None]) -> list[str]:
    """The kernel parameters an implementation takes (all but the grid)."""
    return [p for p in inspect.signature(implementation).parameters if p != "grid"]


def jit(*args, **kwargs):
    """The placeholder's `triton.jit`, with the emulated kernel in place of the function."""
    if args and callable(args[0]):
        return EmulatedKernel(args[0])
    return EmulatedKernel


def install() -> bool:
    """Wrap kernels that vLLM defines from now on, where `vllm.triton_utils.triton` is vLLM's
    placeholder (no Triton backend); returns whether it is."""
    try:
        from vllm import triton_utils
        from vllm.triton_utils.importing import TritonPlaceholder
    except ImportError:
        return False
    if not isinstance(triton_utils.triton, TritonPlaceholder):
        return False
    triton_utils.triton.jit = jit
    return True


def _register(name: str):
    def decorator(fn: Callable[..., None]) -> Callable[..., None]:
        KERNELS[name] = fn
        return fn

    return decorator


def _check(kernel: str, condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"Triton kernel {kernel}: {message}")


@_register("vllm.v1.worker.block_table._compute_slot_mapping_kernel")
def _compute_slot_mapping(
    grid, num_tokens, max_num_tokens, query_start_loc_ptr, positions_ptr, block_table_ptr,
    block_table_stride, block_size, slot_mapping_ptr, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK,
    CP_KV_CACHE_INTERLEAVE_SIZE, PAD_ID, BLOCK_SIZE,
) -> None:  # fmt: skip
    name = "_compute_slot_mapping_kernel"
    query_start_loc, positions = query_start_loc_ptr, positions_ptr
    block_table, slot_mapping = block_table_ptr, slot_mapping_ptr
    tensors = {"query_start_loc": query_start_loc, "positions": positions,
               "block_table": block_table, "slot_mapping": slot_mapping}  # fmt: skip
    for arg, tensor in tensors.items():
        _check(name, isinstance(tensor, torch.Tensor), f"{arg} must be a tensor")
    _check(name, len({t.device for t in tensors.values()}) == 1,
           f"its tensors must be on one device, got {[str(t.device) for t in tensors.values()]}")
    _check(name, len(grid) == 1, f"grid must be (num_reqs + 1,), got {grid}")
    num_reqs = grid[0] - 1
    _check(name, 0 <= num_reqs < query_start_loc.numel(),
           f"grid {grid} needs query_start_loc of at least {grid[0]} entries, "
           f"got {query_start_loc.numel()}")  # fmt: skip
    # vLLM's comments say int32/int64/int32/int64; Triton loads and stores through each
    # pointer's own type, and vllm-ascend passes an int32 slot_mapping (vllm-ascend 0.23.0.post1
    # `BlockTable.__init__`, its `self.slot_mapping` buffer).
    for arg, tensor in tensors.items():
        _check(name, tensor.dtype in (torch.int32, torch.int64),
               f"{arg} must be int32 or int64, got {tensor.dtype}")
    _check(name, block_table.dim() == 2 and block_table.stride() == (block_table_stride, 1),
           f"block_table must be rows of stride {block_table_stride}, got strides "
           f"{block_table.stride()}")  # fmt: skip
    _check(name, 0 <= num_tokens <= max_num_tokens <= slot_mapping.numel(),
           f"need num_tokens <= max_num_tokens <= slot_mapping's {slot_mapping.numel()}, got "
           f"{num_tokens} and {max_num_tokens}")  # fmt: skip
    _check(name, min(block_size, TOTAL_CP_WORLD_SIZE, CP_KV_CACHE_INTERLEAVE_SIZE) > 0,
           "block_size, TOTAL_CP_WORLD_SIZE and CP_KV_CACHE_INTERLEAVE_SIZE must be positive")
    _check(name, 0 <= TOTAL_CP_RANK < TOTAL_CP_WORLD_SIZE,
           f"TOTAL_CP_RANK {TOTAL_CP_RANK} outside the world of {TOTAL_CP_WORLD_SIZE}")
    last = int(query_start_loc[num_reqs].item())  # a host read; the real kernel reads past
    _check(name, last <= min(positions.numel(), max_num_tokens),
           f"query_start_loc ends at {last}, past positions ({positions.numel()}) or "
           f"max_num_tokens ({max_num_tokens})")  # fmt: skip
    torch.ops.triton_kernel._compute_slot_mapping_kernel(
        num_reqs, last, num_tokens, max_num_tokens, query_start_loc, positions, block_table,
        block_size, slot_mapping, TOTAL_CP_WORLD_SIZE, TOTAL_CP_RANK,
        CP_KV_CACHE_INTERLEAVE_SIZE, PAD_ID,
    )  # fmt: skip


# The launch is one operator on the device, as a torch_npu operator is: a custom operator, so
# that an operator counter (benchmarks/count_ops.py) sees one launch, not its PyTorch steps.
@torch.library.custom_op(
    "triton_kernel::_compute_slot_mapping_kernel", mutates_args=("slot_mapping",)
)
def _slot_mapping_math(
    num_reqs: int, last: int, num_tokens: int, max_num_tokens: int, query_start_loc: torch.Tensor,
    positions: torch.Tensor, block_table: torch.Tensor, block_size: int,
    slot_mapping: torch.Tensor, cp_world_size: int, cp_rank: int, interleave: int, pad_id: int,
) -> None:  # fmt: skip
    device = slot_mapping.device
    # Programs 0..num_reqs-1: the tokens of request r are query_start_loc[r]..[r+1].
    bounds = query_start_loc[: num_reqs + 1].to(torch.int64)  # last == bounds[-1]
    token = torch.arange(max_num_tokens, dtype=torch.int64, device=device)
    request = torch.searchsorted(bounds, token, right=True) - 1
    inside = (request >= 0) & (request < num_reqs)
    request = torch.where(inside, request, 0)
    pos = torch.zeros(max_num_tokens, dtype=torch.int64, device=device)
    pos[:last] = positions[:last]
    pos = torch.where(inside, pos, 0)
    virtual_block_size = block_size * cp_world_size
    block_index = pos // virtual_block_size
    block_number = block_table[request, block_index].to(torch.int64)
    offset = pos - block_index * virtual_block_size
    local = (offset // interleave) % cp_world_size == cp_rank
    local_offset = (offset // (cp_world_size * interleave)) * interleave + offset % interleave
    slot = torch.where(local, block_number * block_size + local_offset, pad_id)
    target = slot_mapping[:max_num_tokens]
    result = torch.where(inside, slot, target)
    # The last program pads slot_mapping[num_tokens:max_num_tokens] (for graph replays).
    result = torch.where(token >= num_tokens, torch.full_like(result, pad_id), result)
    target.copy_(result)
