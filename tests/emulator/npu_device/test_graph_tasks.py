"""Updating captured FIA tasks between NPU graph replays (vllm_npu_ext/emulator/device/
graph_tasks.py): what a full graph of cache-free attention rests on.

A captured FIA keeps the host-side sequence lengths of its capture: replayed for another batch
it attends across that batch's boundaries (the wrong answer). The pattern vllm-ascend uses for
its full graphs (an ExternalEvent wait, a task group, FIA `.out` with a max workspace; after
each replay a task update with the new lengths and a record of the event) gives the right one;
a replay whose event is never recorded blocks the stream. Streams keep the device's order
(emulator/device/stream_order.py): an update must be ordered after the graph's previous
replay, and recording the event on a stream ordered after the replay that waits for it is a
deadlock; both are refused.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch_npu

from vllm_npu_ext.emulator.device import graph_tasks, graphs

BF16 = torch.bfloat16
TOKENS, HEADS, KV_HEADS, DIM = 8, 4, 2, 128
MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1).to("npu")


@pytest.fixture(autouse=True)
def _nothing_left_open():
    """A failed test leaves no update open and no replay waiting for the next one."""
    yield
    while graph_tasks._updates:
        graph_tasks._updates.pop().__exit__(None, None, None)
    for graph in list(graphs._waiting):
        graph.waiting_on.record(torch.npu.Stream())  # a stream ordered after nothing


def fia_kwargs(lengths):
    return dict(atten_mask=MASK, actual_seq_lengths=list(lengths),
                actual_seq_lengths_kv=list(lengths), num_heads=HEADS,
                num_key_value_heads=KV_HEADS, scale=DIM**-0.5, input_layout="TND",
                sparse_mode=3)  # fmt: skip


def inputs(seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(TOKENS, heads, DIM, generator=generator).to(BF16)
            for heads in (HEADS, KV_HEADS, KV_HEADS)]  # fmt: skip


def reference(qkv, lengths):
    """FIA run eagerly on `qkv` with `lengths` (the answer a batch with those boundaries needs)."""
    q, k, v = (t.to("npu") for t in qkv)
    return torch_npu.npu_fused_infer_attention_score(q, k, v, **fia_kwargs(lengths))[0].cpu()


class CapturedFia:
    """One FIA captured as vllm-ascend captures it for full graphs (vllm-ascend 0.23.0.post1
    `AscendAttentionBackendImpl.full_graph_fia`),
    its workspace sized for the lengths `sized_for` (default: the capture's)."""

    def __init__(self, lengths, with_event=True, sized_for=None):
        self.q, self.k, self.v = (t.to("npu") for t in inputs(0))
        self.out = torch.empty(TOKENS, HEADS, DIM, dtype=BF16, device="npu")
        self.lse = torch.empty(1, dtype=BF16, device="npu")
        self.graph = torch.npu.NPUGraph()
        self.event = torch.npu.ExternalEvent() if with_event else None
        with torch.npu.graph(self.graph):
            stream = torch.npu.current_stream()
            self.workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
                self.q, self.k, self.v, **fia_kwargs(sized_for or lengths))
            if self.event is not None:
                self.event.wait(stream)
                self.event.reset(stream)
            torch.npu.graph_task_group_begin(stream)
            self.issue(lengths)
            self.handle = torch.npu.graph_task_group_end(stream)
        self.update_stream = torch.npu.Stream()
        self.barrier = torch.npu.Event()  # recorded before each replay (begin)

    def begin(self):
        """Before a step's replay: mark the stream, so the step's update waits for the work
        queued before the replay (the previous replay)."""
        self.barrier.record(torch.npu.current_stream())

    def issue(self, lengths):
        torch_npu.npu_fused_infer_attention_score.out(
            self.q, self.k, self.v, **fia_kwargs(lengths), workspace=self.workspace,
            out=[self.out, self.lse])  # fmt: skip

    def load(self, qkv):
        for buffer, value in zip((self.q, self.k, self.v), qkv, strict=True):
            buffer.copy_(value)

    def update(self, lengths):
        with torch.npu.stream(self.update_stream):
            self.update_stream.wait_event(self.barrier)
            torch.npu.graph_task_update_begin(self.update_stream, self.handle)
            self.issue(lengths)
            torch.npu.graph_task_update_end(self.update_stream)
            self.event.record(self.update_stream)


def test_a_replay_without_the_update_attends_with_the_captured_boundaries():
    captured = CapturedFia([3, 8], with_event=False)
    batch = inputs(1)
    captured.load(batch)
    captured.graph.replay()
    wrong, right = reference(batch, [3, 8]), reference(batch, [5, 8])
    assert torch.equal(captured.out.cpu(), wrong)
    assert not torch.allclose(captured.out.cpu().float(), right.float(), atol=1e-2)


@pytest.mark.parametrize("steps", [[[5, 8], [1, 2, 8], [8]]])
def test_each_replay_updated_after_launch_attends_with_its_own_boundaries(steps):
    """The update comes after the replay's launch, as vllm-ascend's runner issues it
    (vllm-ascend 0.23.0.post1 `NPUModelRunner._model_forward`: `run_model()`, then
    `_update_full_graph_params_if_needed`): the replay waits on the event until then. Sequence
    counts differ between steps (a dummy tail sequence pads a batch to the capture size)."""
    captured = CapturedFia([8], sized_for=[1, 2, 8])
    assert "npu._npu_fused_infer_attention_score_get_max_workspace" not in " ".join(
        captured.graph.operators)  # host-side sizing: no task in the graph
    for seed, lengths in enumerate(steps, start=2):
        batch = inputs(seed)
        captured.load(batch)
        captured.begin()
        captured.graph.replay()
        assert captured.graph.waiting_on is captured.event
        captured.update(lengths)
        assert captured.graph.waiting_on is None
        assert torch.equal(captured.out.cpu(), reference(batch, lengths))


def test_a_replay_whose_event_is_never_recorded_blocks_the_stream():
    captured = CapturedFia([8])
    captured.graph.replay()
    for wait in (torch.npu.synchronize, lambda: captured.out.cpu(),
                 lambda: torch.ones(2, device="npu") + 1, captured.graph.replay):  # fmt: skip
        with pytest.raises(RuntimeError, match="wait forever.*ExternalEvent"):
            wait()
    captured.update([8])  # recording the event lets the replay finish
    torch.npu.synchronize()
    assert torch.equal(captured.out.cpu(), reference(inputs(0), [8]))


def test_another_threads_synchronize_waits_until_the_replay_goes_on():
    """vLLM's async output thread synchronizes its copy's event while the main thread's replay
    waits for its task update: on the device that thread waits until the main thread records
    the update's event, and so does it here (raising would fail a server at random)."""
    captured = CapturedFia([8])
    captured.begin()
    captured.graph.replay()
    seen = []
    waiter = threading.Thread(target=lambda: (torch.npu.Event().synchronize(),
                                              torch.npu.synchronize(),
                                              seen.append(captured.graph.waiting_on)))  # fmt: skip
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not seen  # waiting, not raising
    captured.update([8])
    waiter.join(30)
    assert not waiter.is_alive() and seen == [None]
    assert torch.equal(captured.out.cpu(), reference(inputs(0), [8]))


@pytest.mark.parametrize(
    "issue, error, match",
    [(lambda c: None, RuntimeError, "count and types must match"),
     (lambda c: (c.issue([8]), c.issue([8])), RuntimeError, "count and types must match"),
     (lambda c: torch.add(c.q, 1, out=c.q), RuntimeError, "count and types must match"),
     (lambda c: c.q + 1, NotImplementedError, "cannot be re-issued")],
)  # fmt: skip
def test_an_update_must_reissue_the_captured_tasks(issue, error, match):
    captured = CapturedFia([8])
    captured.graph.replay()
    stream = captured.update_stream
    with torch.npu.stream(stream), pytest.raises(error, match=match):
        torch.npu.graph_task_update_begin(stream, captured.handle)
        issue(captured)
        torch.npu.graph_task_update_end(stream)
    if error is NotImplementedError:  # nothing was re-issued: the update cannot end well
        with pytest.raises(RuntimeError, match="the update issued \\[\\]"):
            torch.npu.graph_task_update_end(stream)
    captured.update([8])  # a correct update after a refused one still works
    assert captured.graph.waiting_on is None


def test_task_groups_and_updates_keep_to_their_streams():
    captured = CapturedFia([8])
    with pytest.raises(RuntimeError, match="must be different from that in the graph capture"):
        torch.npu.graph_task_update_begin(captured.graph.capture_stream, captured.handle)
    with pytest.raises(RuntimeError, match="must be capturing"):
        torch.npu.graph_task_group_begin(torch.npu.current_stream())
    with pytest.raises(TypeError, match="graph_task_group_end"):
        torch.npu.graph_task_update_begin(captured.update_stream, object())
    graph, other = torch.npu.NPUGraph(), torch.npu.Stream()
    with pytest.raises(RuntimeError, match="holds no task"), torch.npu.graph(graph):
        stream = torch.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        with pytest.raises(RuntimeError, match="not the capturing stream"):
            torch.npu.graph_task_group_end(other)
        torch.npu.graph_task_group_end(stream)
    assert isinstance(captured.handle, torch_npu._C._NPUTaskGroupHandle)


def test_host_code_operators_are_captured_as_the_device_work_they_issue():
    """A graph holds kernel launches: a custom operator whose kernel is host code (as
    vllm_npu_ext::cache_free_attention's) is recorded as the operators it issues."""
    library = torch.library.Library("graph_tasks_test", "FRAGMENT")
    library.define("host_code(Tensor x, Tensor(a!) out) -> ()")

    def host_code(x, out):
        out.copy_(torch_npu.npu_swiglu(x))

    library.impl("host_code", host_code, "CompositeExplicitAutograd")
    x = torch.randn(3, 8, device="npu")
    out = torch.empty(3, 4, device="npu")
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        torch.ops.graph_tasks_test.host_code(x, out)
    assert graph.operators == ["npu.npu_swiglu.default", "aten.copy_.default"]
    x.copy_(torch.randn(3, 8))
    graph.replay()
    torch.testing.assert_close(out.cpu(), torch_npu.npu_swiglu(x).cpu())
    assert graphs.capturing_graph() is None


@pytest.mark.parametrize("order", ["event before the replay", "synchronize", "none"])
def test_an_update_must_be_ordered_after_the_previous_replay(order):
    """Step 2's update changes the tasks step 1's replay runs; on the device step 1's replay
    may still be running unless the update stream waits for it. Waiting for an event recorded
    between the two replays, or synchronising, orders it; nothing (step 1's stale barrier,
    recorded before step 1's replay) does not."""
    captured = CapturedFia([8])
    captured.begin()
    captured.graph.replay()
    captured.update([8])
    if order == "event before the replay":
        captured.begin()
    elif order == "synchronize":
        torch.npu.synchronize()
    captured.graph.replay()
    if order == "none":
        with pytest.raises(RuntimeError, match="previous replay of this graph may still be"):
            captured.update([8])
        return
    captured.update([8])
    assert torch.equal(captured.out.cpu(), reference(inputs(0), [8]))


def test_recording_the_event_after_the_replay_that_waits_for_it_is_a_deadlock():
    """A barrier recorded after the replay was queued orders the update stream after that
    replay, which waits for the update's event: neither would run on the device."""
    captured = CapturedFia([8])
    captured.graph.replay()
    captured.begin()
    with pytest.raises(RuntimeError, match="neither would ever run"):
        captured.update([8])
    with pytest.raises(RuntimeError, match="neither would ever run"):
        captured.event.record(torch.npu.current_stream())  # the replay's own stream


def test_a_workspace_serves_at_most_the_sequences_it_was_sized_for():
    """Sized for two sequences (emulator/operators/attention_workspace.py states why)."""
    captured = CapturedFia([8], sized_for=[3, 8])
    captured.begin()
    captured.graph.replay()
    with pytest.raises(ValueError, match="sized for 2 sequences, not for this call's 3"):
        captured.update([1, 2, 8])
