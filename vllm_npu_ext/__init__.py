"""vllm-npu-ext: fused Qwen3 serving and context-parallel decode for vLLM on Ascend NPUs.

vLLM loads `register()` (entry point group `vllm.general_plugins`) once in every process it
starts: the API server, the engine core, each worker and the model-inspection subprocess.
`register()` must therefore stay cheap, idempotent and free of NPU imports.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
QWEN3_MODULE = "vllm_npu_ext.model_executor.models.qwen3"

_registered_in_pid: int | None = None


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    global _registered_in_pid
    if _registered_in_pid == os.getpid():
        return
    _registered_in_pid = os.getpid()

    from vllm_npu_ext import bootstrap, compat, envs
    from vllm_npu_ext.patches import apply_patches

    compat.declare_environment_variables(envs.VARIABLES)
    bootstrap.apply()
    registered = []
    if envs.flag("VLLM_NPU_EXT_MODEL_OVERRIDE"):
        from vllm import ModelRegistry

        model_class = qwen3_class()
        ModelRegistry.register_model(QWEN3_ARCHITECTURE, model_class)
        registered.append(f"{QWEN3_ARCHITECTURE} -> {model_class}")
    registered.extend(apply_patches())
    from vllm_npu_ext.logger import get_logger

    get_logger(__name__).info(
        "vllm-npu-ext %s registered in pid %d: %s",
        __version__,
        os.getpid(),
        "; ".join(registered) or "nothing (VLLM_NPU_EXT_MODEL_OVERRIDE=0)",
    )


def qwen3_class() -> str:
    """The lazy "module:Class" we register: with or without a KV cache for pooling runs."""
    from vllm_npu_ext import envs

    cache_free = envs.flag("VLLM_NPU_EXT_KV_CACHE_FREE")
    name = "Qwen3ForCausalLM" if cache_free else "Qwen3KVCacheForCausalLM"
    return f"{QWEN3_MODULE}:{name}"
