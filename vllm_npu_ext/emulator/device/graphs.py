"""NPU graph capture and replay on the host-backed `npu` device: `torch.npu.NPUGraph`, `graph`,
`graph_pool_handle`, `is_current_stream_capturing`, and `torch_npu._C._weak_ref_tensor`.

The contract is torch-npu 2.10.0.post4's (`torch_npu/npu/graphs.py`): `graph(npu_graph, pool,
stream, auto_dispatch_capture, capture_error_mode)` synchronises, makes its capture stream (its
own side stream unless one is given) current, and brackets the block with
`capture_begin(pool)` / `capture_end()`; `replay()` runs the captured work again;
`pool()` is an opaque token another capture may share.

What a capture records here is what an ACL graph records on the device: the device work, with
the addresses and the host-side parameters it had at capture time. Every operator dispatched
with an `npu` tensor among its arguments or results is recorded with those very tensors (a
TorchDispatchMode; a torch_npu operator is one entry, as it is one kernel launch), except
views and aliases, which are host-side metadata.
`replay()` runs the recorded entries again, in order, on the same tensors: an operator that
writes its arguments (in place, out=) writes them again; a new result is written into the
tensor the capture returned (the graph's memory). So inputs must be copied into the captured
buffers before a replay, and any host value an operator took at capture (a Python int, a host
list of sequence lengths, a CPU tensor it read) is replayed unchanged: a stale address or a
stale captured parameter gives the wrong answer it gives on the device. Work on CPU tensors
only runs at capture time and is not replayed (the host is not in the graph).

As on the device, the host may not read device memory while a capture is under way: a
device-to-host copy or `.item()` of an `npu` tensor during capture raises RuntimeError (an
aclmdlRI capture error on the device). Captured tensors are kept alive by the graph until
`reset()` (the device keeps them in the graph's private pool); pools are not shared between
graphs here, so an aliasing bug that pool sharing could cause on the device is not modelled.

An operator whose kernel is host code issuing device operators (a custom operator registered
CompositeExplicitAutograd, outside aten: `vllm_npu_ext::cache_free_attention`) is entered, and
the device operators it issues are recorded: a graph holds kernel launches, never host code.
Operators the runtime marks as host-only (`registry.HOST_ONLY`: allocations with host-side
sizing, such as FIA's max workspace) run at capture and are not recorded.

Updating captured work between replays (`graph_tasks`): an `ExternalEvent` waited on inside a
capture is a wait node of the graph. A replay runs until such a wait on an event not yet
recorded, then stops there, as the device's stream stops: the host gets control back (a replay
is asynchronous on the device), may update the captured tasks (`graph_task_update_*`) and
record the event, which lets the replay go on. Until then the stream is blocked: any device
operator, copy or value read raises RuntimeError naming the event (`host_npu.set_blocked`;
on the device these would wait forever), as do `torch.npu.synchronize()` and another replay.
A synchronize from another thread (vLLM's async output copy thread waits on its event while
the main thread updates the tasks) waits instead, as the device would, until the replay has
gone on: the thread that stopped the replay will record the event. It raises after
`OTHER_THREAD_WAIT_S` seconds (then the device would hang too).
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

from ..runtime import registry
from . import host_npu, stream_order

_pool_ids = itertools.count(1)
# Process-wide figures: graphs captured and replays; the operators captures recorded, by name.
stats: collections.Counter[str] = collections.Counter()
captured_operators: collections.Counter[str] = collections.Counter()  # by name, all captures
_capturing: list[NPUGraph] = []  # the graph under capture (one at a time, as on the device)
_waiting: list[NPUGraph] = []  # replays stopped at a wait node (the stream is blocked)
_resumed = threading.Condition()  # notified when a stopped replay goes on
OTHER_THREAD_WAIT_S = 300.0
# Operators whose result is memory, not the result of a kernel: nothing to replay.
_ALLOCATIONS = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided",
})  # fmt: skip
# Operators that make the host wait for device values, and those that copy to the host.
_HOST_READS = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::nonzero"})
_COPIES = frozenset({"aten::_to_copy", "aten::copy_", "aten::to"})


def _is_npu(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "npu"


def _tensors(value: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


def _results(func, out) -> tuple:
    """An operator's results, one per return of its schema."""
    return out if isinstance(out, (tuple, list)) and len(func._schema.returns) > 1 else (out,)


def is_view(func) -> bool:
    """A view or alias of an argument (no write): metadata on the host, no device task."""
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in func._schema.returns)  # fmt: skip


# Namespaces whose operators are Python functions registered for the device's dispatch key:
# vLLM's `direct_register_custom_op` defines them in its `vllm` library with the function as
# the kernel for `current_platform.dispatch_key`, PrivateUse1 on vllm-ascend's NPUPlatform
# (vLLM 0.23.0 `vllm.utils.torch_utils.direct_register_custom_op`, vllm-ascend 0.23.0.post1
# `NPUPlatform.dispatch_key`): its
# attention (`unified_attention_with_output`) and communication ops (`all_reduce`,
# `all_gather`, ...) are host code that issues kernels, as vllm-ascend's ACL graphs capture
# them on the device.
PYTHON_DEVICE_NAMESPACES = frozenset({"vllm"})
# Operators of those namespaces that stand in for one device kernel each (a Triton kernel the
# stand-in registers where vllm-ascend would: `operators/vllm_ascend_triton.py`): recorded as
# one launch, as the other emulated operators are.
DEVICE_KERNELS: set[str] = set()


def _host_code(func) -> torch._C.DispatchKey | None:
    """The dispatch key of a custom operator's host-code kernel (None for a device kernel):
    CompositeExplicitAutograd where it has no device kernel, or the device key in
    `PYTHON_DEVICE_NAMESPACES`."""
    name = func.name()
    if func.namespace in PYTHON_DEVICE_NAMESPACES and name not in DEVICE_KERNELS:
        if torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            return torch._C.DispatchKey.PrivateUse1
        return None
    composite = func.namespace not in ("aten", "prim", "prims") and (
        torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutograd")
        and not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1")
    )
    return torch._C.DispatchKey.CompositeExplicitAutograd if composite else None


class WaitNode:
    """An ExternalEvent wait captured into a graph (`graph_tasks.ExternalEvent.wait`)."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event


class ResetNode:
    """An ExternalEvent reset captured into a graph: each replay clears the event again."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def replay(self) -> None:
        self.event.recorded = False


class CollectiveNode:
    """A collective of the `hccl` stand-in issued during a capture (`collectives`): an HCCL
    operator in the ACL graph. Each replay runs it again on the captured buffers and waits for
    it; every rank replays its graph's collectives in capture order, so they pair up as the
    captured ones did."""

    __slots__ = ("name", "method", "args", "kwargs")

    def __init__(self, name: str, method: Any, args: tuple, kwargs: dict) -> None:
        self.name, self.method, self.args, self.kwargs = name, method, args, kwargs

    def replay(self) -> None:
        self.method(*self.args, **self.kwargs).wait()


class _Entry:
    """One recorded operator call: its arguments and the results the capture produced."""

    __slots__ = ("func", "args", "kwargs", "written")

    def __init__(self, func, args, kwargs, out) -> None:
        self.func, self.args, self.kwargs = func, args, kwargs
        # New results (no alias annotation in the schema) are rewritten by each replay; views
        # and in-place/out= results are the arguments themselves.
        self.written: list[tuple[int, Any]] = [
            (index, result)
            for index, (result, spec) in enumerate(
                zip(_results(func, out), func._schema.returns, strict=False))
            if spec.alias_info is None and _tensors(result)
        ]  # fmt: skip

    def replay(self) -> None:
        out = self.func(*self.args, **self.kwargs)
        results = _results(self.func, out)
        for index, recorded in self.written:
            for target, fresh in zip(_tensors(recorded), _tensors(results[index]), strict=True):
                target.copy_(fresh)


def _hop_kernels() -> dict[str, Any]:
    """Higher-order operators a capture may meet, with the implementation each runs eagerly:
    torch's `auto_functionalized(_v2)` (an FX graph compiled without splitting wraps vLLM's
    mutating custom operators in them, e.g. its attention with output), whose dense kernel
    (`torch/_higher_order_ops/auto_functionalize.py`, registered for CompositeExplicitAutograd)
    clones the mutated arguments and calls the operator. The device graph holds what that
    kernel launches, so it is entered and recorded."""
    from torch._higher_order_ops import auto_functionalize

    return {
        "auto_functionalized": auto_functionalize.auto_functionalized_dense,
        "auto_functionalized_v2": auto_functionalize.auto_functionalized_v2_dense,
    }


class _Recorder(TorchDispatchMode):
    # Higher-order operators reach `__torch_dispatch__` (torch/_ops.py: else they raise).
    supports_higher_order_operators = True

    def __init__(self, graph: NPUGraph) -> None:
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            kernel = _hop_kernels().get(func.name())
            if kernel is None:
                raise NotImplementedError(
                    f"the stand-in's NPU graph capture does not take the higher-order operator "
                    f"{func.name()}"
                )
            with self:
                return kernel(*args, **kwargs)
        op = func._schema.name
        key = _host_code(func)
        if key is not None:  # record the device operators it issues, not the host code
            with self:
                return func._op_dk(key, *args, **kwargs)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            # A composite reaches the recorder whole where the keys above it are off (inference
            # mode, host code entered above): reshape is annotated as a view but copies a
            # non-contiguous input. Record what it issues.
            with self:
                result = func.decompose(*args, **kwargs)
            if result is not NotImplemented:
                return result
        inputs = [t for t in _tensors((args, kwargs)) if _is_npu(t)]
        if inputs and op in _HOST_READS:
            raise RuntimeError(
                f"{func} reads an npu tensor on the host while an NPU graph is being captured "
                "(the device forbids synchronising with a capturing stream)"
            )
        out = func(*args, **kwargs)
        results = _tensors(out)
        if inputs and op in _COPIES and any(
                t.device.type == "cpu" for t in results + _tensors(args[:1])):  # fmt: skip
            raise RuntimeError(
                f"{func} copies an npu tensor to the host while an NPU graph is being captured "
                "(the device forbids synchronising with a capturing stream)"
            )
        overload = op if func._overloadname == "default" else f"{op}.{func._overloadname}"
        device_work = (inputs or any(_is_npu(t) for t in results)) and not is_view(func)
        if device_work and overload not in _ALLOCATIONS and overload not in registry.HOST_ONLY:
            self.graph._entries.append(_Entry(func, args, kwargs, out))
        return out


class NPUGraph:
    """`torch.npu.NPUGraph` (torch-npu 2.10.0.post4 `torch_npu.npu.graphs.NPUGraph`): capture,
    replay, reset, pool."""

    def __init__(self) -> None:
        self._entries: list[_Entry | WaitNode | ResetNode | CollectiveNode] = []
        self._recorder: _Recorder | None = None
        self._pool: Any = None
        self._captured = False
        self.auto_dispatch_capture = False
        self.replays = 0
        self.capture_stream: Any = None
        self.group_start: int | None = None  # an open task group (graph_tasks)
        self._stopped_at: int | None = None  # the wait node a replay stopped at
        self._stopped_by: int | None = None  # the thread whose replay stopped there
        # The two latest replays as queued on their streams (stream_order; graph_tasks).
        self.previous_replay: stream_order.Ticket | None = None
        self.latest_replay: stream_order.Ticket | None = None

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise ValueError(
                f"capture_error_mode must be 'global', 'thread_local' or 'relaxed', got "
                f"{capture_error_mode!r}"
            )
        if _capturing:
            raise RuntimeError("an NPU graph capture is already under way in this process")
        if self._captured:
            raise RuntimeError("this NPUGraph holds a capture already: reset() it first")
        self._pool = pool if pool is not None else ("npu_graph_pool", next(_pool_ids))
        self.capture_stream = torch.npu.current_stream()
        self._recorder = _Recorder(self)
        _capturing.append(self)
        self._recorder.__enter__()

    def capture_end(self) -> None:
        if not _capturing or _capturing[-1] is not self or self._recorder is None:
            raise RuntimeError("capture_end() without capture_begin() on this NPUGraph")
        if self.group_start is not None:
            raise RuntimeError("capture_end() inside an open task group "
                               "(graph_task_group_begin without graph_task_group_end)")
        self._recorder.__exit__(None, None, None)
        self._recorder = None
        _capturing.pop()
        self._captured = True
        stats["captures"] += 1
        captured_operators.update(self.operators)

    def replay(self) -> None:
        """One launch of the whole graph: the host's dispatch modes (operator counters) see
        no operator of it, as the host sees one graph launch on the device. It runs until a
        wait on an event not recorded yet (module docstring)."""
        if not self._captured:
            raise RuntimeError("replay() of an NPUGraph that holds no capture")
        require_stream_free("replay() of an NPU graph")
        ticket = stream_order.queue(torch.npu.current_stream())
        self.previous_replay, self.latest_replay = self.latest_replay, ticket
        self.replays += 1
        stats["replays"] += 1
        self._run_from(0)

    def _run_from(self, start: int) -> None:
        with _disable_current_modes():
            for position in range(start, len(self._entries)):
                entry = self._entries[position]
                if isinstance(entry, WaitNode):
                    if not entry.event.recorded:
                        self._stop(position, entry.event)
                        return
                    continue
                entry.replay()

    def _stop(self, position: int, event: Any) -> None:
        self._stopped_at, self._stopped_by = position, threading.get_ident()
        event.waiters.append(self)
        with _resumed:
            _waiting.append(self)
            host_npu.set_blocked(blocked_reason())

    def resume(self) -> None:
        """The event this replay waits on was recorded: go on after the wait node."""
        position, self._stopped_at = self._stopped_at, None
        with _resumed:
            _waiting.remove(self)
            host_npu.set_blocked(blocked_reason())
        self._run_from(position + 1)
        with _resumed:
            _resumed.notify_all()

    @property
    def waiting_on(self) -> Any:
        """The event a stopped replay waits on, else None."""
        return None if self._stopped_at is None else self._entries[self._stopped_at].event

    def reset(self) -> None:
        if self._recorder is not None:
            raise RuntimeError("reset() during capture")
        self._entries, self._captured = [], False

    def pool(self) -> Any:
        if self._pool is None:
            raise RuntimeError("pool() of an NPUGraph that was never captured")
        return self._pool

    @property
    def operators(self) -> list[str]:
        """The recorded operators, in replay order (for tests and counts)."""
        return [str(entry.func) for entry in self._entries if isinstance(entry, _Entry)]

    def record_node(self, node: WaitNode | ResetNode | CollectiveNode) -> None:
        """A wait or reset node (`graph_tasks`) or a collective (`collectives`), captured
        where the capture stands; tasks of the graph that `operators` leaves out, counted in
        `stats["event_nodes"]` and `stats["collective_nodes"]`."""
        self._entries.append(node)
        stats["collective_nodes" if isinstance(node, CollectiveNode) else "event_nodes"] += 1

    @property
    def collectives(self) -> list[str]:
        """The recorded collectives, in replay order (`hccl.<ProcessGroup method>`)."""
        return [f"hccl.{entry.name}" for entry in self._entries
                if isinstance(entry, CollectiveNode)]  # fmt: skip

    def tasks(self, start: int, end: int) -> list[_Entry]:
        """The kernel launches recorded between two positions (a task group)."""
        return [entry for entry in self._entries[start:end] if isinstance(entry, _Entry)]

    def position(self) -> int:
        return len(self._entries)

    def update(self, cpu_update_input: Any) -> None:
        raise NotImplementedError(
            "torch.npu.NPUGraph.update (auto_dispatch_capture's per-operator parameter "
            "update) is not emulated by the torch_npu stand-in"
        )


class graph:  # noqa: N801 - torch.npu.graph is a class
    """`torch.npu.graph` (torch-npu 2.10.0.post4 `torch_npu.npu.graphs.graph`): captures the
    block into `npu_graph`."""

    default_capture_stream: Any = None

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool: Any = None,
        stream: Any = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        if not isinstance(npu_graph, NPUGraph):
            raise TypeError(f"torch.npu.graph: npu_graph must be an NPUGraph, got "
                            f"{type(npu_graph).__name__}")  # fmt: skip
        if auto_dispatch_capture:
            raise NotImplementedError(
                "torch.npu.graph(auto_dispatch_capture=True) is not emulated by the torch_npu "
                "stand-in"
            )
        device = torch.npu
        if type(self).default_capture_stream is None:
            type(self).default_capture_stream = device.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else type(self).default_capture_stream
        self.stream_ctx = device.stream(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        torch.npu.synchronize()
        torch.npu.empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type, exc_value, traceback) -> None:
        self.npu_graph.capture_end()
        self.stream_ctx.__exit__(exc_type, exc_value, traceback)


def capturing_graph() -> NPUGraph | None:
    """The graph under capture, if any."""
    return _capturing[-1] if _capturing else None


def blocked_reason() -> str:
    """Why the stream is blocked ("" when it is not)."""
    return "; ".join(
        f"a replay of an NPU graph waits on {graph.waiting_on!r}, which was never recorded "
        "(record it after updating the captured tasks)" for graph in _waiting
    )


def require_stream_free(what: str) -> None:
    """RuntimeError while a replay this thread stopped waits on an unrecorded event (the device
    would hang: only this thread would record it); from another thread, wait until the
    replays have gone on (module docstring)."""
    if not _waiting:
        return
    me = threading.get_ident()
    with _resumed:
        if any(graph._stopped_by == me for graph in _waiting):
            raise RuntimeError(f"{what} would wait forever on the device: {blocked_reason()}")
        if not _resumed.wait_for(lambda: not _waiting, timeout=OTHER_THREAD_WAIT_S):
            raise RuntimeError(f"{what} waited {OTHER_THREAD_WAIT_S:.0f} s in another thread: "
                               f"{blocked_reason()}")  # fmt: skip


def graph_pool_handle() -> Any:
    """An opaque token naming a graph memory pool."""
    return ("npu_graph_pool", next(_pool_ids))


def is_current_stream_capturing() -> bool:
    return bool(_capturing)


def weak_ref_tensor(tensor: Any) -> Any:
    """`torch_npu._C._weak_ref_tensor`: a tensor of the same memory, shape and strides. On the
    device it does not own the memory; here it is an alias, which keeps the memory alive (the
    graph keeps its captured tensors alive anyway)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"_weak_ref_tensor expects a Tensor, got {type(tensor).__name__}")
    return torch.ops.aten.alias(tensor)
