"""Float32 projections for bf16/fp16 models on CPUs without a native half-precision matmul
(`vllm_npu_ext.model_executor.layers.cpu_matmul`): the choice, the linear method, and a bf16
engine on the CPU platform path (the parity runs of tests/model_executor/test_model_parity.py
build their engines under the emulator, so their platform-path figures never use it)."""

from __future__ import annotations

import json
import platform

import pytest
import torch
from support.engines import KV_CACHE_BYTES, PARITY_TEXTS
from support.hf_oracle import cosines, hf_embeddings
from torch import nn

from vllm_npu_ext.model_executor.layers import cpu_matmul_choice
from vllm_npu_ext.model_executor.layers.cpu_matmul import Float32MatmulLinearMethod
from vllm_npu_ext.model_executor.layers.cpu_matmul_choice import SWITCH
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

BF16_CONFIG = "gqa4_bf16"  # support.engines.ENGINE_CONFIGS: head_dim 128, 8 q / 2 kv heads


@pytest.mark.parametrize("value", ["auto", "1", "0"])
def test_never_on_the_npu_path_nor_for_float32_models(monkeypatch, value):
    monkeypatch.setenv(SWITCH, value)
    assert cpu_matmul_choice.choose(torch.bfloat16, cpu_platform_path=False) == (
        False, "not the CPU platform path",
    )  # fmt: skip
    assert cpu_matmul_choice.choose(torch.float32, cpu_platform_path=True)[0] is False


def test_the_switch_forces_either_way(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    assert cpu_matmul_choice.choose(torch.bfloat16, True) == (True, f"{SWITCH}=1")
    monkeypatch.setenv(SWITCH, "0")
    assert cpu_matmul_choice.choose(torch.float16, True) == (False, f"{SWITCH}=0")


def test_auto_follows_the_cpus_native_support(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    for dtype in (torch.bfloat16, torch.float16):
        on, why = cpu_matmul_choice.choose(dtype, True)
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        assert on == (x86 and not cpu_matmul_choice.native_half_matmul(dtype)), why
        assert why.startswith("auto: ")
    monkeypatch.setattr(cpu_matmul_choice, "native_half_matmul", lambda dtype: True)
    monkeypatch.setattr(cpu_matmul_choice.platform, "machine", lambda: "x86_64")
    assert cpu_matmul_choice.choose(torch.bfloat16, True) == (
        False, "auto: this CPU multiplies torch.bfloat16 natively",
    )  # fmt: skip
    monkeypatch.setattr(cpu_matmul_choice.platform, "machine", lambda: "aarch64")
    assert cpu_matmul_choice.choose(torch.bfloat16, True)[0] is False


def test_an_unknown_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=SWITCH):
        cpu_matmul_choice.choose(torch.bfloat16, True)


def _layer(dtype, bias: bool) -> nn.Module:
    layer = nn.Module()
    generator = torch.Generator().manual_seed(0)
    layer.weight = nn.Parameter(torch.randn(48, 40, generator=generator).to(dtype), False)
    bias_values = torch.randn(48, generator=generator).to(dtype)
    layer.bias = nn.Parameter(bias_values, False) if bias else None
    return layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [False, True])
def test_loaded_weights_become_exact_float32_and_outputs_keep_the_dtype(dtype, bias):
    layer = _layer(dtype, bias)
    loaded_weight = layer.weight.detach().clone()
    method = Float32MatmulLinearMethod()
    method.process_weights_after_loading(layer)
    assert layer.weight.dtype == torch.float32 and not layer.weight.requires_grad
    assert torch.equal(layer.weight.to(dtype), loaded_weight)  # the checkpoint's values
    assert (layer.bias is None) == (not bias)
    x = torch.randn(7, 40, generator=torch.Generator().manual_seed(1)).to(dtype)
    out = method.apply(layer, x, layer.bias)
    assert out.dtype == dtype and out.shape == (7, 48)
    exact = x.double() @ loaded_weight.double().t()
    if bias:
        assert layer.bias.dtype == torch.float32
        exact += layer.bias.double()
    # float32 products of exact half-precision values, rounded once to the dtype
    assert torch.equal(out, exact.to(dtype)) or (out.double() - exact).abs().max() <= (
        exact.abs().max() * torch.finfo(dtype).eps
    )


@pytest.fixture(scope="module")
def bf16_platform_run(worker_pool, engine_runs, tmp_path_factory):
    """One bf16 engine on the CPU platform path (no emulator), the switch at its default."""
    model_dir = engine_runs.model_dir(BF16_CONFIG)
    args = [
        "--model", str(model_dir), "--dtype", "bfloat16", "--texts", json.dumps(PARITY_TEXTS),
        "--skip-packed", "--engine-args", json.dumps({"kv_cache_memory_bytes": KV_CACHE_BYTES}),
    ]  # fmt: skip
    out = tmp_path_factory.mktemp("cpu_matmul") / "bf16_platform.pt"
    worker_pool.submit("cpu_matmul/bf16_platform", "engine_worker.py", args, out)
    run = worker_pool.result("cpu_matmul/bf16_platform")
    return {**run, "hf": hf_embeddings(model_dir, PARITY_TEXTS)}


def test_bf16_engine_says_whether_it_multiplies_in_float32(bf16_platform_run):
    on, why = cpu_matmul_choice.choose(torch.bfloat16, cpu_platform_path=True)
    log = bf16_platform_run["log"]
    assert "backend: platform kernels (cpu)" in log
    assert ("projections in float32" in log) == on, why
    if on:  # 4 per layer: q/k/v, o, gate/up, down
        assert f"projections in float32 ({why})" in log


def test_bf16_engine_on_the_platform_path_matches_hf(bf16_platform_run):
    bound = min_embedding_cosine(torch.bfloat16)
    for key in ("batch", "single"):
        worst = cosines(bf16_platform_run[key], bf16_platform_run["hf"]).min().item()
        assert worst >= bound, f"{key}: worst cosine {worst:.7f} < {bound}"
