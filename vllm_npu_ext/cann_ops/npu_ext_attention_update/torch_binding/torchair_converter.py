"""torchair (graph mode) converters: both torch ops become one NpuExtAttentionUpdate GE node.

`register(torchair)` takes the `torch_npu.dynamo.torchair` module as an argument, so this
module imports nothing from torch_npu itself; `vllm_npu_ext.cann_ops.binding`, which defines
the binding op, calls it only when torchair imports. The GE node's input, attribute and
output names are the op definition's (op_host/npu_ext_attention_update_def.cpp).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from vllm_npu_ext.cann_ops import OP_TYPE
from vllm_npu_ext.ops import attention_update  # noqa: F401  (defines the public op)

GE_INPUTS = ("lse", "go")
GE_ATTRS = ("update_type",)
GE_OUTPUTS = ("out", "lse_out")


def ge_attention_update(torchair: ModuleType, lse: Any, go: Any, update_type: int) -> Any:
    """The GE node for lse `[sp, N]`, go `[sp, N, D]`; returns its (out, lse_out) tensors."""
    return torchair.ge.custom_op(
        OP_TYPE,
        inputs={"lse": lse, "go": go},
        attrs={"update_type": torchair.ge.attr.Int(update_type)},
        outputs=list(GE_OUTPUTS),
    )


def register(torchair: ModuleType) -> None:
    """Register converters for the public op and for the binding op.

    Each converter keeps its op's schema argument names: torchair may pass them as keywords.
    The binding op must be defined (by `vllm_npu_ext.cann_ops.binding`, the caller).
    """
    import torch

    @torchair.register_fx_node_ge_converter(torch.ops.vllm_npu_ext.attention_update.default)
    def convert_attention_update(lse, out, update_type=0, meta_outputs=None):
        return ge_attention_update(torchair, lse, out, update_type)

    @torchair.register_fx_node_ge_converter(
        torch.ops.npu_ext_cann.npu_ext_attention_update.default
    )
    def convert_npu_ext_attention_update(lse, go, update_type, meta_outputs=None):
        return ge_attention_update(torchair, lse, go, update_type)
