"""Which Qwen3 class vLLM's registry resolves with the plugin: ours for pooling runs only."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm import ModelRegistry
from vllm.model_executor.models import qwen3 as vllm_qwen3

import vllm_npu_ext
from vllm_npu_ext import envs
from vllm_npu_ext.model_executor.models import qwen3 as our_qwen3
from vllm_npu_ext.patches import vllm_model_registry


@pytest.fixture
def registry(monkeypatch):
    """The registry with our wrappers installed; restored afterwards."""
    monkeypatch.delenv(envs.GENERATION.name, raising=False)
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
    monkeypatch.setenv(envs.GENERATION.name, "1")
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
    monkeypatch.setenv(envs.EMULATE.name, "1")
    assert sys.modules.get("torch_npu") is not emulator
    vllm_npu_ext.register()
    try:
        assert sys.modules["torch_npu"] is emulator
    finally:
        emulator.uninstall()


def seq_cls_config():
    config = model_config("pooling")
    config.convert_type = "classify"
    return config


def test_reranker_alias_resolves_to_our_class_through_vllms_suffix_rewrite(registry):
    """Qwen3ForSequenceClassification: vLLM rewrites our alias's suffix to our registered
    causal-LM name (and wraps it in as_seq_cls_model when loading); the checkpoint's name is
    reported back, so vLLM's Qwen3-Reranker config hook still applies."""
    arch = "Qwen3ForSequenceClassification"
    assert vllm_model_registry.OVERRIDES[arch] not in registry.get_supported_archs()
    model_cls, name = registry.resolve_model_cls([arch], seq_cls_config())
    assert (model_cls, name) == (our_qwen3.Qwen3ForCausalLM, arch)
    info, name = registry.inspect_model_cls(arch, seq_cls_config())
    assert (info.attn_type, name) == ("encoder_only", arch)


def test_reranker_engine_config_builds_our_one_logit_cache_free_classifier(
    registry, reranker_model_dir
):
    """The whole config path of `serve --reranker` (no engine): convert=classify from the
    architecture name, the 2-way-softmax head with one label, our class under the adapter,
    no prefix caching or chunked prefill."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import get_model_architecture

    from vllm_npu_ext import reranker

    args = EngineArgs(model=str(reranker_model_dir), hf_overrides=reranker.HF_OVERRIDES,
                      skip_tokenizer_init=True, max_model_len=512)  # fmt: skip
    config = args.create_model_config()
    assert (config.runner_type, config.convert_type) == ("pooling", "classify")
    assert config.architecture == "Qwen3ForSequenceClassification"
    assert config.attn_type == "encoder_only"
    assert config.hf_config.method == "from_2_way_softmax"
    model_cls, _ = get_model_architecture(config)
    assert model_cls.__name__ == "Qwen3ForSequenceClassification"
    assert our_qwen3.Qwen3ForCausalLM in model_cls.__mro__
    engine = args.create_engine_config()
    assert engine.model_config.hf_config.num_labels == 1
    assert not engine.cache_config.enable_prefix_caching
    assert not engine.scheduler_config.enable_chunked_prefill
