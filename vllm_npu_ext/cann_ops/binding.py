"""Torch binding of the NpuExtAttentionUpdate CANN operator.

Defines `torch.ops.npu_ext_cann.npu_ext_attention_update(Tensor lse, Tensor go,
int update_type) -> (Tensor, Tensor)` with its fake kernel (shared with the public op
`torch.ops.vllm_npu_ext.attention_update`). The NPU kernel is C++ (`vllm_npu_ext._cann_C`,
built by setup.py only where torch_npu and CANN are present) and calls our aclnn functions;
`custom_kernel_available` says whether a kernel is registered for a device. Importing this
module registers the op as the custom kernel of `vllm_npu_ext.ops.attention_update` (which
knows nothing of this package).

Arguments: lse fp32 `[sp, N]`; go `[sp, N, D]` fp32/fp16/bf16 (`go`: the partial attention
outputs of the sp shards, the operator definition's name); update_type 0 or 1.
Results: out `[N, D]` in go's dtype; lse_out fp32 `[N]` (only meaningful for update_type 1).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch

from vllm_npu_ext.ops.attention_update import (
    CustomKernel,
    attention_update_fake,
    register_custom_kernel,
)

LIBRARY_NAMESPACE = "npu_ext_cann"
OP_NAME = "npu_ext_attention_update"
QUALIFIED_NAME = f"{LIBRARY_NAMESPACE}::{OP_NAME}"
OP_SCHEMA = f"{OP_NAME}(Tensor lse, Tensor go, int update_type) -> (Tensor, Tensor)"
EXTENSION_MODULE = "vllm_npu_ext._cann_C"
# device.type -> the dispatch key its kernel is registered under.
DISPATCH_KEYS = {"npu": "PrivateUse1", "cpu": "CPU"}


def npu_ext_attention_update_fake(
    lse: torch.Tensor, go: torch.Tensor, update_type: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shapes and dtypes only: (out `[N, D]` in go's dtype, lse_out fp32 `[N]`)."""
    return attention_update_fake(lse, go, update_type)


def _define_op() -> torch.library.Library:
    library = torch.library.Library(LIBRARY_NAMESPACE, "FRAGMENT")
    library.define(OP_SCHEMA)
    torch.library.register_fake(QUALIFIED_NAME, npu_ext_attention_update_fake, lib=library)
    return library


_LIBRARY = _define_op()


@functools.cache
def load_extension() -> bool:
    """Import the compiled PrivateUse1 kernel once; False when it is absent or cannot load."""
    try:
        importlib.import_module(EXTENSION_MODULE)
    except (ImportError, OSError, RuntimeError):
        return False
    return True


def custom_kernel_available(device: torch.device | str) -> bool:
    """Whether npu_ext_attention_update has a kernel for `device`'s dispatch key.

    npu: PrivateUse1, registered by the compiled extension (loaded here first if it exists).
    cpu: only when a CPU kernel has been registered for it. Any other device: False.
    """
    # "npu" is a device type only once torch_npu has renamed PrivateUse1, so parse by hand.
    device_type = device.type if isinstance(device, torch.device) else device.split(":")[0]
    dispatch_key = DISPATCH_KEYS.get(device_type)
    if dispatch_key is None:
        return False
    if device_type == "npu":
        load_extension()
    return torch._C._dispatch_has_kernel_for_dispatch_key(QUALIFIED_NAME, dispatch_key)


def _run(lse: torch.Tensor, go: torch.Tensor, update_type: int):
    return torch.ops.npu_ext_cann.npu_ext_attention_update(lse, go, update_type)


register_custom_kernel(
    CustomKernel("NpuExtAttentionUpdate", custom_kernel_available, _run)
)


def _import_torchair() -> ModuleType | None:
    try:
        from torch_npu.dynamo import torchair
    except (ImportError, OSError, RuntimeError):
        return None
    return torchair


_converters_registered_with: ModuleType | None = None


def register_graph_converter() -> bool:
    """Register the torchair converters of the public op and of the binding op.

    Returns whether they are registered (False when `torch_npu.dynamo.torchair` does not
    import). Calling it again with the same torchair registers nothing twice.
    """
    global _converters_registered_with
    torchair = _import_torchair()
    if torchair is None:
        return False
    if _converters_registered_with is not torchair:
        from vllm_npu_ext.cann_ops.npu_ext_attention_update.torch_binding import (
            torchair_converter,
        )

        torchair_converter.register(torchair)
        _converters_registered_with = torchair
    return True
