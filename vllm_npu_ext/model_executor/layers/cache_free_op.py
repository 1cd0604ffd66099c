"""`torch.ops.vllm_npu_ext.cache_free_attention`: cache-free causal attention as one opaque op.

The NPU path's fused attention takes each batch's sequence boundaries as host-side Python
lists (`actual_seq_lengths`, torch-npu `_op_plugin_docs.py:8038`), which change every step. A
graph that captured them would replay stale boundaries, so attention must run outside the
compiled and captured graphs, and it must be the only code that reads them. This op is that
boundary:

- vLLM splits its piecewise graphs at it (`SPLITTING_OP`, which the config hook in
  `models/qwen3_config.py` adds to the splitting ops, beside vLLM's own
  `vllm::unified_attention_with_output`), so on Ascend everything else in a decoder layer is
  captured by vllm-ascend's piecewise ACL graphs and this op runs eagerly between them;
- its kernel reads the running batch's `PackedSeqs` from the forward context
  (`compat.packed_seqs_for_layer`) and calls `ops.attention.varlen_attention` with the layer's
  fusion switch and operator choice (FIA, or npu_fusion_attention where FIA lacks the dtype);
- it writes into an `output` buffer that the traced code allocates before the call, as vLLM's
  `unified_attention_with_output` does (vLLM 0.23 `layers/attention/attention.py:478,521`):
  that buffer then belongs to the graph before the op,
  so the graph after it reads the same address on every replay (vllm-ascend's
  `ACLGraphWrapper` replays with the captured input addresses and copies nothing,
  `vllm_ascend/compilation/acl_graph.py:168-169,236-257`); a fresh result tensor would be
  read from its capture-time address. The result is copied into it, as vllm-ascend's own
  attention does (`output[:num_tokens] = attn_output[:num_tokens]`,
  `vllm_ascend/attention/attention_v1.py:1543-1544`);
- its fake kernel (no outputs) lets `torch.compile` trace through it.

Arguments: query `[T, Nq, D]`, key and value `[T, Nkv, D]` (one dtype; value contiguous),
output `[T, Nq, D]` in query's dtype (written), the attention layer's `layer_name` (the key of
its metadata in the forward context), `scale`, `fused` (False: the PyTorch reference),
`operator` (`ops.attention.OPERATORS`).
"""

from __future__ import annotations

import torch

from vllm_npu_ext import compat
from vllm_npu_ext.ops import attention, dispatch

NAMESPACE = "vllm_npu_ext"
OP_NAME = "cache_free_attention"
SPLITTING_OP = f"{NAMESPACE}::{OP_NAME}"
OP_SCHEMA = (
    f"{OP_NAME}(Tensor query, Tensor key, Tensor value, Tensor(a!) output, str layer_name, "
    "float scale, bool fused, str operator) -> ()"
)


def cache_free_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer_name: str,
    scale: float,
    fused: bool,
    operator: str,
) -> torch.Tensor:
    """Allocate the output `[T, Nq, D]` and run the op into it (module docstring)."""
    output = torch.empty_like(query)
    torch.ops.vllm_npu_ext.cache_free_attention(
        query, key, value, output, layer_name, scale, fused, operator
    )
    return output


def _kernel(query, key, value, output, layer_name, scale, fused, operator) -> None:
    seqs = compat.packed_seqs_for_layer(layer_name, query.shape[0])
    npu = dispatch.npu_ops(query) if fused else None
    result = attention.varlen_attention(query, key, value, seqs, scale, npu=npu, operator=operator)
    output.copy_(result)


def _fake(query, key, value, output, layer_name, scale, fused, operator) -> None:
    return None


def _register() -> torch.library.Library | None:
    if torch._C._jit_get_schemas_for_operator(SPLITTING_OP):
        return None  # registered by an earlier import of this module
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    library.define(OP_SCHEMA)
    # One kernel for every backend: the device work happens inside varlen_attention.
    library.impl(OP_NAME, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(SPLITTING_OP, _fake, lib=library)
    return library


_LIBRARY = _register()
