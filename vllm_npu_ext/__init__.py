"""vllm-npu-ext: fused Qwen3 serving and context-parallel decode for vLLM on Ascend NPUs.

vLLM loads `register()` (entry point group `vllm.general_plugins`) once in every process it
starts: the API server, the engine core, each worker and the model-inspection subprocess.
`register()` must therefore stay cheap, idempotent and free of NPU imports.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

QWEN3_MODULE = "vllm_npu_ext.model_executor.models.qwen3"

_registered_in_pid: int | None = None


def register() -> None:
    """The `vllm.general_plugins` entry point: applies the patches of `patches.PATCHES` that
    apply at register()."""
    global _registered_in_pid
    if _registered_in_pid == os.getpid():
        return
    _registered_in_pid = os.getpid()

    from vllm_npu_ext import bootstrap, envs, patches
    from vllm_npu_ext.logger import get_logger

    logger = get_logger(__name__)
    bootstrap.apply()
    patches.apply_patches(patches.PLATFORM_PLUGIN)
    if envs.EMULATE():
        _log_emulated(logger)
    registered = patches.apply_patches(patches.MODEL_CLASSES)
    registered += patches.apply_patches(patches.REGISTER)
    logger.info(
        "vllm-npu-ext %s registered in pid %d: %s",
        __version__,
        os.getpid(),
        "; ".join(registered) or f"nothing ({envs.MODEL_OVERRIDE}=0)",
    )


def _log_emulated(logger) -> None:
    from vllm_npu_ext.emulator import torch_fit

    logger.warning(
        "vllm-npu-ext in pid %d: VLLM_NPU_EXT_EMULATE=1, the NPU path runs on the CPU under the "
        "torch_npu emulator (a functional check, not a measurement)", os.getpid(),
    )  # fmt: skip
    for change in torch_fit.changes:
        logger.info("vllm-npu-ext: for vllm-ascend's graph mode on this torch: %s", change)
    from vllm_npu_ext import envs

    if envs.EMULATE_OPS():
        from vllm_npu_ext.emulator.operators import npu_ext_cann

        npu_ext_cann.install_on_npu()
        logger.info(
            "vllm-npu-ext: the stand-in stands in for our built operator package "
            "(NpuExtAttentionUpdate's host-built kernel on the npu device; "
            "VLLM_NPU_EXT_EMULATE_OPS=0: as unbuilt)"
        )


def model_registrations() -> dict[str, str]:
    """Our registered architecture names -> lazy "module:Class" (`patches.vllm_model_registry`)."""
    return {"VllmNpuExtQwen3ForCausalLM": qwen3_class()}


def qwen3_class() -> str:
    """The lazy "module:Class" we register: with or without a KV cache for pooling runs."""
    from vllm_npu_ext import envs

    cache_free = envs.KV_CACHE_FREE()
    name = "Qwen3ForCausalLM" if cache_free else "Qwen3KVCacheForCausalLM"
    return f"{QWEN3_MODULE}:{name}"
