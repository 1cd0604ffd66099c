"""NPU graph capture and replay on the host-backed device (vllm_npu_ext/emulator/device/graphs.py).

A replay runs the captured device work again on the captured memory with the captured host
parameters: new inputs copied into the captured buffers give new results in the captured
outputs, while a tensor passed at a new address, or a host value baked in at capture, gives
the stale answer a device replay gives.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch_npu

from vllm_npu_ext.emulator.device import graphs


def capture(fn, *args, pool=None):
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph, pool=pool):
        out = fn(*args)
    return graph, out


def test_replay_recomputes_into_the_captured_output_from_the_captured_inputs():
    x = torch.randn(4, 8, device="npu")
    weight = torch.randn(8, device="npu")

    def piece(x):
        y = torch.ops.npu.npu_rms_norm(x, weight, 1e-6)[0]
        return torch.nn.functional.silu(y) * 2 + x

    expected_first = piece(x.clone())
    graph, out = capture(piece, x)
    torch.testing.assert_close(out, expected_first)
    new = torch.randn(4, 8)
    x.copy_(new)  # the runner copies inputs into the captured buffer
    graph.replay()
    torch.testing.assert_close(out.cpu(), piece(new.to("npu")).cpu())
    assert graph.replays == 1
    assert "npu.npu_rms_norm.default" in graph.operators  # one entry: one kernel launch


def test_replay_writes_in_place_and_out_arguments_again():
    buffer = torch.zeros(6, device="npu")
    source = torch.arange(6.0, device="npu")
    graph, _ = capture(lambda: buffer.add_(source))
    assert buffer.tolist() == source.tolist()
    graph.replay()
    graph.replay()
    assert buffer.tolist() == (3 * source).tolist()


def test_an_input_at_a_new_address_is_not_seen_by_the_replay():
    x = torch.ones(3, device="npu")
    graph, out = capture(lambda t: t * 10, x)
    x = torch.full((3,), 5.0, device="npu")  # new memory, not copied into the captured buffer
    graph.replay()
    assert out.tolist() == [10.0, 10.0, 10.0]  # stale: the captured buffer's values
    graph.replay()
    captured = graph._entries[0].args[0]
    captured.fill_(2.0)
    graph.replay()
    assert out.tolist() == [20.0, 20.0, 20.0]


def test_host_parameters_are_baked_in_at_capture():
    """Sequence boundaries a piece reads on the host at capture stay those of the capture."""
    x = torch.arange(8.0, device="npu")
    boundaries = [0, 3, 8]

    def piece(x):
        return torch.stack([x[a:b].sum() for a, b in itertools.pairwise(boundaries)])

    graph, out = capture(piece, x)
    boundaries[1] = 5  # the host's list changes; the graph holds slices 0:3 and 3:8
    graph.replay()
    assert out.tolist() == [3.0, 25.0]


def test_host_reads_of_device_memory_fail_during_capture():
    x = torch.ones(2, device="npu")
    for read in (lambda: x.sum().item(), lambda: x.cpu(), lambda: x.tolist()):
        graph = torch.npu.NPUGraph()
        with pytest.raises(RuntimeError, match="NPU graph is being captured"), \
                torch.npu.graph(graph):  # fmt: skip
            read()
        assert not torch.npu.is_current_stream_capturing()


def test_capture_state_pool_and_reset():
    assert not torch.npu.is_current_stream_capturing()
    graph = torch.npu.NPUGraph()
    seen = []
    with torch.npu.graph(graph, pool=torch.npu.graph_pool_handle()):
        seen.append(torch.npu.is_current_stream_capturing())
        seen.append(torch.npu.current_stream() is not torch.npu.default_stream())
        torch.ones(2, device="npu").mul_(2)
    assert seen == [True, True]
    other, _ = capture(lambda: torch.ones(1, device="npu") + 1, pool=graph.pool())
    assert other.pool() == graph.pool()
    with pytest.raises(RuntimeError, match="holds a capture already"):
        graph.capture_begin()
    graph.reset()
    with pytest.raises(RuntimeError, match="holds no capture"):
        graph.replay()
    with pytest.raises(ValueError, match="capture_error_mode"):
        torch.npu.NPUGraph().capture_begin(capture_error_mode="loose")
    with pytest.raises(NotImplementedError, match="auto_dispatch_capture"):
        torch.npu.graph(torch.npu.NPUGraph(), auto_dispatch_capture=True)


def test_cpu_work_runs_at_capture_only():
    host = torch.zeros(2)
    device = torch.zeros(2, device="npu")

    def piece():
        host.add_(1)
        device.add_(1)

    graph, _ = capture(piece)
    graph.replay()
    assert host.tolist() == [1.0, 1.0] and device.tolist() == [2.0, 2.0]


def test_weak_ref_tensor_shares_the_memory():
    x = torch.randn(3, 4, device="npu")
    ref = torch_npu._C._weak_ref_tensor(x)
    assert ref.data_ptr() == x.data_ptr() and ref.shape == x.shape and ref.device == x.device
    x.fill_(7.0)
    assert ref.cpu().eq(7.0).all()
    with pytest.raises(TypeError, match="expects a Tensor"):
        torch_npu._C._weak_ref_tensor([x])


def test_npugraph_ex_registration_as_torch_npu_leaves_it():
    import npugraph_ex
    import torchair

    def search(x):
        return torch.relu(x) * 1.0

    def replace(x):
        return torch.relu(x)

    npugraph_ex.register_replacement(search_fn=search, replace_fn=replace,
                                     example_inputs=[torch.randn(4, device="npu")])  # fmt: skip
    from vllm_npu_ext.emulator.device import npugraph_ex as stand_in

    assert len(stand_in.pattern_pass().patterns) >= 1
    with pytest.raises(AttributeError, match="npugraph_ex.CompilerConfig is not implemented"):
        npugraph_ex.CompilerConfig  # noqa: B018
    with pytest.raises(AttributeError, match="torchair.get_npu_backend is not implemented"):
        torchair.get_npu_backend  # noqa: B018
    assert graphs.is_current_stream_capturing() is False


_library = torch.library.Library("vllm", "FRAGMENT")  # vLLM's namespace for its Python ops
_library.define("graphs_test_gather(Tensor x) -> Tensor")


def _gather(x):
    """As vllm-ascend's NPU communicator all-gathers along dim 1: a buffer filled, then
    reshaped across a moved dim (a copy)."""
    buffer = torch.empty((2 * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    buffer.copy_(torch.cat([x, x * 2]))
    return buffer.reshape(2, *x.shape).movedim(0, 1).reshape(x.shape[0], 2 * x.shape[1], -1)


_library.impl("graphs_test_gather", _gather, "PrivateUse1")


@pytest.mark.parametrize("inference", [False, True])
def test_vllm_python_operators_are_captured_as_the_kernels_they_launch(inference):
    """vLLM's `direct_register_custom_op` registers Python functions for PrivateUse1 (its
    attention and communication ops): a graph holds what they launch, replayed with new inputs.
    Under inference mode (vLLM's), reshape reaches the recorder whole and is decomposed: its
    copy of a non-contiguous input is a kernel of the graph."""
    with torch.inference_mode(inference):
        x = torch.randn(3, 2, 4, device="npu")
        graph, out = capture(torch.ops.vllm.graphs_test_gather, x)
        assert graph.operators == ["aten.mul.Tensor", "aten.cat.default", "aten.copy_.default",
                                   "aten.clone.default", "aten._unsafe_view.default"]  # fmt: skip
        new = torch.randn(3, 2, 4)
        x.copy_(new)
        graph.replay()
        torch.testing.assert_close(out.cpu(), _gather(new))


def test_a_stand_in_kernel_in_vllm_namespace_is_one_launch():
    """`graphs.DEVICE_KERNELS` (the stand-in's Triton operators registered in vLLM's
    namespace) are recorded whole, as the one kernel they are on the device."""
    graphs.DEVICE_KERNELS.add("vllm::graphs_test_gather")
    try:
        graph, _ = capture(torch.ops.vllm.graphs_test_gather, torch.randn(3, 2, 4, device="npu"))
    finally:
        graphs.DEVICE_KERNELS.discard("vllm::graphs_test_gather")
    assert graph.operators == ["vllm.graphs_test_gather.default"]


_library.define("graphs_test_scale_(Tensor(a!) out, Tensor x) -> ()")


def _scale_(out, x):
    out.copy_(x * 3)


_library.impl("graphs_test_scale_", _scale_, "PrivateUse1")


def test_auto_functionalized_operators_are_captured_as_the_kernels_they_run():
    """An FX graph compiled without splitting (FULL_DECODE_ONLY) wraps vLLM's mutating custom
    operators in torch's auto_functionalized(_v2): the graph holds what their dense kernel
    runs (a clone of the mutated argument, then the operator's own kernels), replayed on new
    inputs; another higher-order operator is refused by name."""
    from torch._higher_order_ops.auto_functionalize import (
        auto_functionalized,
        auto_functionalized_v2,
    )

    op = torch.ops.vllm.graphs_test_scale_.default
    calls = {
        "v1": lambda x, out: auto_functionalized(op, out=out, x=x)[1],
        "v2": lambda x, out: auto_functionalized_v2(op, x=x, _out_base_index=0,
                                                    _all_bases=[out])[1],
    }  # fmt: skip
    for name, call in calls.items():
        x, out = torch.randn(5, device="npu"), torch.zeros(5, device="npu")
        graph, result = capture(call, x, out)
        kernels = ["aten.clone.default", "aten.mul.Tensor", "aten.copy_.default"]
        assert graph.operators == kernels, name
        new = torch.randn(5)
        x.copy_(new)
        graph.replay()
        torch.testing.assert_close(result.cpu(), new * 3, msg=name)
        assert torch.all(out.cpu() == 0), name  # functional: the argument itself untouched
    with pytest.raises(NotImplementedError, match="higher-order operator cond"):
        capture(lambda x: torch.cond(x.sum() > 0, lambda v: v + 1, lambda v: v - 1, (x,)),
                torch.randn(3, device="npu"))  # fmt: skip


def test_allocations_are_not_replayed():
    """`new_empty` is memory, not a kernel: a replay must not overwrite what the graph's other
    kernels wrote into it (its fresh result holds whatever memory held)."""
    x = torch.randn(4, device="npu")

    def piece(x):
        buffer = x.new_empty((2, 4))
        buffer[0].copy_(x)
        buffer[1].copy_(x * 2)
        return buffer

    graph, out = capture(piece, x)
    assert all("empty" not in op for op in graph.operators)
    x.copy_(torch.arange(4.0))
    graph.replay()
    torch.testing.assert_close(out.cpu(), torch.stack([torch.arange(4.0), 2 * torch.arange(4.0)]))
