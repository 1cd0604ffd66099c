"""A CPU stand-in for our CANN operator `npu_ext_cann::npu_ext_attention_update`.

On Ascend the op's NPU kernel comes from the compiled extension in `vllm_npu_ext.cann_ops`;
here a CPU kernel is registered that enforces the op_api contract (lse fp32 `[sp, N]`,
go `[sp, N, D]`, the rules of `check_attention_update_args`) and then runs OUR AscendC
kernel source: op_host's tiling and op_kernel/'s kernel compiled for the host with g++
(`cann_ops/npu_ext_attention_update/host_kernel`), on every simulated vector core of an
Atlas A2 (40 cores, 192 KiB UB). The library is built on first use into
`$VLLM_NPU_EXT_HOST_KERNEL_CACHE` (default ~/.cache/vllm_npu_ext/host-kernel); without a C++
compiler the call raises an error naming it. There is no fall-back to the PyTorch reference:
the parity checks compare the kernel with the reference.

    with torch_npu_emulator.emulated(), emulated_cann_ops.emulated():
        attention_update(lse, out)         # -> npu_ext_cann::npu_ext_attention_update
    emulated_cann_ops.calls[OP_NAME]       # calls that reached the emulated kernel

The schema, fake kernel and `custom_kernel_available` belong to
`vllm_npu_ext/cann_ops/binding.py`, which this module imports.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import torch

from vllm_npu_ext.cann_ops import binding
from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel.library import default_kernel
from vllm_npu_ext.ops.attention_update import check_attention_update_args

OP_NAME = binding.OP_NAME
QUALNAME = binding.QUALIFIED_NAME

calls: collections.Counter[str] = collections.Counter()
_libraries: dict[str, torch.library.Library] = {}


def emulated_kernel(
    lse: torch.Tensor, go: torch.Tensor, update_type: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The op_api contract, then the host build of the AscendC kernel.

    Returns (out `[N, D]` in go's dtype, lse_out `[N]` fp32; NaN for update_type 0, which
    leaves it unwritten).
    """
    calls[OP_NAME] += 1
    check_attention_update_args(lse, go, update_type)
    out, lse_out, _ = default_kernel().launch(lse, go, update_type)
    return out, lse_out


def install() -> None:
    """Register the CPU kernel (idempotent; a kernel registered by someone else is kept)."""
    if "kernel" in _libraries or torch._C._dispatch_has_kernel_for_dispatch_key(QUALNAME, "CPU"):
        return
    library = torch.library.Library(binding.LIBRARY_NAMESPACE, "FRAGMENT")
    library.impl(OP_NAME, emulated_kernel, "CPU")
    _libraries["kernel"] = library


def _on_npu(lse: torch.Tensor, go: torch.Tensor, update_type: int):
    """The host kernel on host copies of npu inputs, its results copied back to their device:
    one launch of the operator (a captured graph records it as one task)."""
    out, lse_out = emulated_kernel(lse.cpu(), go.cpu(), update_type)
    return out.to(lse.device), lse_out.to(lse.device)


def install_on_npu() -> bool:
    """The built operator package on the stand-in's npu device: install() and a PrivateUse1
    kernel (the key `binding.custom_kernel_available` asks for, as the compiled extension
    registers it on Ascend). False where a PrivateUse1 kernel was there already."""
    install()
    if "npu" in _libraries or torch._C._dispatch_has_kernel_for_dispatch_key(QUALNAME,
                                                                             "PrivateUse1"):
        return False
    library = torch.library.Library(binding.LIBRARY_NAMESPACE, "FRAGMENT")
    library.impl(OP_NAME, _on_npu, "PrivateUse1")
    _libraries["npu"] = library
    return True


def uninstall() -> None:
    """Remove the CPU kernel registered by install() (the schema stays)."""
    library = _libraries.pop("kernel", None)
    if library is not None:
        library._destroy()


@contextlib.contextmanager
def emulated() -> Iterator[None]:
    """The CPU kernel registered for the duration of the block.

    `binding.custom_kernel_available(cpu)` then reports it, so the "custom" branch of the
    AttentionUpdate dispatch runs on CPU tensors under the torch_npu emulator.
    """
    install()
    try:
        yield
    finally:
        uninstall()
