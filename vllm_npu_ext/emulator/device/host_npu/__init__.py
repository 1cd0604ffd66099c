"""The stand-in's `npu` device: torch's PrivateUse1 backend with host memory (C++).

`load()` builds `host_npu.cpp` for the running torch (`build.py`) and loads it once: an
allocator, a device guard, the PrivateUse1 hooks (pinned host memory included), the factory,
copy, view, resize and set kernels, and a fallback that runs every other aten operator by its
CPU kernel on CPU tensors aliasing the npu tensors' memory. The backend is not named here:
`surface.install()` renames PrivateUse1 `npu` and registers `torch.npu`.

`host_view(t)` is the CPU tensor over an npu tensor's memory (what the `hccl` stand-in hands
to gloo); `memory_figures()` the allocator's bytes now and at peak, live allocations, pinned
blocks and operator calls that took the CPU fallback; `set_blocked(reason)` refuses device
work while a graph replay waits on an unrecorded event.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from . import build

_loaded: list[Path] = []


def load() -> Path:
    """Build (if needed) and load the device library; once per process."""
    if not _loaded:
        library = build.build()
        torch.ops.load_library(str(library))
        _loaded.append(library)
    return _loaded[0]


def loaded() -> bool:
    return bool(_loaded)


def host_view(tensor: torch.Tensor) -> torch.Tensor:
    """The CPU tensor over `tensor`'s memory (same sizes, strides and offset)."""
    return torch.ops.npu_host.host_view(tensor)


def set_device(index: int) -> None:
    torch.ops.npu_host.set_device(index)


def current_device() -> int:
    return torch.ops.npu_host.current_device()


def set_device_count(count: int) -> None:
    torch.ops.npu_host.set_device_count(count)


def manual_seed(seed: int, device: int = -1) -> None:
    """Seed the npu default generator of `device` (-1: every device)."""
    torch.ops.npu_host.manual_seed(seed, device)


def initial_seed(device: int) -> int:
    return torch.ops.npu_host.initial_seed(device)


@dataclasses.dataclass(frozen=True)
class MemoryFigures:
    allocated_bytes: int
    peak_bytes: int
    live_allocations: int
    pinned_blocks: int
    fallback_calls: int


def memory_figures() -> MemoryFigures:
    return MemoryFigures(*torch.ops.npu_host.memory_figures())


def reset_peak() -> None:
    torch.ops.npu_host.reset_peak()


def set_blocked(reason: str) -> None:
    """While `reason` is non-empty, every operator, copy or value read on the npu device raises
    RuntimeError naming it (the stream is blocked: `graphs`); "" unblocks."""
    torch.ops.npu_host.set_blocked(reason)
