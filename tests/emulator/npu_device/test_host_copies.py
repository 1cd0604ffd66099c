"""Non-blocking copies from pageable host memory to the npu device (`device/host_copies.py`):
the source must stay alive and unchanged until the host knows the stream reached the copy."""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext.emulator.device import host_copies


@pytest.fixture(autouse=True)
def _nothing_pending():
    host_copies.PENDING.items.clear()
    yield
    host_copies.PENDING.items.clear()


def copy_from(source, dst=None):
    dst = torch.empty(source.shape, device="npu") if dst is None else dst
    dst.copy_(source, non_blocking=True)
    return dst


@pytest.mark.parametrize("settle", ["device", "stream", "event"])
def test_an_unchanged_live_source_is_settled_at_every_kind_of_sync(settle):
    source = torch.arange(4.0)
    dst = copy_from(source)
    assert len(host_copies.PENDING.items) == 1
    if settle == "device":
        torch.npu.synchronize()
    elif settle == "stream":
        torch.npu.current_stream().synchronize()
    else:
        event = torch.npu.Event()
        event.record()
        event.synchronize()
    assert host_copies.PENDING.items == [] and dst.cpu().tolist() == [0, 1, 2, 3]


def test_pinned_sources_and_blocking_copies_are_not_held():
    copy_from(torch.ones(4, pin_memory=True))
    torch.empty(4, device="npu").copy_(torch.ones(4))  # blocking: the stream synchronises
    assert host_copies.PENDING.items == []


def test_a_source_written_again_before_the_sync_is_refused_with_its_origin():
    source = torch.ones(4)
    copy_from(source)
    source.fill_(2.0)
    with pytest.raises(host_copies.PageableCopyRace, match="written again.*test_host_copies"):
        torch.npu.synchronize()


def test_a_source_freed_before_the_sync_is_refused():
    copy_from(torch.ones(4) * 3)  # a temporary: freed when the copy returns
    with pytest.raises(host_copies.PageableCopyRace, match="freed"):
        torch.npu.synchronize()
    torch.ones(2).to("npu", non_blocking=True)
    with pytest.raises(host_copies.PageableCopyRace, match="freed"):
        torch.npu.synchronize()


def test_an_event_recorded_before_the_copy_does_not_settle_it():
    event = torch.npu.Event()
    event.record()
    source = torch.ones(4)
    copy_from(source)
    event.synchronize()  # the stream is known done before the copy only
    assert len(host_copies.PENDING.items) == 1
    source.fill_(0.0)
    with pytest.raises(host_copies.PageableCopyRace):
        torch.npu.synchronize()


def test_another_package_s_copy_is_reported_once_per_place_not_refused(caplog):
    """vllm-ascend's PCP path copies a freed temporary so (`PCPManager._list_to_tensor`): the
    stand-in runs it, with a warning naming the place, and counts each occurrence."""
    code = compile("def to_device(values):\n    dst = torch.zeros(len(values), device='npu')\n"
                   "    dst.copy_(torch.tensor(values), non_blocking=True)\n    return dst\n",
                   "vllm_ascend/worker/pcp_utils.py", "exec")  # fmt: skip
    namespace = {"__name__": "vllm_ascend.worker.pcp_utils", "torch": torch}
    exec(code, namespace)
    with caplog.at_level("WARNING", logger=host_copies.__name__):
        for _ in range(2):
            assert namespace["to_device"]([1, 2]).cpu().tolist() == [1, 2]
            torch.npu.synchronize()
    counts = dict(host_copies.PENDING.foreign)
    assert list(counts.values()) == [2] and "to_device" in next(iter(counts))
    assert sum("not refused" in record.getMessage() for record in caplog.records) == 1
    host_copies.PENDING.foreign.clear()
