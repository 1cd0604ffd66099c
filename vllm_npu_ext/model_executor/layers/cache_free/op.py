"""`torch.ops.vllm_npu_ext.cache_free_attention`: cache-free causal attention as one opaque op.

The NPU path's fused attention takes each batch's sequence boundaries as host-side Python
lists (`actual_seq_lengths`, torch-npu 2.10.0.post4's FIA documentation), which change every
step. A graph that captured them would replay stale boundaries, so attention must run outside
the compiled and captured graphs, and it must be the only code that reads them. This op is
that boundary:

- where FIA takes the model (bfloat16, head_dim 128/192), vLLM captures the whole forward as
  one graph with this op inside: called while a capture is under way it captures FIA as
  `full_graph.py` describes, and the model updates its lengths after each replay;
- elsewhere vLLM splits its piecewise graphs at it (`SPLITTING_OP`, which the config hook in
  `models/qwen3_config.py` adds to the splitting ops, beside vLLM's own
  `vllm::unified_attention_with_output`), so on Ascend everything else in a decoder layer is
  captured by vllm-ascend's piecewise ACL graphs and this op runs eagerly between them;
- its kernel reads the running batch's `PackedSeqs` from the forward context
  (`forward_context.packed_seqs_for_layer`) and calls `ops.attention.varlen_attention` with the
  layer's fusion switch and operator choice (FIA, or npu_fusion_attention where FIA lacks the
  dtype); in a step with shared prefixes (`model_executor/shared_prefix.py`) it runs
  `ops.shared_prefix.shared_prefix_attention` on the step's unique rows instead (eagerly or
  between piecewise graphs: such a step is never captured);
- it writes into an `output` buffer that the traced code allocates before the call, as vLLM's
  `unified_attention_with_output` does (vLLM 0.23 `Attention.forward`): that buffer then
  belongs to the graph before the op, so the graph after it reads the same address on every
  replay (vllm-ascend 0.23's `ACLGraphWrapper.__call__` replays with the captured input
  addresses and copies nothing); a fresh result tensor would be read from its capture-time
  address. FIA writes its result there itself (its `.out` overload, torch-npu 2.10.0.post4),
  one launch; `npu_fusion_attention`'s result is copied into it, as vllm-ascend's own
  attention copies FIA's (`output[:num_tokens] = attn_output[:num_tokens]`,
  `AscendAttentionBackendImpl.forward`);
- its fake kernel (no outputs) lets `torch.compile` trace through it.

Arguments: query `[T, Nq, D]`, key and value `[T, Nkv, D]` (one dtype; value contiguous),
output `[T, Nq, D]` in query's dtype (written), the attention layer's `layer_name` (the key of
its metadata in the forward context), `scale`, `fused` (False: the PyTorch reference),
`operator` (`ops.attention.OPERATORS`).
"""

from __future__ import annotations

import torch

from vllm_npu_ext.model_executor import forward_context
from vllm_npu_ext.ops import attention, dispatch, shared_prefix

NAMESPACE = "vllm_npu_ext"
OP_NAME = "cache_free_attention"
SPLITTING_OP = f"{NAMESPACE}::{OP_NAME}"
OP_SCHEMA = (
    f"{OP_NAME}(Tensor query, Tensor key, Tensor value, Tensor(a!) output, str layer_name, "
    "float scale, bool fused, str operator) -> ()"
)
# Inside one graph per forward the op returns its result: a mutating op there would reach the
# compiled graph wrapped in auto_functionalized, whose plain execution (vllm-ascend compiles
# with aot_autograd and runs the FX graph: its `compiler_interface.compile_fx`) clones the
# output buffer first, one more copy per layer.
IN_GRAPH_OP_NAME = "cache_free_attention_in_graph"
IN_GRAPH_OP_SCHEMA = (
    f"{IN_GRAPH_OP_NAME}(Tensor query, Tensor key, Tensor value, str layer_name, float scale, "
    "bool fused, str operator) -> Tensor"
)


def cache_free_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer_name: str,
    scale: float,
    fused: bool,
    operator: str,
    in_graph: bool = False,
) -> torch.Tensor:
    """Attention `[T, Nq, D]` (module docstring): into an output the caller's graph allocates,
    or, `in_graph` (one graph per forward), as the op's own result."""
    if in_graph:
        return torch.ops.vllm_npu_ext.cache_free_attention_in_graph(
            query, key, value, layer_name, scale, fused, operator
        )
    output = torch.empty_like(query)
    torch.ops.vllm_npu_ext.cache_free_attention(
        query, key, value, output, layer_name, scale, fused, operator
    )
    return output


def _kernel(query, key, value, output, layer_name, scale, fused, operator) -> None:
    device = dispatch.npu_ops(query)
    npu = device if fused else None
    full_graph = getattr(forward_context.layer_module(layer_name), "full_graph", None)
    plan = forward_context.shared_prefix_plan()
    if plan is not None:  # never in a capture: a sharing step runs outside captured graphs
        if full_graph is not None:
            full_graph.ran_on_host = True
        rows = query.shape[0]
        shared_prefix.shared_prefix_attention(
            query, key, value, plan.attention_layout(rows), plan.tensor("kv_rows", query.device,
            rows), scale, npu=npu, operator=operator, out=output,
        )  # fmt: skip
        return
    seqs = forward_context.packed_seqs_for_layer(layer_name, query.shape[0])
    if dispatch.graph_capturing(device):
        if full_graph is None or npu is None or operator != attention.FUSED_INFER:
            raise RuntimeError(
                f"{SPLITTING_OP} of {layer_name} is being captured into a graph, which would "
                "replay the sequence lengths of its capture; it must be a splitting op here "
                "(models/qwen3_config.py)"
            )
        full_graph.capture(npu, query, key, value, output, layer_name, scale, seqs)
        return
    if full_graph is not None:
        full_graph.ran_on_host = True
    attention.varlen_attention(query, key, value, seqs, scale, npu=npu, operator=operator,
                               out=output)  # fmt: skip


def _in_graph_kernel(query, key, value, layer_name, scale, fused, operator) -> torch.Tensor:
    output = torch.empty_like(query)
    _kernel(query, key, value, output, layer_name, scale, fused, operator)
    return output


def _fake(query, key, value, output, layer_name, scale, fused, operator) -> None:
    return None


def _in_graph_fake(query, key, value, layer_name, scale, fused, operator) -> torch.Tensor:
    return torch.empty_like(query)


def _register() -> torch.library.Library | None:
    if torch._C._jit_get_schemas_for_operator(SPLITTING_OP):
        return None  # registered by an earlier import of this module
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    # One kernel for every backend: the device work happens inside varlen_attention.
    for name, schema, kernel, fake in (
        (OP_NAME, OP_SCHEMA, _kernel, _fake),
        (IN_GRAPH_OP_NAME, IN_GRAPH_OP_SCHEMA, _in_graph_kernel, _in_graph_fake),
    ):
        library.define(schema)
        library.impl(name, kernel, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=library)
    return library


_LIBRARY = _register()
