"""Patch: vLLM's model registry gives Qwen3 pooling runs our classes, and nothing else.

What it replaces. vLLM maps a checkpoint's `architectures` to a model class in
`_ModelRegistry.resolve_model_cls` and `_ModelRegistry.inspect_model_cls` (vLLM 0.23 and
0.32, `vllm/model_executor/models/registry.py`; both take the `ModelConfig`). A plain
`ModelRegistry.register_model("Qwen3ForCausalLM", ours)` would replace vLLM's Qwen3 for
every run, chat and generation included (and, on Ascend, the class vllm-ascend patches and
captures in graphs). So our classes are registered under names of their own (`OVERRIDES`
values), and these two methods are wrapped: while the model config's runner is `pooling`
(embed, classify, score, rerank), or always with `VLLM_NPU_EXT_GENERATION=1`, a listed
architecture resolves to ours; every other run resolves exactly as without the plugin.

vLLM first inspects the architecture to choose the runner (`runner_type` is not set yet);
that inspection passes through unchanged, so `--runner auto` decides as it does without the
plugin. `register()` installs the wrappers in every vLLM process (the patch table,
`patches/__init__.py`, pins both methods' sources); `uninstall()` restores the methods.
`VLLM_NPU_EXT_MODEL_OVERRIDE=0` leaves the registry alone.

Rerankers (`Qwen3ForSequenceClassification`, as Qwen3-Reranker is served: `reranker.py`).
vLLM has no class of that name: `_normalize_arch` (same code in 0.23 and 0.32) swaps the
`ForSequenceClassification` suffix for `ForCausalLM` and wraps that class with
`as_seq_cls_model`. So the alias below is deliberately left unregistered: our name for it,
`VllmNpuExtQwen3ForSequenceClassification`, is rewritten the same way to our registered
`VllmNpuExtQwen3ForCausalLM`, the adapter wraps our class, and the wrapper reports the
checkpoint's name, on which vLLM's Qwen3-Reranker config hook is keyed. Registering a seq-cls
class under the name instead would make vLLM resolve `convert=none` and skip the
`from_2_way_softmax` set-up (a two-logit head that fails to load the one-logit weight).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm_npu_ext import envs

# checkpoint architecture -> the name our class is registered under (or, for an alias that
# vLLM's suffix rewrite turns into a registered name, that unregistered alias).
OVERRIDES: dict[str, str] = {
    "Qwen3ForCausalLM": "VllmNpuExtQwen3ForCausalLM",
    "Qwen3ForSequenceClassification": "VllmNpuExtQwen3ForSequenceClassification",
}
# our registered name -> the checkpoint architecture vLLM reports for it
CHECKPOINT_NAMES = {ours: architecture for architecture, ours in OVERRIDES.items()}
WRAPPED_METHODS = ("resolve_model_cls", "inspect_model_cls")
_ORIGINAL = "__vllm_npu_ext_original__"


def ours_for(model_config: Any) -> bool:
    """Whether runs with this model config get our classes."""
    runner = getattr(model_config, "runner_type", None)
    return runner == "pooling" or (runner is not None and envs.GENERATION())


def substituted(architectures: str | list[str]) -> list[str]:
    """`architectures` with each overridden name replaced by our registered name."""
    names = [architectures] if isinstance(architectures, str) else list(architectures)
    return [OVERRIDES.get(name, name) for name in names]


def _wrap(method):
    @functools.wraps(method)
    def wrapper(self, architectures, model_config, *args, **kwargs):
        if not ours_for(model_config):
            return method(self, architectures, model_config, *args, **kwargs)
        result, name = method(self, substituted(architectures), model_config, *args, **kwargs)
        # Report the checkpoint's architecture name, as vLLM does for the class it resolves.
        return result, CHECKPOINT_NAMES.get(name, name)

    setattr(wrapper, _ORIGINAL, method)
    return wrapper


def install(registrations: dict[str, str]) -> list[str]:
    """Register our classes (`OVERRIDES` value -> "module:Class") and wrap the registry."""
    from vllm import ModelRegistry

    for name, model_class in registrations.items():
        ModelRegistry.register_model(name, model_class)
    registry_type = type(ModelRegistry)
    for method_name in WRAPPED_METHODS:
        method = getattr(registry_type, method_name)
        if not hasattr(method, _ORIGINAL):
            setattr(registry_type, method_name, _wrap(method))
    generation = "pooling and generation" if envs.GENERATION() else "pooling runs"
    described = []
    for architecture, ours in OVERRIDES.items():
        if ours in registrations:
            described.append(f"{architecture} -> {registrations[ours]} for {generation}")
        else:  # an alias that vLLM's suffix rewrite turns into one of our names
            described.append(f"{architecture} -> {ours} (vLLM's adapter over ours)")
    return described


def install_ours() -> list[str]:
    """`install` with the package's own classes (`vllm_npu_ext.model_registrations`)."""
    from vllm_npu_ext import model_registrations

    return install(model_registrations())


def uninstall() -> None:
    """Restore the registry's methods (our registrations stay, unused)."""
    from vllm import ModelRegistry

    registry_type = type(ModelRegistry)
    for method_name in WRAPPED_METHODS:
        method = getattr(registry_type, method_name)
        original = getattr(method, _ORIGINAL, None)
        if original is not None:
            setattr(registry_type, method_name, original)
