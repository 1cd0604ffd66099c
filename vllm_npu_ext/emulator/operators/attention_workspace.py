"""FIA workspaces for ACL-graph capture: which shapes each one was sized for.

`_npu_fused_infer_attention_score_get_max_workspace` returns a workspace tensor sized by the aclnn's
maximum over every sequence-length assignment of the call's shapes (its docstring in torch-npu
2.10.0.post4's `_op_plugin_docs.py`: "获取最大workspace size并创建一个此size大小的tensor"), so that
FIA `.out` captured in a graph can take new host lengths on every replay
(`graph_task_update_begin/end`) with the memory it was captured with (vllm-ascend 0.23.0.post1:
`AscendAttentionBackendImpl.full_graph_fia`, `AscendMMEncoderAttention._forward_capture_fia`). The
stand-in cannot compute the aclnn's size; it remembers, per workspace memory, the shapes and host
arguments the workspace was asked for, and FIA `.out` refuses a workspace it did not size, or one
sized for other shapes (more tokens, other heads or layouts would need a larger workspace on the
device: a silent overrun, not an error there).

The batch count: in TND layout it is the number of entries of `actual_seq_lengths`, a host
argument, not a shape. torch-npu 2.10.0.post4's documentation of
`_npu_fused_infer_attention_score_get_max_workspace` (`_op_plugin_docs.py`) says "maximum
workspace size" without saying whether that maximum covers more sequences than the sizing call
carried, and a batched kernel's tiling depends on its batch. vllm-ascend 0.23, as read, sizes
each graph's workspace at capture on a batch of the most requests the graph serves: its full
decode graphs on the uniform-decode dummy batch, one request per token
(`AscendAttentionBackendImpl.full_graph_fia`), its encoder graphs on `bsz` sequences
(`AscendMMEncoderAttention._forward_capture_fia`). Until a device settles it
(docs/verifying-on-ascend.md), the stand-in takes the safe reading: a workspace serves any
length assignment of at most as many sequences as it was sized for, and FIA `.out` with more
is refused.
"""

from __future__ import annotations

import torch

from ..runtime.schema import BoundCall

FIA = "npu_fused_infer_attention_score"
# What a maximum workspace covers: everything but the per-step sequence lengths.
_SIZED_BY = ("num_heads", "num_key_value_heads", "input_layout", "sparse_mode", "block_size")
# (data address, bytes) -> (signature, sequences sized for)
_sized: dict[tuple[int, int], tuple[tuple, int]] = {}


def _signature(call: BoundCall) -> tuple:
    tensors = tuple(
        None if value is None else (tuple(value.shape), value.dtype)
        for value in (call.query, call.key, call.value, call.block_table)
    )
    return tensors + tuple(call.arguments[name] for name in _SIZED_BY)


def _sequences(call: BoundCall) -> int:
    """The batch count the call's lengths describe (TND: entries of actual_seq_lengths)."""
    lengths = call.arguments.get("actual_seq_lengths")
    return 0 if lengths is None else len(lengths)


def _key(workspace: torch.Tensor) -> tuple[int, int]:
    return workspace.data_ptr(), workspace.numel() * workspace.element_size()


def remember(workspace: torch.Tensor, call: BoundCall) -> None:
    """Record that `workspace` is the maximum workspace for `call`'s shapes."""
    _sized[_key(workspace)] = (_signature(call), _sequences(call))


def require_workspace(call: BoundCall) -> None:
    """FIA `.out`'s `workspace`: None (the operator allocates its own), or a 1-D tensor of
    query's dtype (torch-npu 2.10.0.post4 `_op_plugin_docs.py`, the
    `npu_fused_infer_attention_score.out` docstring, 参数说明, workspace) that the max-workspace
    operator sized for this call's shapes."""
    workspace = call.workspace
    if workspace is None:
        return
    if workspace.dim() != 1 or workspace.dtype != call.query.dtype:
        raise ValueError(
            f"{FIA}.out: argument 'workspace' must be 1-D of query's dtype {call.query.dtype} "
            f"(W:8514), got {tuple(workspace.shape)} {workspace.dtype}"
        )
    sized = _sized.get(_key(workspace))
    if sized is None:
        raise ValueError(
            f"{FIA}.out: argument 'workspace' was not made by "
            "_npu_fused_infer_attention_score_get_max_workspace; the stand-in cannot check that "
            "it is large enough"
        )
    sized_for, sequences = sized
    if sized_for != _signature(call):
        raise ValueError(
            f"{FIA}.out: argument 'workspace' was sized for {sized_for}, not for this call's "
            f"{_signature(call)} (shapes, heads, layout, sparse_mode, block_size)"
        )
    if _sequences(call) > sequences:
        raise ValueError(
            f"{FIA}.out: argument 'workspace' was sized for {sequences} sequences, not for this "
            f"call's {_sequences(call)} (actual_seq_lengths): the documentation does not say a "
            "maximum workspace covers more sequences than it was sized for (module docstring)"
        )
