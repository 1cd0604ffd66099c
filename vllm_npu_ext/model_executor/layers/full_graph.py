"""One graph replay per forward for cache-free pooling: attention captured inside the graph, its
sequence lengths updated after each replay.

FIA in TND layout takes each batch's sequence boundaries as host lists, so a graph that
captured it would replay the boundaries of its capture. vllm-ascend 0.23 solves this for its
own full decode graphs and for its vision encoder's graphs (`attention/attention_v1.py:
806-982` and :454-799, `worker/encoder_acl_graph.py:135-253`, `ops/mm_encoder_attention.py:
223-313`): at capture, each FIA is `npu_fused_infer_attention_score.out` with a workspace sized
for the capture's shapes (`_npu_fused_infer_attention_score_get_max_workspace`), inside a task
group, behind the wait of an `ExternalEvent`; after each replay is launched, the host re-issues
each FIA with the step's lengths between `graph_task_update_begin/end` on a second stream and
records the event, which lets the replay's FIA run. Padding to the capture size is one more
sequence (`PackedSeqs.padded_to`).

Here the same pattern runs inside our attention op (`cache_free_op`) when it is called while a
graph is being captured, so that vLLM's piecewise machinery captures the whole forward as one
graph (the op is then not a splitting op: `qwen3_config`), and the model's forward updates the
captured tasks after the compiled model returns (`after_forward`). Where FIA's documented TND
domain does not hold (not bfloat16, head_dim other than 128/192: `ops.attention`), the op stays
a splitting op and runs between piecewise graphs.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import torch

from vllm_npu_ext import compat
from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass
class CapturedAttention:
    """One layer's FIA in one captured graph: what its update re-issues (weak references to
    the graph's own memory, as vllm-ascend keeps them)."""

    handle: Any
    event: Any
    tensors: tuple[torch.Tensor, ...]  # query, key, value, output, softmax_lse placeholder
    scale: float
    workspace: torch.Tensor


class FullGraphAttention:
    """A model's captured FIA tasks, by the graph's token count and layer, and whether the
    last forward ran attention on the host (eagerly or capturing) or replayed a graph."""

    def __init__(self) -> None:
        self.captured: dict[int, dict[str, CapturedAttention]] = {}
        self.workspaces: dict[int, torch.Tensor] = {}
        self.ran_on_host = False
        self.updates = 0  # graph replays updated (for logs and tests)
        self._update_stream: Any = None

    def capture(self, npu: ModuleType, query, key, value, output, layer_name: str,
                scale: float, seqs: PackedSeqs) -> None:  # fmt: skip
        """Capture one layer's FIA into the graph being captured (module docstring)."""
        self.ran_on_host = True
        tokens = query.shape[0]
        kwargs = attention.fia_tnd_kwargs(query, key, seqs, scale)
        workspace = self.workspaces.get(tokens)
        if workspace is None:
            workspace = npu._npu_fused_infer_attention_score_get_max_workspace(
                query, key, value, **kwargs)  # fmt: skip
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
        captured = CapturedAttention(handle, event, tensors, scale, weak(workspace))
        self.captured.setdefault(tokens, {})[layer_name] = captured

    def begin_forward(self) -> None:
        self.ran_on_host = False

    def after_forward(self, npu: ModuleType | None, num_tokens: int) -> None:
        """After the model's forward: if it replayed a graph of `num_tokens` tokens, give each
        captured FIA this step's sequence lengths and let it run (module docstring)."""
        tasks = self.captured.get(num_tokens)
        if self.ran_on_host or not tasks or npu is None:
            return
        if self._update_stream is None:
            self._update_stream = npu.npu.Stream()
        stream = self._update_stream
        with npu.npu.stream(stream):
            for layer_name, task in tasks.items():
                seqs = compat.packed_seqs_for_layer(layer_name, num_tokens)
                query, key, value, output, placeholder = task.tensors
                kwargs = attention.fia_tnd_kwargs(query, key, seqs, task.scale)
                npu.npu.graph_task_update_begin(stream, task.handle)
                npu.npu_fused_infer_attention_score.out(
                    query, key, value, **kwargs, workspace=task.workspace,
                    out=[output, placeholder])  # fmt: skip
                npu.npu.graph_task_update_end(stream)
                task.event.record(stream)
        self.updates += 1
