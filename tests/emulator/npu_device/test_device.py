"""`npu` tensors: host memory, aliasing views, in-place operators, strided and cross-device
copies, resizing, device indices, pinned host memory, events.

Each case runs the same function on a CPU tensor and on its `npu` copy: values, shapes,
strides and which tensors share memory must agree, and the npu side must stay on npu."""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext.emulator.device import host_npu

NPU = torch.device("npu", 0)


def base(dtype=torch.float32):
    return torch.arange(24, dtype=dtype).reshape(4, 6)


def same(npu_tensor: torch.Tensor, cpu_tensor: torch.Tensor) -> None:
    assert npu_tensor.device.type == "npu"
    assert npu_tensor.shape == cpu_tensor.shape
    assert npu_tensor.stride() == cpu_tensor.stride()
    assert npu_tensor.dtype == cpu_tensor.dtype
    assert torch.equal(npu_tensor.cpu(), cpu_tensor)


def test_npu_tensors_are_host_memory_counted_by_the_allocator():
    before = host_npu.memory_figures()
    x = torch.empty(1000, dtype=torch.float32, device="npu")
    during = host_npu.memory_figures()
    assert (x.device, x.is_npu, x.is_cpu) == (NPU, True, False)
    assert during.allocated_bytes - before.allocated_bytes == 4000
    assert during.live_allocations == before.live_allocations + 1
    assert torch.npu.memory_allocated() == during.allocated_bytes
    free, total = torch.npu.mem_get_info()
    assert total - free == during.allocated_bytes  # device memory: what npu tensors hold
    assert torch.npu.max_memory_allocated() >= during.allocated_bytes
    cpu_tensor = torch.empty(1000)  # host tensors do not count against the device
    assert torch.npu.memory_allocated() == during.allocated_bytes
    del cpu_tensor
    view = host_npu.host_view(x)
    assert view.device.type == "cpu" and view.data_ptr() == x.data_ptr()
    del x, view
    assert host_npu.memory_figures().allocated_bytes == before.allocated_bytes
    torch.npu.reset_peak_memory_stats()
    assert torch.npu.max_memory_allocated() == torch.npu.memory_allocated()


def test_the_device_memory_can_be_set_below_the_hosts(monkeypatch):
    """VLLM_NPU_EXT_EMULATE_DEVICE_MIB: what a multi-rank server sizes its KV cache from."""
    monkeypatch.setenv("VLLM_NPU_EXT_EMULATE_DEVICE_MIB", "1024")
    x = torch.empty(1000, dtype=torch.float32, device="npu")
    free, total = torch.npu.mem_get_info()
    assert total == 1 << 30 == torch.npu.get_device_properties(0).total_memory
    assert total - free == host_npu.memory_figures().allocated_bytes
    del x
    monkeypatch.setenv("VLLM_NPU_EXT_EMULATE_DEVICE_MIB", "1 GiB")
    with pytest.raises(ValueError, match="VLLM_NPU_EXT_EMULATE_DEVICE_MIB"):
        torch.npu.mem_get_info()
    monkeypatch.delenv("VLLM_NPU_EXT_EMULATE_DEVICE_MIB")
    assert torch.npu.mem_get_info()[1] > 1 << 30  # the host's MemTotal


VIEWS = {
    "transpose": lambda t: t.t(),
    "select": lambda t: t[1],
    "slice": lambda t: t[:, 2:5],
    "step slice": lambda t: t[::2, 1::3],
    "view": lambda t: t.view(6, 4),
    "reshape": lambda t: t.reshape(24),
    "split": lambda t: torch.split(t, 3, dim=1)[1],
    "unbind": lambda t: t.unbind(0)[2],
    "diagonal": lambda t: t.diagonal(),
    "as_strided": lambda t: t.as_strided((3, 2), (5, 1), 2),
    "unflatten": lambda t: t.unflatten(1, (2, 3)),
    "narrow": lambda t: t.narrow(0, 1, 2),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "permute": lambda t: t.unflatten(1, (2, 3)).permute(2, 0, 1),
}


@pytest.mark.parametrize("name", VIEWS)
def test_views_alias_the_npu_memory(name):
    """A view is an npu tensor over the same npu storage: writes through it reach the base."""
    cpu, npu = base(), base().to("npu")
    cpu_view, npu_view = VIEWS[name](cpu), VIEWS[name](npu)
    same(npu_view, cpu_view)
    assert npu_view.untyped_storage().data_ptr() == npu.untyped_storage().data_ptr()
    assert npu_view.storage_offset() == cpu_view.storage_offset()
    cpu_view.mul_(-3).add_(1)
    npu_view.mul_(-3).add_(1)
    same(npu, cpu)


IN_PLACE = {
    "add_ on a transposed view": lambda t: t.t().add_(torch.ones(6, 4, device=t.device)),
    "mul_ scalar on a slice": lambda t: t[1:3, ::2].mul_(2.5),
    "masked_fill_": lambda t: t.masked_fill_(t > 10, -1.0),
    "index_put_": lambda t: t.index_put_(
        (torch.tensor([0, 3], device=t.device), torch.tensor([5, 1], device=t.device)),
        torch.tensor([7.0, 8.0], device=t.device)),
    "copy_ from a clone": lambda t: t[1:].copy_(t[:-1].clone()),
    "copy_ from an overlapping view": lambda t: t[:, :3].copy_(t[:, 1:4]),
    "add_ of its own transpose": lambda t: t[:, :4].add_(t[:, :4].t()[:, :4].t()),
    "clamp_": lambda t: t.clamp_(3, 17),
    "zero_ on a column": lambda t: t[:, 4].zero_(),
    "out= resized": lambda t: torch.add(t, 1, out=torch.empty(0, device=t.device)),
    "out= into a view": lambda t: torch.mul(t[:, :3], 2, out=t[:, 3:]),
    "index_copy_": lambda t: t.index_copy_(
        0, torch.tensor([2, 0], device=t.device), torch.full((2, 6), 9.0, device=t.device)),
    "scatter_add_": lambda t: t.scatter_add_(
        1, torch.tensor([[0, 0], [1, 2], [5, 5], [3, 3]], device=t.device),
        torch.ones(4, 2, device=t.device)),
}


@pytest.mark.parametrize("name", IN_PLACE)
def test_in_place_operators_write_the_npu_tensor(name):
    cpu, npu = base(), base().to("npu")
    cpu_result, npu_result = IN_PLACE[name](cpu), IN_PLACE[name](npu)
    same(npu_result, cpu_result)
    same(npu, cpu)


def test_in_place_and_out_operators_return_their_argument():
    x = torch.zeros(3, device="npu")
    assert x.add_(1) is x
    out = torch.empty(3, device="npu")
    assert torch.add(x, x, out=out) is out
    assert torch.equal(out.cpu(), torch.full((3,), 2.0))


def test_strided_copies_in_every_direction():
    cpu = base()
    npu = torch.zeros(6, 8, device="npu")
    npu[1:5, 1:7].copy_(cpu)  # cpu -> npu into a strided window
    expected = torch.zeros(6, 8)
    expected[1:5, 1:7] = cpu
    same(npu, expected)
    same(npu.t()[2:7:2], expected.t()[2:7:2])
    assert torch.equal(npu.t()[2:7:2].cpu(), expected.t()[2:7:2])  # npu (strided) -> cpu
    other = torch.empty(8, 6, dtype=torch.bfloat16, device="npu")
    other.copy_(npu.t())  # npu -> npu, strided source, dtype conversion
    same(other, expected.t().to(torch.bfloat16).contiguous())
    target = torch.empty(8, 6).t()  # cpu, non-contiguous
    target.copy_(npu)
    assert torch.equal(target, expected)
    contiguous = npu.t().contiguous()
    same(contiguous, expected.t().contiguous())
    assert contiguous.untyped_storage().data_ptr() != npu.untyped_storage().data_ptr()


def test_cross_device_copies_and_pinned_host_memory():
    pinned = torch.arange(8, dtype=torch.float16).pin_memory()
    assert pinned.is_pinned() and not torch.arange(8).is_pinned()
    assert torch.empty(4, pin_memory=True).is_pinned()
    on_npu = pinned.to("npu", non_blocking=True)
    torch.npu.synchronize()
    same(on_npu, pinned)
    assert pinned.npu().device == NPU and on_npu.cpu().device.type == "cpu"
    back = torch.empty(8, dtype=torch.float16, pin_memory=True)
    back.copy_(on_npu, non_blocking=True)
    assert torch.equal(back, pinned)
    assert on_npu.to(torch.float32).device == NPU
    assert torch.equal(on_npu.clone().cpu(), pinned)
    with pytest.raises(RuntimeError, match="pinned memory is host memory"):
        torch.empty(2, device="npu", pin_memory=True)


def test_factories_and_random_numbers_on_npu():
    assert torch.equal(torch.zeros(2, 3, device="npu").cpu(), torch.zeros(2, 3))
    assert torch.equal(torch.full((2,), 7, device="npu").cpu(), torch.full((2,), 7))
    assert torch.equal(torch.arange(5, device="npu").cpu(), torch.arange(5))
    strided = torch.empty_strided((2, 3), (1, 2), device="npu")
    assert strided.stride() == (1, 2) and strided.device == NPU



def test_npu_generators_are_the_devices_and_advance():
    """torch.manual_seed seeds the npu default generators too; npu draws come from them (not
    the host's), and an explicit npu generator advances with its draws."""
    torch.manual_seed(3)
    drawn = torch.randn(4, device="npu")
    host = torch.randn(4)  # the host generator did not advance for the npu draw
    torch.manual_seed(3)
    assert torch.equal(drawn.cpu(), torch.randn(4)) and torch.equal(host, drawn.cpu())
    assert torch.npu.initial_seed() == 3
    generator = torch.Generator(device="npu").manual_seed(11)
    assert generator.device == NPU
    first = torch.rand(3, device="npu", generator=generator)
    second = torch.rand(3, device="npu", generator=generator)
    reference = torch.Generator().manual_seed(11)
    assert torch.equal(first.cpu(), torch.rand(3, generator=reference))
    assert torch.equal(second.cpu(), torch.rand(3, generator=reference))
    torch.npu.manual_seed(5)
    with torch.npu.device(1):
        torch.npu.manual_seed(6)
        assert torch.npu.initial_seed() == 6
    assert torch.npu.initial_seed() == 5


def test_resize_and_set_keep_npu_storage_semantics():
    x = torch.arange(4, dtype=torch.float32, device="npu")
    x.resize_(10)
    assert x.shape == (10,) and torch.equal(x[:4].cpu(), torch.arange(4, dtype=torch.float32))
    y = torch.empty(0, device="npu")
    y.set_(x.untyped_storage(), 2, (2, 2), (2, 1))
    assert y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    y.fill_(-1)
    assert x[2:6].cpu().tolist() == [-1.0] * 4
    assert x.untyped_storage().device == NPU


def test_scalars_lists_and_printing():
    x = torch.tensor([[1.5, 2.0], [3.0, 4.0]], device="npu")
    assert x.sum().item() == 10.5 and x.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert "device='npu:0'" in repr(x)
    assert bool((x > 1).all()) is True


def test_device_indices_follow_the_current_device():
    assert torch.npu.current_device() == 0
    with torch.npu.device(1):
        assert torch.npu.current_device() == 1
        x = torch.empty(3, device="npu")
        assert x.device == torch.device("npu", 1)
        assert (x + 1).device == torch.device("npu", 1)
    assert torch.npu.current_device() == 0
    y = torch.ones(2, device="npu:2")
    assert y.device.index == 2 and torch.npu.current_device() == 0
    assert (y * 2).device.index == 2
    with pytest.raises(RuntimeError, match="invalid device index"):
        torch.npu.set_device(64)


def test_events_of_the_device_guard_record_and_time():
    start = torch.Event(device="npu", enable_timing=True)
    end = torch.Event(device="npu", enable_timing=True)
    start.record()
    torch.ones(64, 64, device="npu").matmul(torch.ones(64, 64, device="npu"))
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert start.elapsed_time(end) >= 0.0


def test_what_the_device_does_not_provide_fails_naming_it():
    with pytest.raises(NotImplementedError, match="'Sparsenpu' backend"):
        torch.empty(2, device="npu", layout=torch.sparse_coo)

