"""Our attention op captured inside an NPU graph and updated per replay
(vllm_npu_ext/model_executor/layers/full_graph.py), on the stand-in's npu device.

The model's forward does what this test does around a replay: `begin_forward`, the replay,
`after_forward` with the step's token count. Skipping the update leaves the replay blocked at
the first attention (the device would hang; the stand-in refuses the next device work), so a
broken update cannot pass silently as stale sequence boundaries.
"""

from __future__ import annotations

import pytest
import torch
import torch_npu

from vllm_npu_ext import compat
from vllm_npu_ext.model_executor.layers import cache_free_op
from vllm_npu_ext.model_executor.layers.full_graph import FullGraphAttention
from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs

BF16 = torch.bfloat16
TOKENS, HEADS, KV_HEADS, DIM = 16, 4, 2, 128
LAYERS = ("layers.0.attn", "layers.1.attn")


class Layer:
    """What the op reads from vLLM's forward context: the layer's full-graph state."""

    def __init__(self, state):
        self.full_graph = state


@pytest.fixture
def step(monkeypatch):
    """The running batch's sequence lengths, as the op and the update read them."""
    state = FullGraphAttention()
    current = {"seqs": PackedSeqs.from_seq_lens([TOKENS])}
    monkeypatch.setattr(compat, "layer_module", lambda name: Layer(state))
    monkeypatch.setattr(compat, "packed_seqs_for_layer",
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
        state.begin_forward()
        graph.replay()
        state.after_forward(torch_npu, TOKENS)
        assert torch.equal(out.cpu(), expected(values, lengths))
    assert state.updates == 2


def test_a_replay_without_the_update_blocks_instead_of_attending_stale_boundaries(step):
    state, current = step
    graph, _, out = capture(state)
    current["seqs"] = PackedSeqs.from_seq_lens([3, 5])
    state.begin_forward()
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
    state.begin_forward()
    two_layers(*(t.to("npu") for t in qkv(3)))
    state.after_forward(torch_npu, TOKENS)
    assert state.updates == 0 and state.ran_on_host


def test_capturing_attention_that_is_not_updated_per_replay_is_refused(monkeypatch):
    """In piecewise mode the op is a splitting op and never captured; captured without the
    full-graph state it would replay its capture's boundaries: refused."""
    monkeypatch.setattr(compat, "layer_module", lambda name: None)
    graph = torch.npu.NPUGraph()
    buffers = [t.to("npu") for t in qkv(0)]
    with pytest.raises(RuntimeError, match="must be a splitting op"), torch.npu.graph(graph):
        two_layers(*buffers)
