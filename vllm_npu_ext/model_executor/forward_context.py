"""What a layer reads from vLLM's forward context: its sequence boundaries and its module.

vLLM passes per-layer attention metadata through a global forward context
(`vllm.forward_context.get_forward_context()`, the same in 0.23 and 0.32); these accessors are
the only readers of it, so every other module takes the boundaries as arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

from vllm.forward_context import get_forward_context, is_forward_context_available

from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.ops.shared_prefix import SharedPrefixPlan

# Attribute our cache-free metadata builder adds to the backend's metadata object.
PACKED_SEQS_ATTR = "npu_ext_packed_seqs"
# Attribute a step with shared prefixes adds to the forward context (`shared_prefix_step`).
SHARED_PREFIX_ATTR = "npu_ext_shared_prefix_plan"


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


def has_attention_metadata() -> bool:
    """Whether the running forward carries attention metadata: a step of requests, not one of
    the runner's dummy batches (`packed_seqs_for_layer`)."""
    return is_forward_context_available() and bool(_forward_metadata())


def splits_rows_across_ranks() -> bool:
    """Whether the running step's rows are padded and split across tensor-parallel ranks
    (vllm-ascend's sequence parallelism, `flash_comm_v1_enabled` on its forward context)."""
    return bool(getattr(get_forward_context(), "flash_comm_v1_enabled", False))


def runtime_mode() -> Any:
    """The running forward's graph mode (vLLM's `CUDAGraphMode`, which vllm-ascend uses too)."""
    return get_forward_context().cudagraph_runtime_mode


def shared_prefix_plan() -> SharedPrefixPlan | None:
    """The running step's shared prefixes (`model_executor/shared_prefix.py`), None when the
    step shares none or outside a forward."""
    if not is_forward_context_available():
        return None
    return getattr(get_forward_context(), SHARED_PREFIX_ATTR, None)


@contextlib.contextmanager
def shared_prefix_step(plan: SharedPrefixPlan, num_tokens: int, runtime_mode: Any) -> Iterator:
    """Within it the forward runs `num_tokens` rows (the plan's unique rows, padded) under
    `runtime_mode`: the context's batch descriptor, graph mode and token count say so (the
    graph wrappers of vLLM and vllm-ascend replay by them), and `shared_prefix_plan()` returns
    `plan`; everything is restored on exit."""
    context = get_forward_context()
    saved = {name: getattr(context, name) for name in ("batch_descriptor",
             "cudagraph_runtime_mode", "num_tokens") if hasattr(context, name)}  # fmt: skip
    descriptor = saved.get("batch_descriptor")
    if descriptor is not None:
        context.batch_descriptor = dataclasses.replace(descriptor, num_tokens=num_tokens)
    context.cudagraph_runtime_mode = runtime_mode
    if "num_tokens" in saved:
        context.num_tokens = num_tokens
    setattr(context, SHARED_PREFIX_ATTR, plan)
    try:
        yield
    finally:
        delattr(context, SHARED_PREFIX_ATTR)
        for name, value in saved.items():
            setattr(context, name, value)
