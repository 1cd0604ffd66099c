"""Non-blocking copies from pageable host memory to the device, checked as the device reads them.

The rule. A non-blocking host-to-device copy is queued on the current stream and reads the host
memory when the stream reaches it: torch_npu's `copy_` (`copy_between_host_and_device_opapi`
in `torch_npu/csrc/aten/ops/op_api/CopyKernelOpApi.cpp`, Ascend/pytorch) launches an
asynchronous copy task for `non_blocking=True` and records an event only in its caching host
allocator, i.e. for pinned blocks, which it then keeps until the copy is done; a pageable
source is neither kept alive nor protected from the host writing it again. That source was read
from a public copy of Ascend/pytorch whose release is not identified (the torch-npu
2.10.0.post4 wheel ships it compiled): whether 2.10.0.post4's task queue stages pageable memory
first is not known here, so the stand-in takes the stricter reading. The blocking branch
synchronises the stream first and is not checked.

What the stand-in does. Its copies complete at once (host memory); the C++ device hands every
non-blocking copy from pageable memory into npu memory to `record` (through the
`npu_host::pageable_copy` operator it defines), which queues the copy on the current stream
(`stream_order`) and keeps a snapshot of the source's bytes and a weak reference to its
storage. When the host learns that the stream has passed the copy (a synchronize of the device
or of that stream, the synchronize of an event recorded after it: `stream_order.finished`,
`synchronized`), the source must still exist and hold the bytes it was copied with; otherwise
`PageableCopyRace` is raised there, naming where the copy was made: on the device it would
have read freed or newer memory.

Whose copies are refused. Copies made by this package (and its tests) are refused; copies made
by another package's code (`FOREIGN`: vLLM, vllm-ascend, torch) are reported once per place
with a warning and counted (`foreign`), not refused: the stand-in runs their code as it is.
vllm-ascend 0.23.0.post1 makes such a copy on its PCP path (`PCPManager._list_to_tensor`: a
temporary list's tensor copied non-blocking and freed at once), a race on a device unless
torch_npu stages pageable memory, which is not known here.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from . import stream_order

FOREIGN = ("vllm", "vllm_ascend", "torch")  # packages whose copies are reported, not refused
logger = logging.getLogger(__name__)


class PageableCopyRace(RuntimeError):
    """A pageable source was freed or rewritten before the stream reached its copy."""


@dataclasses.dataclass
class PendingCopy:
    ticket: stream_order.Ticket
    storage: StorageWeakRef
    view: tuple  # (storage offset, size, stride, dtype) of the source
    snapshot: torch.Tensor
    origin: str
    foreign: bool  # made by another package's code: reported, not refused


@dataclasses.dataclass
class PendingCopies:
    """The copies whose stream the host has not yet seen pass them."""

    items: list[PendingCopy] = dataclasses.field(default_factory=list)
    checked: int = 0  # copies settled, for tests and probes
    foreign: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def record(self, source: torch.Tensor, stream: Any) -> None:
        if source.numel() == 0:  # no bytes to read
            return
        origin, package = _origin()
        self.items.append(PendingCopy(
            stream_order.queue(stream), StorageWeakRef(source.untyped_storage()),
            (source.storage_offset(), tuple(source.shape), source.stride(), source.dtype),
            source.detach().clone(), origin, package in FOREIGN,
        ))  # fmt: skip

    def settle(self) -> None:
        """Check and forget every copy its stream is known to have passed."""
        reached = [i for i in self.items if i.ticket.stream.order.done >= i.ticket.position]
        self.items = [i for i in self.items if all(i is not r for r in reached)]
        for item in reached:
            self.checked += 1
            problem = _problem(item)
            if problem is None:
                continue
            message = (f"a non-blocking copy from pageable host memory to the npu device: "
                       f"{problem}. Copied at {item.origin}")  # fmt: skip
            if not item.foreign:
                raise PageableCopyRace(message)
            if not self.foreign[item.origin]:
                logger.warning("torch_npu stand-in (not refused: another package's code): %s",
                               message)  # fmt: skip
            self.foreign[item.origin] += 1


def _origin() -> tuple[str, str]:
    """Where the copy was made (the innermost frames outside the stand-in and torch's own
    dispatch) and the top-level package of the innermost one."""
    frames, frame = [], sys._getframe(2)
    while frame is not None and len(frames) < 3:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("vllm_npu_ext.emulator", "torch.")) or frames:
            frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                           module))  # fmt: skip
        frame = frame.f_back
    if not frames:
        return "unknown", ""
    origin = "; ".join(f"{name} ({file}, line {line})" for file, line, name, _ in frames)
    return origin, frames[0][3].partition(".")[0]


# The copies of this process (its device's streams are the process's, `npu.py`).
PENDING = PendingCopies()


def _problem(item: PendingCopy) -> str | None:
    """What the device would have read wrongly, or None."""
    if item.storage.expired():
        return ("the source was freed before the stream reached the copy (torch_npu reads it "
                "then; copy from pinned memory, kept until the copy is done)")
    storage = torch.UntypedStorage._new_with_weak_ptr(item.storage.cdata)
    offset, size, stride, dtype = item.view
    now = torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    if not torch.equal(now, item.snapshot):
        return ("the source was written again before the stream reached the copy (the device "
                "would copy the new bytes)")
    return None


def install(pending: PendingCopies, current_stream) -> torch.library.Library:
    """Register the CPU kernel of `npu_host::pageable_copy`: record each copy with
    `current_stream()`. Returns the library (kept alive by the caller)."""
    library = torch.library.Library("npu_host", "IMPL")
    library.impl("pageable_copy", lambda source: pending.record(source, current_stream()), "CPU")
    return library
