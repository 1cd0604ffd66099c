"""The `hccl` process-group backend of the stand-in: gloo, for host and `npu` tensors alike.

torch_npu registers `hccl` with torch.distributed (ProcessGroupHCCL); vLLM's and vllm-ascend's
device groups use it. Here a group of that name is a Python ProcessGroup that hands every collective
to a gloo group over the same store. gloo takes only CPU (and CUDA) tensors, so an `npu` tensor goes
to it as its host view (`host_npu.host_view`: a CPU tensor over the same memory): gloo reads and
writes the npu tensor's own bytes, and the collective's Work is gloo's. A collective issued while an
NPU graph is being captured is also a task of that graph (`graphs.CollectiveNode`): HCCL operators
are captured into ACL graphs on the device (vllm-ascend's full graphs hold its TP all-reduce and its
CP all-gather and all-to-all, vllm-ascend 0.23.0.post1
`AscendAttentionCPImpl._forward_decode_pcp_dcp`), and each replay runs them again on the captured
buffers. Torch calls these methods from Python (`dist.all_reduce` -> `group.allreduce`) and from C++
(functional collectives, through ProcessGroup's Python trampoline).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import _disable_current_modes

from . import graphs, host_npu

HCCL = "hccl"
# ProcessGroup methods that take tensors; each goes to gloo with npu tensors as host views.
COLLECTIVES = (
    "allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced", "alltoall", "alltoall_base", "broadcast", "reduce",
    "gather", "scatter", "send", "recv", "recv_anysource", "barrier", "monitored_barrier",
)  # fmt: skip


def _on_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return host_npu.host_view(value) if value.device.type == "npu" else value
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(item) for item in value)
    return value


# torch 2.13's ProcessGroup names for what gloo's backend calls by its older names.
RENAMED = {
    "all_gather_single": "_allgather_base",
    "reduce_scatter_single": "_reduce_scatter_base",
    "all_to_all_single": "alltoall_base",
}


def _forward(name: str):
    def collective(self, *args: Any, **kwargs: Any):
        gloo_name = RENAMED.get(name, name)  # one name on every torch
        method = getattr(self._gloo, gloo_name)
        args = tuple(_on_host(arg) for arg in args)
        kwargs = {key: _on_host(value) for key, value in kwargs.items()}
        graph = graphs.capturing_graph()
        if graph is not None:  # an HCCL task of the graph: each replay issues it again
            graph.record_node(graphs.CollectiveNode(gloo_name, method, args, kwargs))
        # gloo runs the collective on a thread of its own, with the caller's thread-local
        # state: a dispatch mode active here (a capture's recorder) would reach that thread
        # without the state torch's Python dispatch needs on entry (an internal assert).
        with _disable_current_modes():
            return method(*args, **kwargs)

    collective.__name__ = name
    collective.__doc__ = f"ProcessGroup.{name} by gloo; npu tensors as their host views."
    return collective


class HcclGroup(dist.ProcessGroup):
    """An `hccl` process group whose collectives gloo carries."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._name = ""
        self._desc = ""

    # A ProcessGroup keeps its name in its backends (C++ getGroupName); this one has none
    # registered, so torch.distributed's Python code reads and sets them here.
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_desc(self) -> str:
        return self._desc

    def getBackendName(self) -> str:  # noqa: N802 (torch's trampoline name)
        return HCCL

    @property
    def gloo(self) -> Any:
        """The gloo group that carries the collectives."""
        return self._gloo

    def __repr__(self) -> str:
        return f"<hccl stand-in over gloo, rank {self.rank()} of {self.size()}>"


for _name in (*COLLECTIVES, *RENAMED):
    setattr(HcclGroup, _name, _forward(_name))


def create_group(store: Any, rank: int, size: int, timeout: timedelta) -> HcclGroup:
    """The `hccl` backend's creator (torch.distributed.Backend.register_backend)."""
    return HcclGroup(store, rank, size, timeout)


def is_hccl_available() -> bool:
    return HCCL in dist.Backend.backend_list


def register() -> None:
    if HCCL not in dist.Backend.backend_list:
        dist.Backend.register_backend(HCCL, create_group, devices=["cpu", "npu"])
    dist.is_hccl_available = is_hccl_available
