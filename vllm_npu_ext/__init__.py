"""vllm-npu-ext: fused Qwen3 serving and context-parallel decode for vLLM on Ascend NPUs.

vLLM loads `register()` (entry point group `vllm.general_plugins`) once in every process it
starts: the API server, the engine core, each worker and the model-inspection subprocess.
`register()` must therefore stay cheap, idempotent and free of NPU imports.
"""

from __future__ import annotations

import logging
import os

__version__ = "0.1.0"

QWEN3_ARCHITECTURE = "Qwen3ForCausalLM"
QWEN3_CLASS = "vllm_npu_ext.model_executor.models.qwen3:Qwen3ForCausalLM"

logger = logging.getLogger("vllm_npu_ext")
_registered_in_pid: int | None = None


def register() -> None:
    """The `vllm.general_plugins` entry point."""
    global _registered_in_pid
    if _registered_in_pid == os.getpid():
        return
    _registered_in_pid = os.getpid()

    from vllm_npu_ext import bootstrap, envs
    from vllm_npu_ext.patches import apply_patches

    bootstrap.apply()
    registered = []
    if envs.flag("VLLM_NPU_EXT_MODEL_OVERRIDE"):
        from vllm import ModelRegistry

        ModelRegistry.register_model(QWEN3_ARCHITECTURE, QWEN3_CLASS)
        registered.append(f"{QWEN3_ARCHITECTURE} -> {QWEN3_CLASS}")
    registered.extend(apply_patches())
    _log_info(
        "vllm-npu-ext %s registered in pid %d: %s",
        __version__,
        os.getpid(),
        "; ".join(registered) or "nothing (VLLM_NPU_EXT_MODEL_OVERRIDE=0)",
    )


def _log_info(msg: str, *args) -> None:
    # vLLM's logger has handlers in every vLLM process; ours may not.
    from vllm.logger import init_logger

    init_logger("vllm_npu_ext").info(msg, *args)
