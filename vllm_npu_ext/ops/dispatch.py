"""The one place that decides whether an op runs its NPU path.

An op takes its NPU path when its input lives on an Ascend NPU (`device.type == "npu"`), or
when the torch_npu emulator (`vllm_npu_ext.emulator`) is installed as
`sys.modules["torch_npu"]`: then CPU tensors count as device tensors, so tests and tools run
the NPU code paths on CPU against the real operator contracts. Everything else takes the
platform path (vLLM's own kernels) or the PyTorch reference.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

import torch

EMULATOR_MARKER = "__vllm_npu_ext_emulator__"


def _real_torch_npu() -> ModuleType | None:
    # Imported already (vllm-ascend does so early): a plain lookup, which torch.compile traces.
    module = sys.modules.get("torch_npu")
    if module is not None and not getattr(module, EMULATOR_MARKER, False):
        return module
    return _import_torch_npu()


@functools.cache
def _import_torch_npu() -> ModuleType | None:
    # torch_npu raises RuntimeError/OSError, not only ImportError, when CANN is missing.
    try:
        import torch_npu
    except (ImportError, OSError, RuntimeError):
        return None
    return torch_npu


def emulator() -> ModuleType | None:
    """The installed torch_npu emulator, if any."""
    module = sys.modules.get("torch_npu")
    if module is not None and getattr(module, EMULATOR_MARKER, False):
        return module
    return None


def cpu_takes_npu_path() -> bool:
    """Whether CPU tensors take the NPU path in this process (the emulator is installed)."""
    return emulator() is not None


def npu_ops_name() -> str:
    """What runs the NPU path's operators in this process, for logs."""
    return "torch_npu emulator on the CPU" if emulator() is not None else "torch_npu"


def npu_ops(x: torch.Tensor) -> ModuleType | None:
    """torch_npu (or its emulator) when `x` should take the NPU path, else None."""
    return npu_ops_for_device(x.device)


def npu_ops_for_device(device: torch.device) -> ModuleType | None:
    """Like `npu_ops`, for a device rather than a tensor."""
    if device.type == "npu":
        return _real_torch_npu()
    if device.type == "cpu":
        return emulator()
    return None


def real_torch_npu() -> ModuleType | None:
    """torch_npu where it imports (an Ascend host), else None; never the emulator."""
    return _real_torch_npu()


def npu_available() -> bool:
    """Whether a real Ascend NPU is usable in this process."""
    torch_npu = _real_torch_npu()
    if torch_npu is None:
        return False
    try:
        return bool(torch.npu.is_available())  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return False


def graph_capturing(npu: ModuleType | None) -> bool:
    """Whether an NPU graph capture is under way on the current stream (`torch_npu.npu`; the
    emulator without the stand-in's device has no `npu` submodule, and no graphs)."""
    device = getattr(npu, "npu", None)
    return device is not None and device.is_current_stream_capturing()
