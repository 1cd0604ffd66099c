"""Updating the tasks of a captured NPU graph between replays: task groups, task updates and
`ExternalEvent`, as torch-npu 2.10.0.post4 exposes them (`torch.npu.graph_task_group_begin/end`,
`graph_task_update_begin/end`: the functions of those names in `torch_npu/npu/graphs.py`; class
`ExternalEvent`, `torch_npu/npu/streams.py`) and as vllm-ascend 0.23.0.post1 uses them for FIA in
full graphs (`AscendAttentionBackendImpl.full_graph_fia` capture,
`AscendAttentionBackendImpl.update_graph_params` update; `update_encoder_graph_params` in
`vllm_ascend/worker/encoder_acl_graph.py`, `AscendMMEncoderAttention._forward_capture_fia`).

Rules, with their sources (op-plugin 26.0.0 `docs/en/custom_APIs/torch_npu-npu/
torch_npu-npu-graph_task_{group,update}_{begin,end}.md`, CANN runtime
`aclmdlRICaptureTaskUpdateBegin.md`):
- a task group is opened and closed on the stream that is capturing, the same stream at both
  ends; its handle names the kernel launches captured in between;
- an update runs on a stream that is not capturing and differs from the capture stream; its
  tasks, re-issued between `graph_task_update_begin(stream, handle)` and `_end(stream)`, must
  match the group's task count and types; they replace the captured tasks' parameters (the
  host-side sequence lengths of FIA) and are not executed then;
- an update changes the parameters every later execution of the tasks reads, so it must be
  ordered after every replay of the graph but the latest (the one waiting for it): on the
  device the next step's update could otherwise land while the previous replay still runs
  (`stream_order`; vllm-ascend 0.23 synchronises before each full-graph replay,
  `compilation/acl_graph.py` `ACLGraphWrapper.__call__`, for this reason);
- `ExternalEvent` may be waited on before it is recorded (a record queued after the replay
  that waits for it, on its stream or one ordered after it, is a deadlock: refused); waited
  on inside a capture it is a wait node of the graph (`graphs`: a replay stops there until
  the event is recorded), reset inside a capture a reset node (each replay clears it again).

In an update the stand-in re-issues only operators that write into given `out` tensors (FIA's
`.out`, the one vllm-ascend updates); any other raises NotImplementedError.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import graphs, stream_order

NAME = "torch.npu"
# Operators that only describe memory (a view, an alias, an allocation): they run as usual
# inside an update.
_MEMORY_OPS = frozenset({"empty.memory_format", "empty_like.default", "empty_strided.default"})


def _stream(stream: Any) -> Any:
    return torch.npu.current_stream() if stream is None else stream


@dataclasses.dataclass(frozen=True, eq=False)
class TaskGroupHandle:
    """`torch_npu._C._NPUTaskGroupHandle`: the kernel launches of one task group."""

    graph: graphs.NPUGraph
    start: int
    end: int

    @property
    def tasks(self) -> list:
        return self.graph.tasks(self.start, self.end)


def _capturing_graph(where: str, stream: Any) -> graphs.NPUGraph:
    graph = graphs.capturing_graph()
    if graph is None:
        raise RuntimeError(f"{NAME}.{where}: the stream must be capturing an NPU graph")
    if stream is not graph.capture_stream:
        raise RuntimeError(f"{NAME}.{where}: {stream!r} is not the capturing stream "
                           f"{graph.capture_stream!r}")  # fmt: skip
    return graph


def graph_task_group_begin(stream: Any) -> None:
    graph = _capturing_graph("graph_task_group_begin", stream)
    if graph.group_start is not None:
        raise RuntimeError(f"{NAME}.graph_task_group_begin: a task group is open already")
    graph.group_start = graph.position()


def graph_task_group_end(stream: Any) -> TaskGroupHandle:
    graph = _capturing_graph("graph_task_group_end", stream)
    if graph.group_start is None:
        raise RuntimeError(f"{NAME}.graph_task_group_end without graph_task_group_begin")
    handle = TaskGroupHandle(graph, graph.group_start, graph.position())
    graph.group_start = None
    if not handle.tasks:
        raise RuntimeError(f"{NAME}.graph_task_group_end: the group holds no task")
    return handle


class _Update(TorchDispatchMode):
    """Collects the re-issued tasks of one update instead of running them."""

    def __init__(self, handle: TaskGroupHandle, stream: Any) -> None:
        super().__init__()
        self.handle, self.stream, self.tasks = handle, stream, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.__name__ in _MEMORY_OPS or graphs.is_view(func):
            return func(*args, **kwargs)
        out = kwargs.get("out")
        if not isinstance(out, (torch.Tensor, list, tuple)):
            raise NotImplementedError(
                f"{func} cannot be re-issued in a task update by the torch_npu stand-in (only "
                "operators writing into given `out` tensors, such as FIA's .out)"
            )
        self.tasks.append((func, args, kwargs))
        return out if isinstance(out, torch.Tensor) else tuple(out)

    def apply(self) -> None:
        captured = self.handle.tasks
        given = [func for func, _, _ in self.tasks]
        if given != [entry.func for entry in captured]:
            raise RuntimeError(
                f"{NAME}.graph_task_update_end: the update issued {[str(f) for f in given]}; "
                f"the task group holds {[str(e.func) for e in captured]} (count and types must "
                "match, aclmdlRICaptureTaskUpdateBegin)"
            )
        for entry, (_, args, kwargs) in zip(captured, self.tasks, strict=True):
            entry.args, entry.kwargs = args, kwargs


_updates: list[_Update] = []


def graph_task_update_begin(stream: Any, handle: TaskGroupHandle) -> None:
    if not isinstance(handle, TaskGroupHandle):
        raise TypeError(f"{NAME}.graph_task_update_begin: handle must come from "
                        f"graph_task_group_end, got {type(handle).__name__}")  # fmt: skip
    if graphs.capturing_graph() is not None:
        raise RuntimeError(f"{NAME}.graph_task_update_begin: the update stream must not be "
                           "capturing")  # fmt: skip
    if stream is handle.graph.capture_stream:
        raise RuntimeError(
            f"{NAME}.graph_task_update_begin: the stream in the graph update phase must be "
            "different from that in the graph capture phase (torch_npu docs)"
        )
    if _updates:
        raise RuntimeError(f"{NAME}.graph_task_update_begin: an update is open already")
    previous = handle.graph.previous_replay
    if previous is not None and not stream_order.ordered_before(previous, stream):
        raise RuntimeError(
            f"{NAME}.graph_task_update_begin: the previous replay of this graph may still be "
            f"running on {previous.stream!r} and would read the updated parameters; make the "
            "update stream wait for an event recorded after it (Stream.wait_event) or "
            "synchronise first (stream_order)"
        )
    update = _Update(handle, stream)
    update.__enter__()
    _updates.append(update)


def graph_task_update_end(stream: Any) -> None:
    if not _updates:
        raise RuntimeError(f"{NAME}.graph_task_update_end without graph_task_update_begin")
    update = _updates[-1]
    if stream is not update.stream:
        raise RuntimeError(f"{NAME}.graph_task_update_end: begin and end must use the same "
                           "stream")  # fmt: skip
    _updates.pop()
    update.__exit__(None, None, None)
    update.apply()
    graphs.stats["task_updates"] += 1


class ExternalEvent:
    """`torch.npu.ExternalEvent` (module docstring): an event that may be waited on first."""

    def __init__(self) -> None:
        self.recorded = False
        self.waiters: list[graphs.NPUGraph] = []

    def record(self, stream: Any = None) -> None:
        if graphs.capturing_graph() is not None:
            raise NotImplementedError(f"{NAME}.ExternalEvent.record inside a capture is not "
                                      "emulated")  # fmt: skip
        stream = _stream(stream)
        for graph in self.waiters:
            if stream_order.ordered_before(graph.latest_replay, stream):
                raise RuntimeError(
                    f"{NAME}.ExternalEvent.record on {stream!r}, which is ordered after the "
                    "replay waiting for this event: on the device neither would ever run "
                    "(record it on a stream that does not wait for that replay)"
                )
        self.recorded = True
        waiters, self.waiters = self.waiters, []
        for graph in waiters:
            graph.resume()

    def wait(self, stream: Any = None) -> None:
        if graphs.capturing_graph() is None:
            raise NotImplementedError(f"{NAME}.ExternalEvent.wait outside a capture is not "
                                      "emulated")  # fmt: skip
        _capturing_graph("ExternalEvent.wait", _stream(stream)).record_node(graphs.WaitNode(self))

    def reset(self, stream: Any = None) -> None:
        if graphs.capturing_graph() is None:
            self.recorded = False
            return
        _capturing_graph("ExternalEvent.reset", _stream(stream)).record_node(graphs.ResetNode(self))

    def query(self) -> bool:
        return self.recorded

    def __repr__(self) -> str:
        return f"<{NAME}.ExternalEvent {id(self):#x} recorded={self.recorded}>"
