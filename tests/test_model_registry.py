"""Which Qwen3 class vLLM's registry resolves with the plugin: ours for pooling runs only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm import ModelRegistry
from vllm.model_executor.models import qwen3 as vllm_qwen3

import vllm_npu_ext
from vllm_npu_ext.model_executor.models import qwen3 as our_qwen3
from vllm_npu_ext.patches import vllm_model_registry


@pytest.fixture
def registry(monkeypatch):
    """The registry with our wrappers installed; restored afterwards."""
    monkeypatch.delenv(vllm_model_registry.GENERATION_SWITCH, raising=False)
    monkeypatch.delenv("VLLM_NPU_EXT_KV_CACHE_FREE", raising=False)
    vllm_model_registry.install(vllm_npu_ext.model_registrations())
    yield ModelRegistry
    vllm_model_registry.uninstall()


def model_config(runner_type: str | None):
    """What resolve/inspect read of a ModelConfig (runner_type absent before it is chosen)."""
    config = SimpleNamespace(model_impl="auto", convert_type="none")
    if runner_type is not None:
        config.runner_type = runner_type
    return config


@pytest.mark.parametrize(
    ("runner_type", "ours"), [(None, False), ("generate", False), ("pooling", True)]
)
def test_pooling_runs_resolve_to_our_class_and_generation_to_vllms(registry, runner_type, ours):
    model_cls, arch = registry.resolve_model_cls(["Qwen3ForCausalLM"], model_config(runner_type))
    assert arch == "Qwen3ForCausalLM"
    assert model_cls is (our_qwen3.Qwen3ForCausalLM if ours else vllm_qwen3.Qwen3ForCausalLM)
    info, arch = registry.inspect_model_cls("Qwen3ForCausalLM", model_config(runner_type))
    assert arch == "Qwen3ForCausalLM"
    assert info.attn_type == ("encoder_only" if ours else "decoder")


def test_generation_opt_in_resolves_to_our_class(registry, monkeypatch):
    monkeypatch.setenv(vllm_model_registry.GENERATION_SWITCH, "1")
    model_cls, _ = registry.resolve_model_cls(["Qwen3ForCausalLM"], model_config("generate"))
    assert model_cls is our_qwen3.Qwen3ForCausalLM
    # The runner is chosen from vLLM's own class, as without the plugin.
    model_cls, _ = registry.resolve_model_cls(["Qwen3ForCausalLM"], model_config(None))
    assert model_cls is vllm_qwen3.Qwen3ForCausalLM


def test_other_architectures_are_untouched(registry):
    model_cls, arch = registry.resolve_model_cls(["LlamaForCausalLM"], model_config("pooling"))
    assert arch == "LlamaForCausalLM"
    assert model_cls.__module__ == "vllm.model_executor.models.llama"


def test_uninstall_restores_vllms_resolution(registry):
    vllm_model_registry.uninstall()
    model_cls, _ = registry.resolve_model_cls(["Qwen3ForCausalLM"], model_config("pooling"))
    assert model_cls is vllm_qwen3.Qwen3ForCausalLM


def test_install_is_idempotent(registry):
    vllm_model_registry.install(vllm_npu_ext.model_registrations())
    vllm_model_registry.uninstall()
    model_cls, _ = registry.resolve_model_cls(["Qwen3ForCausalLM"], model_config("pooling"))
    assert model_cls is vllm_qwen3.Qwen3ForCausalLM


def test_emulate_switch_installs_the_emulator_in_register(monkeypatch, caplog):
    import sys

    from vllm_npu_ext import emulator

    monkeypatch.setattr(vllm_npu_ext, "_registered_in_pid", None)
    for name in ("VLLM_NPU_EXT_MODEL_OVERRIDE", "VLLM_NPU_EXT_CP_PATCH", "VLLM_NPU_EXT_BOOTSTRAP"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setenv(vllm_npu_ext.EMULATE_SWITCH, "1")
    assert sys.modules.get("torch_npu") is not emulator
    vllm_npu_ext.register()
    try:
        assert sys.modules["torch_npu"] is emulator
    finally:
        emulator.uninstall()
