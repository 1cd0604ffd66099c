"""Start-up decisions for our Qwen3: whether pooling may go without a KV cache, graph modes for
cache-free pooling runs (vLLM's per-architecture config hook and the start-up check), and how
the build log describes compilation.

Cache-free attention (`layers/cache_free/op.py`) reads each batch's sequence boundaries on the
host, so a graph that captures it must have them updated after each replay
(`layers/cache_free/full_graph.py`): where FIA takes the model (bfloat16, head_dim 128/192) vLLM's
piecewise machinery captures the whole forward as one graph (our op is no splitting op), and
the model updates FIA after each replay; elsewhere piecewise graphs split at the op. vLLM's
own full modes stay off for it (vllm-ascend 0.23's full-graph warm-up,
`NPUModelRunner._dummy_run(force_attention=True)`, indexes a block table that a model without
a KV cache lacks).

- Default on Ascend (vLLM 0.23, vllm-ascend 0.23): mode VLLM_COMPILE with PIECEWISE graphs.
  O2 asks for FULL_AND_PIECEWISE (vLLM 0.23 `config/vllm.py` `OPTIMIZATION_LEVEL_02`), and
  vLLM turns every full mode of a pooling model into PIECEWISE on platforms with static graphs,
  Ascend included (`VllmConfig.__post_init__`, before the platform's `check_and_update_config`).
- `Qwen3GraphModeHook` runs first in `VllmConfig.__post_init__` (through
  `VllmConfig.try_verify_and_update_config` and `MODELS_CONFIG_MAP`, vLLM 0.23 and 0.32), for
  pooling runs of our cache-free class only. It turns a full mode the user forced into PIECEWISE
  (as 0.23 does, and as later versions might not), puts our op among vLLM's default splitting
  ops (`_attention_ops`, copied when `splitting_ops` is unset by
  `CompilationConfig.set_splitting_ops_for_v1`, 0.23 and 0.32; vllm-ascend 0.23's PIECEWISE
  branch of `NPUPlatform.check_and_update_config` calls the same fill), and adds it to a list
  the user gave, unless the run gets one graph per forward (`full_graph_obstacle`).
- `check_graph_mode` runs when the model is built (after every config change, platform ones
  included, before any warm-up) and raises a clear ValueError if a full mode or a piecewise
  split without our op survived, e.g. vllm-ascend's xlite decode-only mode, which sets
  FULL_DECODE_ONLY after vLLM's override (vllm-ascend 0.23
  `NPUPlatform.check_and_update_config`), or if
  vllm-ascend's profiling-based chunking would force attention in a dummy run.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vllm_npu_ext import compat, envs, patches
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.model_executor.layers.cache_free.op import SPLITTING_OP
from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
from vllm_npu_ext.ops import attention
from vllm_npu_ext.patches import vllm_config_hooks, vllm_model_registry

logger = get_logger(__name__)

ARCHITECTURE = "Qwen3ForCausalLM"  # the checkpoint name vLLM keys MODELS_CONFIG_MAP with
# Qwen3-Reranker's (`--reranker`, and Qwen3 seq-cls checkpoints): our class under vLLM's adapter.
RERANKER_ARCHITECTURE = "Qwen3ForSequenceClassification"
CACHE_FREE_SWITCH = envs.KV_CACHE_FREE.name


def kv_cache_features(vllm_config: Any) -> list[str]:
    """The flags asking for what only a KV cache can serve (prefix caching, chunked prefill)."""
    return [
        flag
        for flag, on in (
            ("--enable-prefix-caching", vllm_config.cache_config.enable_prefix_caching),
            ("--enable-chunked-prefill", vllm_config.scheduler_config.enable_chunked_prefill),
        )
        if on
    ]


def cache_free_allowed(vllm_config: Any) -> bool:
    """Prefix caching and chunked prefill need keys from earlier steps: a KV cache.

    vLLM turns both off for our cache-free pooling class unless the user asked for them;
    then the user's choice wins and pooling keeps the KV cache.
    """
    wanted = kv_cache_features(vllm_config)
    if wanted:
        logger.warning(
            "vllm-npu-ext: %s requested, so pooling keeps the KV cache (cache-free pooling "
            "cannot serve it)", " and ".join(wanted),
        )  # fmt: skip
    return not wanted


def cache_free_pooling(vllm_config: Any) -> bool:
    """Whether this run gets our cache-free Qwen3 (a pooling run, nothing needing a KV cache)."""
    model_config = vllm_config.model_config
    if model_config is None or getattr(model_config, "runner_type", None) != "pooling":
        return False
    if not vllm_model_registry.ours_for(model_config) or not envs.KV_CACHE_FREE():
        return False
    return not kv_cache_features(vllm_config)


class Qwen3GraphModeHook:
    """`MODELS_CONFIG_MAP[ARCHITECTURE]`: vLLM calls it for every run of that architecture."""

    previous: ClassVar[Any] = None  # the entry this one replaced (none in 0.23 and 0.32)

    @classmethod
    def verify_and_update_config(cls, vllm_config: Any) -> None:
        if cls.previous is not None:
            cls.previous.verify_and_update_config(vllm_config)
        if cache_free_pooling(vllm_config):
            keep_attention_outside_graphs(vllm_config)

    @classmethod
    def verify_and_update_model_config(cls, model_config: Any) -> None:
        if cls.previous is not None:
            cls.previous.verify_and_update_model_config(model_config)


def full_graph_obstacle(vllm_config: Any) -> str | None:
    """Why a cache-free pooling run cannot capture attention inside one graph per forward
    (`layers/cache_free/full_graph.py`); None when it can: the NPU path, fused attention through
    FIA (bfloat16, head_dim 128 or 192 per `ops.attention.choose_operator`), at most FIA's
    sequence limit per batch with the padding sequence, and VLLM_NPU_EXT_FULL_GRAPH on."""
    if not envs.FULL_GRAPH():
        return f"{envs.FULL_GRAPH}=0"
    if not compat.npu_path_expected():
        return "not the NPU path"
    from vllm.platforms import current_platform

    if not current_platform.support_static_graph_mode():
        return f"the {current_platform.device_type} platform captures no graphs"
    fusions = FusionConfig.from_env()
    if not fusions.attention:
        return "fused attention is off"
    model_config = vllm_config.model_config
    text = model_config.hf_config.get_text_config()
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    tp = vllm_config.parallel_config.tensor_parallel_size
    shape = (head_dim, heads // tp, max(1, kv_heads // tp))
    choice = attention.choose_operator(fusions.attention_op, model_config.dtype, *shape)
    if choice.operator != attention.FUSED_INFER:
        return (f"{model_config.dtype} with head_dim {head_dim} is outside FIA's TND domain "
                "(bfloat16, head_dim 128 or 192), and npu_fusion_attention takes no graph "
                "update")  # fmt: skip
    limit = attention.MAX_SEQS[attention.FUSED_INFER] - 1  # one more: the padding sequence
    if vllm_config.scheduler_config.max_num_seqs > limit:
        return f"--max-num-seqs above {limit} (FIA takes {limit + 1} sequences per call)"
    return None


def keep_attention_outside_graphs(vllm_config: Any) -> None:
    """Full modes -> PIECEWISE. Where FIA takes the model, attention stays inside the one graph
    of each forward (our op is no splitting op); elsewhere our op joins the splitting ops
    (default and user-given)."""
    compilation_config = vllm_config.compilation_config
    mode = compilation_config.cudagraph_mode
    if mode is not None and mode.has_full_cudagraphs():
        logger.warning(
            "vllm-npu-ext: cudagraph_mode %s would capture cache-free attention, whose sequence "
            "lengths change every batch, without updating them; using PIECEWISE. "
            "%s=0 keeps vLLM's attention with a KV cache instead.", mode.name, CACHE_FREE_SWITCH,
        )  # fmt: skip
        compilation_config.cudagraph_mode = compat.piecewise_mode()
    ops = compilation_config.splitting_ops
    obstacle = full_graph_obstacle(vllm_config)
    if obstacle is None and not (ops and SPLITTING_OP in ops):
        patches.revert("vllm_splitting_ops", SPLITTING_OP)
        logger.info(
            "vllm-npu-ext: one graph per forward for cache-free pooling: attention is captured "
            "inside it and its sequence lengths are updated after each replay (%s=0 splits the "
            "graphs at attention instead)", envs.FULL_GRAPH,
        )  # fmt: skip
        return
    logger.info("vllm-npu-ext: piecewise graphs, cache-free attention between them: %s",
                obstacle or f"splitting_ops given with {SPLITTING_OP}")  # fmt: skip
    patches.apply("vllm_splitting_ops", SPLITTING_OP)
    if ops and SPLITTING_OP not in ops:
        logger.info("vllm-npu-ext: splitting_ops given; adding %s", SPLITTING_OP)
        ops.append(SPLITTING_OP)


def check_graph_mode(vllm_config: Any, compiled: bool) -> str:
    """How cache-free attention meets the graphs (the config is final here): "full" (inside one
    graph per forward, updated per replay), "piecewise" (between graphs) or "none" (no graphs).
    ValueError when graphs would capture it without the update, or when vllm-ascend would force
    attention in a dummy run of a model without a KV cache."""
    additional = getattr(vllm_config, "additional_config", None)
    profiling = additional.get("profiling_chunk_config") if isinstance(additional, dict) else None
    if isinstance(profiling, dict) and profiling.get("enabled"):
        # vllm-ascend 0.23 NPUWorker.profile_prefill_latency -> NPUModelRunner._dummy_run(
        # force_attention=True) indexes the block table of every KV-cache group: none exists
        # for cache-free pooling.
        raise ValueError(
            "vllm-npu-ext: profiling_chunk_config needs a KV cache; set "
            f"{CACHE_FREE_SWITCH}=0 (pooling with vLLM's KV cache) or leave it off"
        )
    compilation_config = vllm_config.compilation_config
    mode = compilation_config.cudagraph_mode
    if mode is not None and mode.has_full_cudagraphs():
        raise ValueError(
            f"vllm-npu-ext: cudagraph_mode {mode.name} captures whole forward passes, which "
            "cache-free pooling cannot replay (its attention takes each batch's sequence "
            "lengths on the host). Use --compilation-config '{\"cudagraph_mode\": \"PIECEWISE\"}' "
            f"or {CACHE_FREE_SWITCH}=0 (vLLM's attention with a KV cache)."
        )
    ops = compilation_config.splitting_ops or []
    if compiled and SPLITTING_OP in ops:
        return "piecewise"
    # Piecewise with an empty list captures nothing: vLLM 0.23 sets NONE for it
    # (`CompilationConfig.set_splitting_ops_for_v1`).
    piecewise = mode is not None and mode.has_piecewise_cudagraphs()
    if not (compiled and piecewise) or compilation_config.splitting_ops == []:
        return "none"
    obstacle = full_graph_obstacle(vllm_config)
    if obstacle is not None:
        raise ValueError(
            f"vllm-npu-ext: piecewise graphs split at {ops}, not at {SPLITTING_OP}, so they "
            f"would capture cache-free attention, which cannot be updated per replay here "
            f"({obstacle}); add it to splitting_ops"
        )
    return "full"


def describe_compilation(compiled: bool, graph_mode: str) -> str:
    """The build log's compilation clause, for `check_graph_mode`'s result."""
    if not compiled:
        return "; eager (not compiled)"
    if graph_mode == "full":
        return ("; compiled by vLLM, one graph per forward with attention inside (FIA's "
                "sequence lengths updated after each replay)")  # fmt: skip
    if graph_mode == "piecewise":
        return f"; compiled by vLLM, attention ({SPLITTING_OP}) between the graphs"
    return "; compiled by vLLM"


class Qwen3RerankerGraphModeHook(Qwen3GraphModeHook):
    """`MODELS_CONFIG_MAP[RERANKER_ARCHITECTURE]`, in front of vLLM's own entry there
    (`Qwen3ForSequenceClassificationConfig`, which converts the reranker's head). Without it a
    reranker served in graph mode on the NPU path would split its graphs without our attention
    op, and `check_graph_mode` would refuse to start."""

    previous: ClassVar[Any] = None


HOOKS = {ARCHITECTURE: Qwen3GraphModeHook, RERANKER_ARCHITECTURE: Qwen3RerankerGraphModeHook}


def install() -> str:
    """Register the hooks (idempotent); returns a line for register()'s log."""
    for architecture, hook in HOOKS.items():
        hook.previous = vllm_config_hooks.replace_entry(architecture, hook)
    return f"graph-mode hook for {' and '.join(HOOKS)} pooling runs"
