"""The torch_npu surface beyond the operators: what vllm-ascend imports and reads.

`install()` does, on the CPU, what `import torch_npu` does to torch on an NPU host (torch-npu
2.10.0.post4 `torch_npu/__init__.py`): the PrivateUse1 backend becomes the `npu` device
(`host_npu`: a C++ backend whose memory is host memory, so `torch.empty(..., device="npu")`,
copies, views and every aten operator work on `npu` tensors), the `torch.npu` device module
is registered (`device/npu.py`, also `torch_npu.npu`), `torch_npu._C` and
`torch_npu._C._distributed_c10d` exist with the names vllm-ascend reads (and CANN's `acl.rt`,
which its sleep-mode allocator imports), and the `hccl`
process-group backend exists (`device/collectives.py`: gloo, for host and npu tensors), so vLLM's
and vllm-ascend's HCCL groups run between host processes. Operators registered only for the
NPU's dispatch key (vLLM registers its own for the platform's key) also run on CPU tensors,
through a CPU backend fallback (`_npu_kernel_on_host`). The renaming cannot be undone, so the
surface stays for the life of the process: it is for processes that run vllm-ascend
(`VLLM_NPU_EXT_EMULATE=1` processes, `tests/with_vllm_ascend`).
"""

from __future__ import annotations

import collections
import os
import sys
from types import ModuleType

import torch

from .device import collectives, graph_tasks, graphs, host_copies, npugraph_ex
from .device import npu as device
from .operators import vllm_ascend_library, vllm_ascend_triton, vllm_triton
from .runtime.strict import not_emulated, strict_module

_installed: list[ModuleType] = []
_libraries: list[torch.library.Library] = []  # kept alive: dropping one unregisters it


class _HcclOptions:
    """`ProcessGroupHCCL.Options`: plain data here. vllm-ascend fills `hccl_config` and reads
    the fields below back (vllm-ascend 0.23.0.post1 `vllm_ascend.utils.create_hccl_pg_options`;
    `vllm_ascend/patch/worker/_hccl_pg_registry.py`, `_AUDITED_PG_OPTION_FIELDS`,
    `_REDUNDANT_PG_OPTION_FIELDS` and `_KNOWN_PG_OPTION_DEFAULTS`); the gloo group that stands
    in for HCCL ignores them."""

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.hccl_config: dict = {}
        self.global_ranks_in_group: list[int] = []
        self.group_id = ""
        self.group_name = ""
        self.backend = collectives.HCCL
        self.is_high_priority_stream = is_high_priority_stream
        self._timeout = None


def _c_modules() -> tuple[ModuleType, ModuleType]:
    options = _HcclOptions
    process_group_hccl = not_emulated(
        "torch_npu._C._distributed_c10d.ProcessGroupHCCL", Options=options
    )
    c10d = strict_module(
        "torch_npu._C._distributed_c10d",
        "HCCL bindings: the class exists for imports and isinstance checks; groups are gloo.",
        ProcessGroupHCCL=process_group_hccl,
    )
    c = strict_module(
        "torch_npu._C",
        "torch_npu's C bindings: only names read by vllm-ascend's code on the tested paths.",
        _distributed_c10d=c10d,
        _NPUTaskGroupHandle=graph_tasks.TaskGroupHandle,
        _weak_ref_tensor=graphs.weak_ref_tensor,
    )
    return c, c10d


def _register_atb_extensions() -> None:
    """torch_npu's ATB operator library (`torch.ops.atb.*`): the stand-in defines the operators
    vllm-ascend's tested paths call (`operators/atb.py`) when it loads; a call of any other
    fails naming it."""


def _dynamic_profile_step() -> None:
    """torch_npu's dynamic profiler steps only when PROF_CONFIG_PATH configures it."""
    if os.environ.get("PROF_CONFIG_PATH"):
        raise NotImplementedError("torch_npu.profiler.dynamic_profile is not emulated")


def _acl_memcpy(*args, **kwargs):
    raise NotImplementedError(
        "acl.rt.memcpy (CANN's pyACL) is not emulated: the host-backed npu device copies with "
        "Tensor.copy_"
    )


def _acl_modules() -> dict[str, ModuleType]:
    """CANN's Python runtime binding (pyACL), which vllm-ascend's sleep-mode allocator imports
    a name from (vllm-ascend 0.23.0.post1 `vllm_ascend/device_allocator/camem.py`, its
    module-level `from acl.rt import memcpy`, unused there);
    NPUWorker's module imports that allocator. Names only."""
    rt = strict_module("acl.rt", "pyACL's runtime: names only.", memcpy=_acl_memcpy)
    acl = strict_module("acl", "CANN's pyACL: names only.", rt=rt)
    return {"acl": acl, "acl.rt": rt}


def _python_modules(torch_npu: ModuleType) -> dict[str, ModuleType]:
    """torch_npu's Python submodules that vllm-ascend imports names from, and `torch_npu.atb`,
    which torch_npu also registers in `sys.modules` (op-plugin `op_plugin/python/atb/
    _atb_ops.py` `_add_atb_module`) and vllm-ascend reads as an attribute
    (vllm-ascend 0.23.0.post1 `BaseDeviceAdaptor.kv_cache_load`)."""
    atb_ops = strict_module(
        "torch_npu.op_plugin.atb._atb_ops", "ATB operators: none emulated.",
        _register_atb_extensions=_register_atb_extensions,
    )  # fmt: skip
    atb = strict_module("torch_npu.op_plugin.atb", "", _atb_ops=atb_ops)
    op_plugin = strict_module("torch_npu.op_plugin", "", atb=atb)
    dynamic_profile = strict_module(
        "torch_npu.profiler.dynamic_profile", "", step=_dynamic_profile_step
    )
    profiler = strict_module("torch_npu.profiler", "", dynamic_profile=dynamic_profile)
    return {module.__name__: module for module in (
        op_plugin, atb, atb_ops, profiler, dynamic_profile, torch_npu.atb)}  # fmt: skip


# "vllm::all_gather" -> calls of an NPU-only operator run on the host by the fallback below.
npu_kernels_on_host: collections.Counter[str] = collections.Counter()
_NPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _npu_kernel_on_host(keyset, op, *args, **kwargs):
    """CPU fallback: an operator registered only for the NPU's dispatch key runs that kernel.

    vLLM registers its custom operators for the platform's key (`direct_register_custom_op`,
    `NPUPlatform.dispatch_key = "PrivateUse1"`), e.g. `vllm::all_gather`, which vllm-ascend's
    GroupCoordinator always calls (vllm-ascend 0.23.0.post1 `GroupCoordinatorPatch.__init__`
    sets `use_custom_op_call = True`). Here the tensors
    standing for NPU tensors are CPU tensors, so such an operator reaches the CPU key: this
    backend fallback (taken only by operators with no CPU, composite or other kernel) runs
    its PrivateUse1 kernel; any other operator fails naming itself."""
    name = op.name()
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
        npu_kernels_on_host[name] += 1
        return op.redispatch(_NPU_KEYS, *args, **kwargs)
    raise NotImplementedError(
        f"{name} has no CPU kernel and no NPU (PrivateUse1) kernel; the torch_npu stand-in "
        "runs NPU-registered operators on the host only"
    )


def install(torch_npu: ModuleType) -> ModuleType:
    """Give `torch_npu` (the emulator module) its surface and torch its `npu` device; once."""
    if _installed:
        return _installed[0]
    # The device library registers PrivateUse1's allocator, guard, hooks and kernels (torch
    # asks the hooks for the accelerator: without them torch.distributed.barrier() fails once
    # the backend is renamed); then the name `npu`, the device module and the Tensor/Module
    # methods torch_npu adds (`.npu()`, `.is_npu`).
    npu = device.build()  # loads host_npu
    torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", npu)
    torch.utils.generate_methods_for_privateuse1_backend()
    c, c10d = _c_modules()
    submodules = {
        "torch_npu.npu": npu, "torch_npu._C": c, "torch_npu._C._distributed_c10d": c10d,
        **_python_modules(torch_npu),
    }  # fmt: skip
    for name, module in submodules.items():
        if name.count(".") == 1:
            setattr(torch_npu, name.split(".")[1], module)
    sys.modules.update(submodules)
    for name, module in _acl_modules().items():
        sys.modules.setdefault(name, module)  # a real pyACL, where there is one, stays
    for name, module in npugraph_ex.modules().items():
        sys.modules.setdefault(name, module)  # what `import torch_npu` registers
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_npu_kernel_on_host, "CPU", with_keyset=True)
    _libraries.append(fallback)
    collectives.register()
    _libraries.append(host_copies.install(host_copies.PENDING, npu.current_stream))
    vllm_triton.install()  # vLLM's Triton kernels, where it has no Triton backend
    vllm_ascend_library.install()  # vllm-ascend's operator library, where it has none on disk
    vllm_ascend_triton.install()  # vllm-ascend's Triton operators, where it registers none
    _installed.append(npu)
    return npu
