"""The torch_npu stand-in's own rules, without installing it (installing renames PrivateUse1 for
the rest of the process; tests/with_vllm_ascend runs it installed, under vllm-ascend's code)."""

from __future__ import annotations

import pytest

from vllm_npu_ext.emulator.device import npu as device
from vllm_npu_ext.emulator.runtime import strict as _strict


@pytest.fixture
def npu():
    return device.build()


def test_a_missing_name_raises_naming_it(npu):
    with pytest.raises(AttributeError, match=r"torch\.npu\.set_sync_debug_mode is not impl"):
        npu.set_sync_debug_mode  # noqa: B018
    assert not hasattr(npu, "caching_allocator_alloc")
    assert not hasattr(npu, "__path__")  # dunder probes stay plain


def test_names_read_from_outside_are_recorded(npu):
    before = _strict.touched["torch.npu.current_stream"]
    npu.current_stream()
    assert _strict.touched["torch.npu.current_stream"] == before + 1


def test_name_only_classes_refuse_to_be_built(npu):
    with pytest.raises(NotImplementedError, match=npu.memory.MemPool.qualified_name):
        npu.memory.MemPool()
    # Graph capture is implemented (emulator/device/graphs.py,
    # tests/emulator/npu_device/test_graphs.py); its context manager checks what it is given.
    with pytest.raises(TypeError, match="must be an NPUGraph"):
        npu.graph(None)


def test_streams_and_events_keep_their_contract(npu):
    stream = npu.Stream()
    with npu.stream(stream):
        assert npu.current_stream() is stream
    assert npu.current_stream() is npu.default_stream()
    event = stream.record_event()
    assert event.query() and stream.query()
    with pytest.raises(TypeError, match="expected torch.npu.Event"):
        stream.wait_event(stream)
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    start.record()
    end.record()
    assert start.elapsed_time(end) >= 0
    with pytest.raises(RuntimeError, match="enable_timing"):
        npu.Event().elapsed_time(end)


def test_devices_and_memory_are_the_hosts(npu):
    assert npu.is_available() and npu.device_count() == 1
    npu.set_device(2)
    with npu.device(0):
        assert npu.current_device() == 0
    assert npu.current_device() == 2
    npu.set_device(0)
    with pytest.raises(RuntimeError, match="invalid device index -1"):
        npu.set_device(-1)
    free, total = npu.mem_get_info()
    assert 0 < free <= total
    stats = npu.memory_stats()
    assert 0 <= stats["allocated_bytes.all.current"] <= stats["allocated_bytes.all.peak"]
    assert stats["allocated_bytes.all.current"] == npu.memory_allocated() == total - free
    npu.config.allow_internal_format = True
    with pytest.raises(AttributeError):
        npu.config.other_flag = True
