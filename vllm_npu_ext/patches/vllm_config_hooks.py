"""Patch: vLLM's per-architecture config hooks (`MODELS_CONFIG_MAP`), for our graph modes.

vLLM calls `MODELS_CONFIG_MAP[architecture].verify_and_update_config(vllm_config)` first in
`VllmConfig.__post_init__` and `.verify_and_update_model_config(model_config)` in
`ModelConfig.__post_init__` (vLLM 0.23 and 0.32). Our hooks (`models/qwen3_config.py`) take the
entries of the Qwen3 architectures and call the entry they replaced first: vLLM has none for
`Qwen3ForCausalLM` and `Qwen3ForSequenceClassificationConfig` for the reranker, whose
`verify_and_update_model_config` is pinned in the patch table.
"""

from __future__ import annotations

from typing import Any


def replace_entry(architecture: str, hook: Any) -> Any:
    """Make `hook` vLLM's config hook for `architecture`; returns the entry it replaced.

    Installing the same hook twice keeps the first replaced entry (`hook.previous`)."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    previous = MODELS_CONFIG_MAP.get(architecture)
    if previous is hook:
        return hook.previous
    MODELS_CONFIG_MAP[architecture] = hook
    return previous
