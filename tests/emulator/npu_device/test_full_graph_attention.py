"""Our attention op captured inside an NPU graph and updated per replay
(vllm_npu_ext/model_executor/layers/cache_free/full_graph.py), on the stand-in's npu device.

The model's forward does what this test does around a replay: `begin_forward`, the replay,
`after_forward` with the step's token count. Skipping the update leaves the replay blocked at
the first attention (the device would hang; the stand-in refuses the next device work), so a
broken update cannot pass silently as stale sequence boundaries. The steps here never
synchronise, so the second step's update is ordered after the first replay only by the
barrier `begin_forward` records (the stand-in refuses it otherwise: stream_order.py).
The real lookup of each step's boundaries, after the compiled model returns, runs in the
engines of tests/with_vllm_ascend/test_serving_under_vllm_ascend.py.
"""

from __future__ import annotations

import pytest
import torch
import torch_npu

from vllm_npu_ext.model_executor import forward_context
from vllm_npu_ext.model_executor.layers.cache_free import op as cache_free_op
from vllm_npu_ext.model_executor.layers.cache_free.full_graph import FullGraphAttention
from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs

BF16 = torch.bfloat16
TOKENS, HEADS, KV_HEADS, DIM = 16, 4, 2, 128
LAYERS = ("layers.0.attn", "layers.1.attn")
MAX_NUM_SEQS = 4  # [1, 1, 1, 2] and its padding sequence: the widest batch of 16 tokens


class Layer:
    """What the op reads from vLLM's forward context: the layer's full-graph state."""

    def __init__(self, state):
        self.full_graph = state


@pytest.fixture
def step(monkeypatch):
    return make_step(monkeypatch, MAX_NUM_SEQS)


def make_step(monkeypatch, max_num_seqs):
    """The running batch's sequence lengths, as the op and the update read them."""
    state = FullGraphAttention(max_num_seqs)
    current = {"seqs": PackedSeqs.from_seq_lens([TOKENS])}
    monkeypatch.setattr(forward_context, "layer_module", lambda name: Layer(state))
    monkeypatch.setattr(forward_context, "packed_seqs_for_layer",
                        lambda name, tokens: current["seqs"].padded_to(tokens))  # fmt: skip
    return state, current


def qkv(seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(TOKENS, heads, DIM, generator=generator).to(BF16)
            for heads in (HEADS, KV_HEADS, KV_HEADS)]  # fmt: skip


def two_layers(q, k, v):
    """Two attention layers, the second reading the first's result (as a model's do)."""
    out = q
    for name in LAYERS:
        out = cache_free_op.cache_free_attention(
            out, k, v, name, DIM**-0.5, True, attention.FUSED_INFER, in_graph=True)
    return out


def expected(values, lengths):
    q, k, v = (t.to("npu") for t in values)
    seqs = PackedSeqs.from_seq_lens(lengths).padded_to(TOKENS)
    out = q
    for _ in LAYERS:
        out = attention.varlen_attention(out, k, v, seqs, DIM**-0.5, npu=torch_npu)
    return out.cpu()


def capture(state):
    buffers = [t.to("npu") for t in qkv(0)]
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        out = two_layers(*buffers)
    assert sorted(state.captured[TOKENS]) == sorted(LAYERS)
    return graph, buffers, out


@pytest.mark.parametrize("lengths", [[3, 5], [16], [1, 1, 1, 2]])
def test_each_replay_attends_with_its_own_sequence_boundaries(step, lengths):
    """Batches padded to the capture size: the padding is one more sequence."""
    state, current = step
    graph, buffers, out = capture(state)
    for seed in (1, 2):
        values = qkv(seed)
        for buffer, value in zip(buffers, values, strict=True):
            buffer.copy_(value)
        current["seqs"] = PackedSeqs.from_seq_lens(lengths)
        state.begin_forward(torch_npu)
        graph.replay()
        state.after_forward(torch_npu, TOKENS)
        assert torch.equal(out.cpu(), expected(values, lengths))
    assert state.updates == 2 and state.update_calls == 2 * len(LAYERS)
    padded = PackedSeqs.from_seq_lens(lengths).padded_to(TOKENS)
    assert state.widest_update == tuple(padded.seq_lens)


def run_steps(state, current, steps):
    """Replays of one captured graph, one per batch of `steps`, each updated as the model does."""
    graph, buffers, out = capture(state)
    for lengths in steps:
        current["seqs"] = PackedSeqs.from_seq_lens(lengths)
        state.begin_forward(torch_npu)
        graph.replay()
        state.after_forward(torch_npu, TOKENS)
    return out


def test_the_next_update_is_refused_without_the_barrier_before_the_replay(step, monkeypatch):
    """begin_forward's event orders the update after the previous replay; without it the
    second step's update could change tasks the first replay still runs."""
    state, current = step
    monkeypatch.setattr(state, "begin_forward", lambda npu: setattr(state, "ran_on_host", False))
    with pytest.raises(RuntimeError, match="previous replay of this graph may still be running"):
        run_steps(state, current, [[3, 5], [16]])


def test_an_update_that_raises_still_lets_every_replayed_attention_run(step, monkeypatch):
    state, current = step
    graph, _, out = capture(state)

    def fail_second(layer_name, num_tokens, task):
        if layer_name == LAYERS[1]:
            raise RuntimeError("no boundaries for " + layer_name)
        return current["seqs"].padded_to(num_tokens)

    monkeypatch.setattr(state, "step_seqs", fail_second)
    state.begin_forward(torch_npu)
    graph.replay()
    with pytest.raises(RuntimeError, match="no boundaries for"):
        state.after_forward(torch_npu, TOKENS)
    assert torch.isfinite(out.cpu().float()).all()  # no replay left waiting: the stream is free


def test_a_second_capture_of_one_size_is_refused(step):
    state, _ = step
    capture(state)
    with pytest.raises(RuntimeError, match="holds the attention tasks of layers.0.attn already"):
        capture(state)


def test_the_workspace_serves_the_widest_batch_a_replay_may_carry(monkeypatch):
    """Sized at capture for max_num_seqs + 1 sequences, not for the capture's one: five
    sequences replay above (max_num_seqs 4); with a limit of two requests the workspace serves
    three, and five are refused (emulator/operators/attention_workspace.py)."""
    state, current = make_step(monkeypatch, max_num_seqs=2)
    with pytest.raises(ValueError, match="sized for 3 sequences, not for this call's 5"):
        run_steps(state, current, [[1, 1, 1, 2]])


def test_a_replay_without_the_update_blocks_instead_of_attending_stale_boundaries(step):
    state, current = step
    graph, _, out = capture(state)
    current["seqs"] = PackedSeqs.from_seq_lens([3, 5])
    state.begin_forward(torch_npu)
    graph.replay()  # the model's forward returned without after_forward
    with pytest.raises(RuntimeError, match="wait forever"):
        out.cpu()
    state.after_forward(torch_npu, TOKENS)  # the update lets it finish
    assert torch.isfinite(out.cpu().float()).all()


def test_an_eager_step_of_the_same_size_is_not_updated(step):
    """A forward that ran attention on the host (no replay, e.g. beyond the capture sizes)
    needs no update: after_forward leaves the captured tasks alone."""
    state, _ = step
    capture(state)
    state.begin_forward(torch_npu)
    two_layers(*(t.to("npu") for t in qkv(3)))
    state.after_forward(torch_npu, TOKENS)
    assert state.updates == 0 and state.ran_on_host


def test_capturing_attention_that_is_not_updated_per_replay_is_refused(monkeypatch):
    """In piecewise mode the op is a splitting op and never captured; captured without the
    full-graph state it would replay its capture's boundaries: refused."""
    monkeypatch.setattr(forward_context, "layer_module", lambda name: None)
    monkeypatch.setattr(forward_context, "packed_seqs_for_layer",
                        lambda name, tokens: PackedSeqs((0, tokens)))  # a capture's dummy batch
    graph = torch.npu.NPUGraph()
    buffers = [t.to("npu") for t in qkv(0)]
    with pytest.raises(RuntimeError, match="must be a splitting op"), torch.npu.graph(graph):
        two_layers(*buffers)
