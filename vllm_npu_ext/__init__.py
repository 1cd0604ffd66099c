"""vllm-npu-ext: fused Qwen3 serving and context-parallel decode for vLLM on Ascend NPUs.

vLLM loads `register()` (entry point group `vllm.general_plugins`) once in every process it
starts: the API server, the engine core, each worker and the model-inspection subprocess.
`register()` must therefore stay cheap, idempotent and free of NPU imports.
"""

from __future__ import annotations

import os

__version__ = "0.1.0"

EMULATE_SWITCH = "VLLM_NPU_EXT_EMULATE"
QWEN3_MODULE = "vllm_npu_ext.model_executor.models.qwen3"

_registered_in_pid: int | None = None


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    global _registered_in_pid
    if _registered_in_pid == os.getpid():
        return
    _registered_in_pid = os.getpid()

    from vllm_npu_ext import bootstrap, compat, envs
    from vllm_npu_ext.logger import get_logger
    from vllm_npu_ext.patches import apply_patches

    logger = get_logger(__name__)
    compat.declare_environment_variables(envs.VARIABLES)
    bootstrap.apply()
    if envs.flag(EMULATE_SWITCH):
        from vllm_npu_ext import emulator
        from vllm_npu_ext.emulator import torch_fit

        emulator.install_stand_in()
        logger.warning(
            "vllm-npu-ext in pid %d: %s=1, the NPU path runs on the CPU under the torch_npu "
            "emulator (a functional check, not a measurement)", os.getpid(), EMULATE_SWITCH,
        )  # fmt: skip
        for change in torch_fit.changes:
            logger.info("vllm-npu-ext: for vllm-ascend's graph mode on this torch: %s", change)
    registered = []
    if envs.flag("VLLM_NPU_EXT_MODEL_OVERRIDE"):
        from vllm_npu_ext.model_executor.models import qwen3_config
        from vllm_npu_ext.patches import vllm_model_registry

        registered += vllm_model_registry.install(model_registrations())
        registered.append(qwen3_config.install())
    registered.extend(apply_patches())
    logger.info(
        "vllm-npu-ext %s registered in pid %d: %s",
        __version__,
        os.getpid(),
        "; ".join(registered) or "nothing (VLLM_NPU_EXT_MODEL_OVERRIDE=0)",
    )


def model_registrations() -> dict[str, str]:
    """Our registered architecture names -> lazy "module:Class" (`patches.vllm_model_registry`)."""
    return {"VllmNpuExtQwen3ForCausalLM": qwen3_class()}


def qwen3_class() -> str:
    """The lazy "module:Class" we register: with or without a KV cache for pooling runs."""
    from vllm_npu_ext import envs

    cache_free = envs.flag(envs.KV_CACHE_FREE_SWITCH)
    name = "Qwen3ForCausalLM" if cache_free else "Qwen3KVCacheForCausalLM"
    return f"{QWEN3_MODULE}:{name}"
