"""Loggers that print through vLLM's logging configuration.

vLLM configures handlers for the `vllm` logger only; a plugin's own top-level logger would
drop INFO lines. Our loggers are children of it (`vllm.vllm_npu_ext...`), so they share vLLM's
format, level (`VLLM_LOGGING_LEVEL`) and per-process prefixes.

vLLM 0.23 configures that logger when `vllm.logger` is imported; 0.32 only once the engine
arguments are parsed, after plugins have loaded. `get_logger` then applies vLLM's default
configuration early (vLLM re-applies its own later), so `register()`'s line is not lost.
"""

from __future__ import annotations

import logging


def get_logger(name: str) -> logging.Logger:
    from vllm import envs
    from vllm import logger as vllm_logger

    configure_early = getattr(vllm_logger, "_configure_vllm_root_logger", None)
    if not logging.getLogger("vllm").handlers and envs.VLLM_CONFIGURE_LOGGING and configure_early:
        configure_early()
    return vllm_logger.init_logger(f"vllm.{name}")
