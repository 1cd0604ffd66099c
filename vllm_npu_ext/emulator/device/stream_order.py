"""What the host may assume has finished on the device: the ordering of streams, kept as the
device keeps it, though host kernels finish when they return.

On the device a kernel launch, a graph replay and an event record are queued on a stream and
run later, in order on that stream, unordered across streams, except where a stream waits for
an event recorded on another (`Stream.wait_event`, `wait_stream`) or the host waits
(`synchronize` of the device, a stream or an event; torch-npu 2.10.0.post4 `torch_npu/npu/
streams.py`, `Stream`/`Event`, the CUDA stream semantics they mirror). Here every queued item is
numbered per stream: a stream's position is the count of items queued on it; an event records
the position of its stream; a wait makes the waiting stream ordered after that position; a
synchronize marks a stream done up to its position. A queued item is "ordered before" a stream
when it was queued on that stream, its stream is done past it, or that stream waits for a
position at or past it.

What the stand-in checks with it (`graph_tasks.graph_task_update_begin`): a task update of a
graph must be ordered after every replay of that graph but the latest (the latest waits for the
update's events; an earlier one still running would read the new parameters). Only direct
waits and synchronisation count: a wait on an event of a stream that itself waited on a third
is not followed, and a blocking copy to the host, which on the device also waits for its
stream, is not credited. Both make the check stricter than the device, never looser.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

_streams: weakref.WeakSet = weakref.WeakSet()  # every stream made, for synchronize()


@dataclasses.dataclass
class Order:
    """A stream's bookkeeping: items queued, items the host knows finished, and the
    positions of other streams it waits for (by the other stream's id)."""

    queued: int = 0
    done: int = 0
    waits_for: dict[int, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Ticket:
    """One queued item: its stream and its position there."""

    stream: Any
    position: int


def track(stream: Any) -> Order:
    """Start keeping `stream`'s order (called by each new stream)."""
    _streams.add(stream)
    return Order()


def queue(stream: Any) -> Ticket:
    """An item queued on `stream` (a graph replay)."""
    stream.order.queued += 1
    return Ticket(stream, stream.order.queued)


def mark(stream: Any) -> Ticket:
    """The position an event recorded on `stream` now stands for."""
    return Ticket(stream, stream.order.queued)


def wait(stream: Any, ticket: Ticket | None) -> None:
    """`stream` runs nothing queued from now on before `ticket`'s item has finished."""
    if ticket is None or ticket.stream is stream:
        return
    key = id(ticket.stream)
    stream.order.waits_for[key] = max(stream.order.waits_for.get(key, 0), ticket.position)


def finished(ticket: Ticket | None) -> None:
    """The host waited for `ticket` (an event's synchronize)."""
    if ticket is not None:
        ticket.stream.order.done = max(ticket.stream.order.done, ticket.position)


def synchronized(stream: Any = None) -> None:
    """The host waited for `stream`, or for every stream when None."""
    for each in [stream] if stream is not None else list(_streams):
        each.order.done = each.order.queued


def ordered_before(ticket: Ticket, stream: Any) -> bool:
    """Whether `ticket`'s item has finished before anything queued on `stream` from now on."""
    other = ticket.stream
    return (
        other is stream
        or other.order.done >= ticket.position
        or stream.order.waits_for.get(id(other), 0) >= ticket.position
    )
