"""What a layer reads from vLLM's forward context: its sequence boundaries and its module.

vLLM passes per-layer attention metadata through a global forward context
(`vllm.forward_context.get_forward_context()`, the same in 0.23 and 0.32); these accessors are
the only readers of it, so every other module takes the boundaries as arguments.
"""

from __future__ import annotations

from typing import Any

from vllm.forward_context import get_forward_context, is_forward_context_available

from vllm_npu_ext.ops.packed import PackedSeqs

# Attribute our cache-free metadata builder adds to the backend's metadata object.
PACKED_SEQS_ATTR = "npu_ext_packed_seqs"


def packed_seqs_for_layer(layer_name: str, num_tokens: int) -> PackedSeqs:
    """Sequence boundaries of the running batch, from the metadata built for `layer_name`,
    padded to `num_tokens` rows (`PackedSeqs.padded_to`).

    A forward with no attention metadata at all is one vLLM runs on a dummy batch (profiling,
    compile and capture warm-ups, graph capture: vLLM 0.23/0.32 and vllm-ascend 0.23's
    `_dummy_run` pass `attn_metadata=None` unless they force attention): that batch counts as
    one sequence. Any other forward must carry this layer's boundaries; a forward context
    missing, metadata of other layers only, or metadata our builder did not fill is an error,
    since one sequence there would attend across requests.
    """
    if not is_forward_context_available():
        raise RuntimeError(
            f"attention of {layer_name} ran outside a vLLM forward context: no sequence "
            "boundaries to read (forward_packed takes them explicitly)"
        )
    attn_metadata = _forward_metadata()
    if not attn_metadata:  # a dummy batch (docstring)
        return PackedSeqs((0, num_tokens))
    seqs = getattr(attn_metadata.get(layer_name), PACKED_SEQS_ATTR, None)
    if seqs is None:
        raise RuntimeError(
            f"the forward carries attention metadata but none with sequence boundaries for "
            f"{layer_name} (built by {type(attn_metadata.get(layer_name)).__name__}); the "
            "cache-free builder must run for every cache-free layer"
        )
    return seqs.padded_to(num_tokens)


def layer_module(layer_name: str) -> Any:
    """The attention layer registered as `layer_name` in the running forward context (vLLM's
    `static_forward_context`), or None outside a forward."""
    if not is_forward_context_available():
        return None
    return get_forward_context().no_compile_layers.get(layer_name)


def _forward_metadata() -> Any:
    attn_metadata = get_forward_context().attn_metadata
    if isinstance(attn_metadata, list):
        raise NotImplementedError(
            "micro-batched forward passes (dual-batch overlap) are not supported by the "
            "vllm-npu-ext NPU path; disable DBO"
        )
    return attn_metadata
