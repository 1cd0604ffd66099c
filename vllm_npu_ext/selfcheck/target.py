"""Where selfcheck runs the fused operators: the real NPU, or the CPU under the emulator."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from vllm_npu_ext.cann_ops import binding
from vllm_npu_ext.ops import dispatch


@dataclasses.dataclass(frozen=True)
class Target:
    """npu: torch_npu or the emulator. device: where fused inputs go (npu, or cpu emulated)."""

    npu: ModuleType
    device: torch.device
    emulated: bool

    def synchronize(self) -> None:
        """Wait for queued device work (the NPU runs asynchronously); nothing to wait for on CPU."""
        if not self.emulated:
            torch.npu.synchronize()  # type: ignore[attr-defined]

    def describe(self) -> dict[str, Any]:
        """Device and precision settings for the report's first line."""
        info: dict[str, Any] = {"torch": torch.__version__}
        if self.emulated:
            return {"device": "cpu (torch_npu emulator)", **info}
        npu_backend = torch.npu  # type: ignore[attr-defined]
        info["device"] = f"{self.device} ({npu_backend.get_device_name()})"
        info["torch_npu"] = getattr(self.npu, "__version__", "?")
        # HF32 (10 mantissa bits) in float32 matmuls would fail the float32 tolerances.
        matmul = getattr(npu_backend, "matmul", None)
        info["matmul_allow_hf32"] = getattr(matmul, "allow_hf32", None)
        return info

    def custom_kernel_installed(self) -> bool:
        """Whether our NpuExtAttentionUpdate operator has a kernel for this device."""
        return binding.custom_kernel_available(self.device)


@contextlib.contextmanager
def open_target(emulate: bool) -> Iterator[Target]:
    """The target for this run. Emulated: the torch_npu emulator as `torch_npu` and the
    emulated CPU kernel of our custom op (our AscendC kernel built for the host), both removed
    again on exit."""
    if not emulate:
        if not dispatch.npu_available():  # imports torch_npu, which makes "npu" a device type
            raise RuntimeError("no usable Ascend NPU (torch_npu does not import or sees none)")
        device = torch.device("npu")
        yield Target(dispatch.npu_ops_for_device(device), device, emulated=False)
        return
    from vllm_npu_ext import emulator
    from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops

    cpu = torch.device("cpu")
    register_custom = not binding.custom_kernel_available(cpu)  # leave a kernel someone else owns
    module = emulator.install()
    if register_custom:
        emulated_cann_ops.install()
    try:
        yield Target(module, cpu, emulated=True)
    finally:
        if register_custom:
            emulated_cann_ops.uninstall()
        emulator.uninstall()
