"""Environment switches: one table, per-fusion switches and the master switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_npu_ext import envs, qwen3_class
from vllm_npu_ext.envs import FUSIONS
from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig


def test_all_fusions_on_by_default(monkeypatch):
    for name in envs.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert FusionConfig.from_env().active() == list(FUSIONS)


@pytest.mark.parametrize("fusion", FUSIONS)
def test_each_fusion_switches_off_alone(monkeypatch, fusion):
    monkeypatch.setenv(f"VLLM_NPU_EXT_FUSE_{fusion.upper()}", "0")
    config = FusionConfig.from_env()
    assert not getattr(config, fusion)
    assert config.active() == [f for f in FUSIONS if f != fusion]
    assert config == FusionConfig().without(fusion)


def test_master_switch_turns_everything_off(monkeypatch):
    monkeypatch.setenv("VLLM_NPU_EXT_FUSED", "0")
    assert FusionConfig.from_env().active() == []
    assert FusionConfig.all_off().active() == []


def test_bad_values_are_named(monkeypatch):
    monkeypatch.setenv("VLLM_NPU_EXT_ATTENTION_OP", "flash")
    with pytest.raises(ValueError, match="VLLM_NPU_EXT_ATTENTION_OP"):
        FusionConfig.from_env()
    with pytest.raises(ValueError, match="unknown vllm-npu-ext environment variable"):
        envs.get("VLLM_NPU_EXT_TYPO")
    with pytest.raises(ValueError, match="fusion must be one of"):
        FusionConfig().without("softmax")


def test_kv_cache_switch_selects_the_registered_class(monkeypatch):
    monkeypatch.setenv("VLLM_NPU_EXT_KV_CACHE_FREE", "1")
    assert qwen3_class().endswith(":Qwen3ForCausalLM")
    monkeypatch.setenv("VLLM_NPU_EXT_KV_CACHE_FREE", "0")
    assert qwen3_class().endswith(":Qwen3KVCacheForCausalLM")


def test_describe_lists_every_variable(monkeypatch):
    monkeypatch.setenv("VLLM_NPU_EXT_FUSE_ROTARY", "0")
    described = envs.describe()
    assert set(described) == set(envs.VARIABLES)
    assert described["VLLM_NPU_EXT_FUSE_ROTARY"] == {"value": "0", "default": "1", "set": "true"}


def test_one_cache_directory_for_models_templates_and_kernel_builds(monkeypatch, tmp_path):
    from vllm_npu_ext import reranker, tiny_model
    from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel import build

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("VLLM_NPU_EXT_HOST_KERNEL_CACHE", raising=False)
    assert envs.cache_dir() == tmp_path / "vllm_npu_ext"
    assert tiny_model.default_model_dir("tiny").parent == envs.cache_dir()
    assert build.default_cache_dir() == envs.cache_dir() / "host-kernel"
    template = reranker.template_path("Find code that answers the question")
    assert template.parent == envs.cache_dir() / "templates"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert envs.cache_dir() == Path.home() / ".cache" / "vllm_npu_ext"
