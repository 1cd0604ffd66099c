"""vllm-ascend's `NPUPlatform.check_and_update_config` with our graph-mode hook, for real.

`EngineArgs.create_engine_config()` builds the VllmConfig as `vllm serve` does: vLLM runs our
per-architecture hook (`models/qwen3_config.Qwen3GraphModeHook`) and its own pooling override,
then vllm-ascend's `check_and_update_config` (vllm-ascend 0.23.0.post1
`NPUPlatform.check_and_update_config`). The final
`CompilationConfig` is asserted on the object, and our start-up check (`check_graph_mode`,
run when the model is built) accepts or refuses it.
"""

from __future__ import annotations

import pytest
from support.vllm_ascend_env import engine_config as vllm_serve_config

from vllm_npu_ext.model_executor.layers.cache_free.op import SPLITTING_OP
from vllm_npu_ext.model_executor.models import qwen3_config


def engine_config(model_dir, runner="pooling", compilation=None, additional=None, **more):
    return vllm_serve_config(
        model_dir, runner=runner, max_model_len=128,
        compilation_config=compilation or {}, additional_config=additional or {}, **more,
    )  # fmt: skip


@pytest.fixture(scope="module")
def configs(vllm_ascend_started, tiny_model_dir):
    return {
        "default": engine_config(tiny_model_dir),
        "forced_full": engine_config(tiny_model_dir, compilation={"cudagraph_mode": "FULL"}),
        "generate": engine_config(tiny_model_dir, runner="generate"),
        "xlite": engine_config(
            tiny_model_dir, additional={"xlite_graph_config": {"enabled": True}}
        ),
        "xlite_full": engine_config(
            tiny_model_dir,
            additional={"xlite_graph_config": {"enabled": True, "full_mode": True}},
        ),
        # vllm-ascend accepts profiling_chunk_config only with pipeline parallelism.
        "profiling_chunk": engine_config(
            tiny_model_dir, additional={"profiling_chunk_config": {"enabled": True}},
            pipeline_parallel_size=2,
        ),  # fmt: skip
    }


def test_configs_were_made_by_vllm_ascends_platform(configs, vllm_ascend_started):
    from vllm_ascend.ascend_config import get_ascend_config

    assert type(vllm_ascend_started).__name__ == "NPUPlatform"
    for config in configs.values():
        assert config.device_config.device.type == "npu"
    assert get_ascend_config() is not None  # init_ascend_config ran in check_and_update_config


@pytest.mark.parametrize("name", ["default", "forced_full"])
def test_pooling_runs_compile_piecewise_split_at_our_attention(configs, name):
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    compilation = configs[name].compilation_config
    assert compilation.mode == CompilationMode.VLLM_COMPILE
    assert compilation.cudagraph_mode == CUDAGraphMode.PIECEWISE  # FULL demoted
    assert SPLITTING_OP in compilation.splitting_ops
    assert "vllm::unified_attention_with_output" in compilation.splitting_ops
    qwen3_config.check_graph_mode(configs[name], compiled=True)


def test_generation_keeps_vllm_ascends_full_and_piecewise(configs):
    from vllm.config.compilation import CUDAGraphMode

    config = configs["generate"]
    assert not qwen3_config.cache_free_pooling(config)
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE


def test_xlite_decode_only_is_refused_at_start_up(configs):
    """vllm-ascend sets FULL_DECODE_ONLY under xlite after vLLM's pooling override
    (`NPUPlatform.check_and_update_config`, its `xlite_graph_config.enabled` branch): the model
    refuses to start rather than capture attention."""
    from vllm.config.compilation import CUDAGraphMode

    config = configs["xlite"]
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    with pytest.raises(ValueError, match="captures whole forward passes"):
        qwen3_config.check_graph_mode(config, compiled=True)


def test_xlite_full_mode_runs_eager(configs):
    """xlite's full mode turns ACL graphs off (`NPUPlatform.check_and_update_config`, its
    `xlite_graph_config.full_mode` branch): eager, nothing captured."""
    from vllm.config import CompilationMode
    from vllm.config.compilation import CUDAGraphMode

    config = configs["xlite_full"]
    assert config.model_config.enforce_eager
    assert config.compilation_config.mode == CompilationMode.NONE
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    qwen3_config.check_graph_mode(config, compiled=False)


def test_profiling_chunk_config_is_refused_at_start_up(configs):
    """vllm-ascend accepts it (ProfilingChunkScheduler, set in
    `NPUPlatform.check_and_update_config`); its warm-up
    forces attention in a dummy run, which needs a KV cache we do not have."""
    config = configs["profiling_chunk"]
    assert "ProfilingChunkScheduler" in str(config.scheduler_config.scheduler_cls)
    with pytest.raises(ValueError, match="profiling_chunk_config needs a KV cache"):
        qwen3_config.check_graph_mode(config, compiled=True)
