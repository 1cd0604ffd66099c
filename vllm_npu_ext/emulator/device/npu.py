"""The `torch.npu` device module of the stand-in (also `torch_npu.npu`).

The device is the host: `npu` tensors are host memory (`host_npu`, which also holds the
current device index and count), and host kernels run synchronously: work submitted to any
stream has completed when the call returns (`query()` is True). What the host may *assume*
has completed is kept as on the device (`stream_order`: positions per stream, event waits,
synchronisation), so that code updating a graph whose previous replay is not ordered before
the update is refused as it would race on the device. What is here is what vllm-ascend
0.23's code reads on the paths the tests run; everything else raises AttributeError naming
it (`runtime.strict`). Graph capture and replay (`NPUGraph`, `graph`, `graph_pool_handle`)
are `graphs`'s; task groups, task updates and `ExternalEvent` are `graph_tasks`'s.
Synchronising while a graph replay waits on an unrecorded event raises (the device would
never return).

Memory figures are the device allocator's (`host_npu`'s ledger of live npu allocations and their
peak); the device's total is the host's MemTotal (or VLLM_NPU_EXT_EMULATE_DEVICE_MIB: the ranks
of one host share its RAM), so `mem_get_info()` is (total - npu bytes in use, total).
The device count is 1, or the number of ranks once torch.distributed is initialised, so a
process group of N ranks sees N devices as on an N-NPU host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import torch

from ..runtime.strict import not_emulated, strict_module
from . import graph_tasks, graphs, host_copies, host_npu, stream_order

NAME = "torch.npu"


def _index(device: Any) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return current_device() if device.index is None else device.index
    raise TypeError(f"{NAME}: expected a device index, 'npu:N' or torch.device, got {device!r}")


def is_available() -> bool:
    return True


def device_count() -> int:
    count = 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        count = torch.distributed.get_world_size()
    host_npu.set_device_count(count)  # what torch's guard and hooks report too
    return count


def current_device() -> int:
    return host_npu.current_device()


def set_device(device: Any) -> None:
    """Workers pick their index before the process group exists: any index the device
    library accepts (0-63), not only those below device_count()."""
    host_npu.set_device(_index(device))


@contextlib.contextmanager
def device(index: Any) -> Iterator[None]:
    previous = current_device()
    set_device(index)
    try:
        yield
    finally:
        set_device(previous)


def manual_seed(seed: int) -> None:
    """Seed the current device's default generator (the host's Mersenne Twister on the npu
    device: an npu draw equals the CPU draw after the same seed)."""
    host_npu.manual_seed(int(seed), current_device())


def manual_seed_all(seed: int) -> None:
    host_npu.manual_seed(int(seed), -1)


def initial_seed() -> int:
    return host_npu.initial_seed(current_device())


def _is_in_bad_fork() -> bool:
    """torch asks before seeding a device module; the host device survives fork."""
    return False


# The NPU the host stands for: an Atlas A2 Ascend 910B3 (torch_npu's SocVersion 223; 20 cube
# and 40 vector cores, the count the host build of our AscendC kernel assumes).
SOC_VERSION = 223
DEVICE_NAME = "Ascend910B3"
CUBE_CORES, VECTOR_CORES = 20, 40


def get_soc_version() -> int:
    """vllm-ascend maps 220-225 to its A2 device type (vllm-ascend 0.23.0.post1
    `vllm_ascend.utils.check_ascend_device_type`)."""
    return SOC_VERSION


def get_device_name(device: Any = None) -> str:
    _index(device)
    return DEVICE_NAME


@dataclasses.dataclass(frozen=True)
class _DeviceProperties:
    name: str
    total_memory: int
    cube_core_num: int
    vector_core_num: int
    uuid: str


def get_device_properties(device: Any = None) -> _DeviceProperties:
    index = _index(device)
    return _DeviceProperties(DEVICE_NAME, _total_bytes(), CUBE_CORES, VECTOR_CORES,
                             f"host-npu-{index}")  # fmt: skip


def synchronize(device: Any = None) -> None:
    """Host kernels have finished when they return: nothing is pending, unless a graph replay
    waits on an event (`graphs.require_stream_free`)."""
    _index(device)
    graphs.require_stream_free(f"{NAME}.synchronize()")
    stream_order.synchronized()
    host_copies.PENDING.settle()


def empty_cache() -> None:
    """The host allocator keeps no device cache to release."""


def _meminfo() -> dict[str, int]:
    figures = {}
    with open("/proc/meminfo", encoding="ascii") as file:
        for line in file:
            key, value = line.split(":", 1)
            figures[key] = int(value.split()[0]) * 1024
    return figures


def _total_bytes() -> int:
    """The device's memory: VLLM_NPU_EXT_EMULATE_DEVICE_MIB where set, else the host's MemTotal."""
    from vllm_npu_ext import envs

    mib = envs.EMULATE_DEVICE_MIB()
    return _meminfo()["MemTotal"] if mib is None else mib << 20


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes of the device: its memory is the host's (MemTotal, or
    VLLM_NPU_EXT_EMULATE_DEVICE_MIB), of which the npu allocator's live allocations are in
    use; host tensors do not count against it."""
    _index(device)
    total = _total_bytes()
    return max(total - host_npu.memory_figures().allocated_bytes, 0), total


def memory_allocated(device: Any = None) -> int:
    """Bytes of the npu tensors alive now (the device allocator's ledger)."""
    _index(device)
    return host_npu.memory_figures().allocated_bytes


def max_memory_allocated(device: Any = None) -> int:
    """The ledger's peak since the process started or reset_peak_memory_stats()."""
    _index(device)
    return host_npu.memory_figures().peak_bytes


memory_reserved = memory_allocated  # the host allocator keeps no cache
max_memory_reserved = max_memory_allocated


def reset_peak_memory_stats(device: Any = None) -> None:
    _index(device)
    host_npu.reset_peak()


def memory_stats(device: Any = None) -> dict[str, int]:
    """The allocator-statistics keys vLLM and vllm-ascend read, from the ledger."""
    current, peak = memory_allocated(device), max_memory_allocated(device)
    stats = {"num_alloc_retries": 0, "num_ooms": 0}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = current
        stats[f"{kind}.all.peak"] = peak
    return stats


class Stream:
    """A stream of the host device: work is done when submitted; its order (what the host
    may assume is done: `stream_order`) is kept as the device keeps it."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"{NAME}.Stream: unexpected arguments {sorted(kwargs)}")
        self.device_index = _index(device)
        self.priority = priority
        self.order = stream_order.track(self)

    @property
    def device(self) -> torch.device:
        return torch.device("npu", self.device_index)

    def wait_stream(self, stream: Stream) -> None:
        stream_order.wait(self, stream_order.mark(_require(stream, Stream, "wait_stream")))

    def wait_event(self, event: Event) -> None:
        stream_order.wait(self, _require(event, Event, "wait_event").ticket)

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else _require(event, Event, "record_event")
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        graphs.require_stream_free(f"{NAME}.Stream.synchronize()")
        stream_order.synchronized(self)
        host_copies.PENDING.settle()

    def __repr__(self) -> str:
        return f"<{NAME}.Stream {id(self):#x} device=npu:{self.device_index} (host)>"


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:  # fmt: skip
        self.enable_timing = enable_timing
        self.recorded_at: float | None = None
        self.ticket: stream_order.Ticket | None = None  # its stream's position when recorded

    def record(self, stream: Stream | None = None) -> None:
        stream = current_stream() if stream is None else _require(stream, Stream, "Event.record")
        self.ticket = stream_order.mark(stream)
        self.recorded_at = time.perf_counter()

    def wait(self, stream: Stream | None = None) -> None:
        stream = current_stream() if stream is None else _require(stream, Stream, "Event.wait")
        stream_order.wait(stream, self.ticket)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        graphs.require_stream_free(f"{NAME}.Event.synchronize()")
        stream_order.finished(self.ticket)
        host_copies.PENDING.settle()

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's record and end_event's."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True")
        if self.recorded_at is None or end_event.recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end_event.recorded_at - self.recorded_at) * 1000.0


def _require(value: Any, cls: type, where: str) -> Any:
    if not isinstance(value, cls):
        raise TypeError(f"{NAME}.{where}: expected {NAME}.{cls.__name__}, got {type(value)}")
    return value


_streams: dict[int, Stream] = {}
_current: dict[int, Stream] = {}


def default_stream(device: Any = None) -> Stream:
    index = _index(device)
    if index not in _streams:
        _streams[index] = Stream(index)
    return _streams[index]


def current_stream(device: Any = None) -> Stream:
    index = _index(device)
    return _current.get(index) or default_stream(index)


def set_stream(stream: Stream) -> None:
    _current[_require(stream, Stream, "set_stream").device_index] = stream


@contextlib.contextmanager
def stream(stream: Stream | None) -> Iterator[None]:
    if stream is None:
        yield
        return
    index = _require(stream, Stream, "stream").device_index
    previous = _current.get(index)
    _current[index] = stream
    try:
        yield
    finally:
        if previous is None:
            _current.pop(index, None)
        else:
            _current[index] = previous


class _Config:
    """`torch.npu.config`: whether operators may keep private (e.g. NZ) formats. The host
    keeps every tensor in ND; the flag is recorded, nothing else."""

    __slots__ = ("allow_internal_format",)

    def __init__(self) -> None:
        self.allow_internal_format = False


config = _Config()


def _use_mem_pool(*args: Any, **kwargs: Any):
    raise NotImplementedError(f"{NAME}.memory.use_mem_pool (sleep mode's pool) is not emulated")


def _memory_module() -> Any:
    """`torch.npu.memory`: names vllm-ascend's sleep-mode allocator annotates with
    (vllm-ascend 0.23.0.post1 `vllm_ascend/device_allocator/camem.py`,
    `get_pluggable_allocator` and `use_memory_pool_with_allocator`); a pluggable allocator or
    memory pool is not emulated."""
    return strict_module(
        f"{NAME}.memory", "Memory pools: names only.",
        NPUPluggableAllocator=not_emulated(f"{NAME}.memory.NPUPluggableAllocator"),
        MemPool=not_emulated(f"{NAME}.memory.MemPool"), use_mem_pool=_use_mem_pool,
    )  # fmt: skip


def build() -> Any:
    """A new `torch.npu` module object holding this module's public names (the device library
    loaded: it holds the current device; loading it does not rename PrivateUse1)."""
    host_npu.load()
    names = [
        "is_available", "device_count", "current_device", "set_device", "device",
        "manual_seed", "manual_seed_all", "initial_seed", "_is_in_bad_fork",
        "get_soc_version", "get_device_name", "get_device_properties",
        "synchronize", "empty_cache", "mem_get_info", "memory_allocated",
        "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "reset_peak_memory_stats", "memory_stats", "Stream",
        "Event", "default_stream", "current_stream", "set_stream", "stream",
        "config",
    ]  # fmt: skip
    capture = {name: getattr(graphs, name) for name in (
        "NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing")}  # fmt: skip
    capture.update({name: getattr(graph_tasks, name) for name in (
        "ExternalEvent", "graph_task_group_begin", "graph_task_group_end",
        "graph_task_update_begin", "graph_task_update_end")})  # fmt: skip
    return strict_module(NAME, __doc__, memory=_memory_module(), **capture,
                         **{name: globals()[name] for name in names})  # fmt: skip
