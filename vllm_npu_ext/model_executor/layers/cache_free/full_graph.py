"""One graph replay per forward for cache-free pooling: attention captured inside the graph, its
sequence lengths updated after each replay.

FIA in TND layout takes each batch's sequence boundaries as host lists, so a graph that captured it
would replay the boundaries of its capture. vllm-ascend 0.23 solves this for its own full decode
graphs and for its vision encoder's graphs (`AscendAttentionBackendImpl.full_graph_fia` and
`.update_graph_params`, `worker/encoder_acl_graph.py` `update_encoder_graph_params`,
`AscendMMEncoderAttention._forward_capture_fia`): at capture, each FIA is
`npu_fused_infer_attention_score.out` with a workspace sized for the capture's shapes
(`_npu_fused_infer_attention_score_get_max_workspace`), inside a task group, behind the wait of an
`ExternalEvent`; after each replay is launched, the host re-issues each FIA with the step's lengths
between `graph_task_update_begin/end` on a second stream and records the event, which lets the
replay's FIA run. Padding to the capture size is one more sequence (`PackedSeqs.padded_to`).

What this module adds to that pattern, because a replay is asynchronous on the device:
- the workspace of each graph is sized for the most sequences a replay of it may carry
  (`max_num_seqs` requests and the padding sequence, at most one per token), not for the
  capture's one sequence: torch-npu 2.10.0.post4 calls it the "maximum workspace size"
  (`_op_plugin_docs.py`, `_npu_fused_infer_attention_score_get_max_workspace`) without saying
  whether that maximum covers other batch counts than the call's, and vllm-ascend's captures
  size it with the most requests each graph serves;
- ordering between steps: `begin_forward` records an event on the compute stream before the
  forward is launched, and the update stream waits on it, so the next step's update cannot
  change the tasks of a replay that has not finished (vllm-ascend's runner synchronises the
  stream before each forward in piecewise mode, `worker/model_runner_v1.py` `_model_forward`;
  this does not rely on it);
- every captured event is recorded even when an update raises (the replay would otherwise wait
  forever), and a second capture of a size that holds tasks already is refused (the first
  graph's tasks would be left without updates).

Here the same pattern runs inside our attention op (`op.py`) when it is called while a
graph is being captured, so that vLLM's piecewise machinery captures the whole forward as one
graph (the op is then not a splitting op: `qwen3_config`), and the model's forward updates the
captured tasks after the compiled model returns (`after_forward`). Where FIA's documented TND
domain does not hold (not bfloat16, head_dim other than 128/192: `ops.attention`), the op stays
a splitting op and runs between piecewise graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import ModuleType
from typing import Any

import torch

from vllm_npu_ext.model_executor import forward_context
from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass
class CapturedAttention:
    """One layer's FIA in one captured graph: what its update re-issues (weak references to
    the graph's own memory, as vllm-ascend keeps them), and the boundaries it was captured
    with."""

    handle: Any
    event: Any
    tensors: tuple[torch.Tensor, ...]  # query, key, value, output, softmax_lse placeholder
    scale: float
    workspace: torch.Tensor
    captured_seqs: PackedSeqs


def widest_batch(num_tokens: int, max_num_seqs: int) -> PackedSeqs:
    """The batch of `num_tokens` rows with the most sequences a replay may carry: `max_num_seqs`
    requests and the padding sequence, each at least one token (what its workspace is sized
    for: module docstring)."""
    num_seqs = min(num_tokens, max_num_seqs + 1)
    return PackedSeqs.from_seq_lens([1] * (num_seqs - 1) + [num_tokens - num_seqs + 1])


class FullGraphAttention:
    """A model's captured FIA tasks, by the graph's token count and layer, and whether the
    last forward ran attention on the host (eagerly or capturing) or replayed a graph.

    `max_num_seqs`: the scheduler's limit on requests per step (vLLM's
    `scheduler_config.max_num_seqs`). Figures kept for logs, selfcheck and tests: `updates`
    (replays updated), `update_calls` (task updates issued, one per layer and replay),
    `widest_update` (the sequence lengths of the update with the most sequences).
    """

    def __init__(self, max_num_seqs: int) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.max_num_seqs = max_num_seqs
        self.captured: dict[int, dict[str, CapturedAttention]] = {}
        self.workspaces: dict[int, torch.Tensor] = {}
        self.ran_on_host = False
        self.updates = 0
        self.update_calls = 0
        self.widest_update: tuple[int, ...] = ()
        self._update_stream: Any = None
        self._forward_began: Any = None  # event on the compute stream, recorded per forward

    def capture(self, npu: ModuleType, query, key, value, output, layer_name: str,
                scale: float, seqs: PackedSeqs) -> None:  # fmt: skip
        """Capture one layer's FIA into the graph being captured (module docstring)."""
        self.ran_on_host = True
        tokens = query.shape[0]
        if layer_name in self.captured.get(tokens, {}):
            raise RuntimeError(
                f"a graph of {tokens} tokens holds the attention tasks of {layer_name} already; "
                "capturing that size again would leave the first graph's tasks without updates"
            )
        kwargs = attention.fia_tnd_kwargs(query, key, seqs, scale)
        workspace = self.workspaces.get(tokens)
        if workspace is None:
            widest = attention.fia_tnd_kwargs(
                query, key, widest_batch(tokens, self.max_num_seqs), scale)  # fmt: skip
            workspace = npu._npu_fused_infer_attention_score_get_max_workspace(
                query, key, value, **widest)  # fmt: skip
            self.workspaces[tokens] = workspace
        stream = npu.npu.current_stream()
        event = npu.npu.ExternalEvent()
        event.wait(stream)
        event.reset(stream)
        placeholder = torch.empty(1, dtype=query.dtype, device=query.device)
        npu.npu.graph_task_group_begin(stream)
        npu.npu_fused_infer_attention_score.out(
            query, key, value, **kwargs, workspace=workspace, out=[output, placeholder])
        handle = npu.npu.graph_task_group_end(stream)
        weak = npu._C._weak_ref_tensor
        tensors = tuple(weak(t) for t in (query, key, value, output, placeholder))
        captured = CapturedAttention(handle, event, tensors, scale, weak(workspace), seqs)
        self.captured.setdefault(tokens, {})[layer_name] = captured

    def begin_forward(self, npu: ModuleType | None) -> None:
        """Before the model's forward is launched: mark the compute stream, so this step's
        update waits for the work before it (the previous replay) to finish."""
        self.ran_on_host = False
        if npu is None or not self.captured or npu.npu.is_current_stream_capturing():
            return
        if self._forward_began is None:
            self._forward_began = npu.npu.Event()
        self._forward_began.record(npu.npu.current_stream())

    def step_seqs(self, layer_name: str, num_tokens: int, task: CapturedAttention) -> PackedSeqs:
        """The boundaries this step's update gives `task`: the running batch's."""
        return forward_context.packed_seqs_for_layer(layer_name, num_tokens)

    def after_forward(self, npu: ModuleType | None, num_tokens: int) -> None:
        """After the model's forward: if it replayed a graph of `num_tokens` tokens, give each
        captured FIA this step's sequence lengths and let it run (module docstring)."""
        tasks = self.captured.get(num_tokens)
        if self.ran_on_host or not tasks or npu is None:
            return
        if self._update_stream is None:
            self._update_stream = npu.npu.Stream()
        stream = self._update_stream
        pending = list(tasks.items())
        with npu.npu.stream(stream):
            try:
                if self._forward_began is not None:
                    stream.wait_event(self._forward_began)
                while pending:
                    layer_name, task = pending[0]
                    self._update(npu, stream, task, self.step_seqs(layer_name, num_tokens, task))
                    pending.pop(0)[1].event.record(stream)
            finally:  # an unrecorded event would stop the replay for good
                for _, task in pending:
                    task.event.record(stream)
        self.updates += 1

    def _update(self, npu: ModuleType, stream: Any, task: CapturedAttention,
                seqs: PackedSeqs) -> None:  # fmt: skip
        query, key, value, output, placeholder = task.tensors
        kwargs = attention.fia_tnd_kwargs(query, key, seqs, task.scale)
        npu.npu.graph_task_update_begin(stream, task.handle)
        try:
            npu.npu_fused_infer_attention_score.out(
                query, key, value, **kwargs, workspace=task.workspace,
                out=[output, placeholder])  # fmt: skip
        except BaseException:
            with contextlib.suppress(RuntimeError):  # close the update; the error is the FIA's
                npu.npu.graph_task_update_end(stream)
            raise
        npu.npu.graph_task_update_end(stream)
        self.update_calls += 1
        if seqs.num_seqs > len(self.widest_update):
            self.widest_update = tuple(seqs.seq_lens)
