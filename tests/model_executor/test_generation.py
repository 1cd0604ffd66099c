"""Generation with the plugin installed: vLLM's own Qwen3 unless asked, ours when asked.

Greedy, 32 tokens, `ignore_eos`, float32. The checkpoint's random weights are drawn wide
(`initializer_range` 0.3) so that greedy decoding walks through many different tokens rather
than repeating one, and the top two logits stay far apart (>= 0.01 on this checkpoint) next
to float32 rounding. One in-process engine per configuration (tests/support/generation_worker.py),
two at a time.
"""

from __future__ import annotations

import json

import pytest
from support.engines import PARITY_TEXTS
from support.hf_oracle import hf_greedy_tokens
from support.scripts import load_script
from tokenizers import Tokenizer

from vllm_npu_ext.tiny_model import make_tiny_model

MAX_TOKENS = 32
VLLM_QWEN3 = "vllm.model_executor.models.qwen3.Qwen3ForCausalLM"
OUR_QWEN3 = "vllm_npu_ext.model_executor.models.qwen3.Qwen3ForCausalLM"
PROMPTS = PARITY_TEXTS[:3]


# `VLLM_PLUGINS` allowing every installed vLLM plugin but ours: the benchmarks' "stock" side.
PLUGINS_BUT_OURS = load_script("benchmarks/bench_embed.py").vllm_plugins(include_ours=False)
# configuration -> (environment, worker flags)
RUNS: dict[str, tuple[dict[str, str], list[str]]] = {
    "plugin default": ({}, []),
    "plugin excluded": ({"VLLM_PLUGINS": PLUGINS_BUT_OURS}, []),
    "ours, platform path": ({"VLLM_NPU_EXT_GENERATION": "1"}, ["--compile"]),
    "ours, NPU path": ({"VLLM_NPU_EXT_GENERATION": "1"}, ["--emulate"]),
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("generation") / "model", initializer_range=0.3)


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return [tokenizer.encode(text).ids for text in PROMPTS]


@pytest.fixture(scope="module")
def runs(worker_pool, model_dir, prompts, tmp_path_factory):
    """All configurations started together; `runs(name)` waits for one."""
    root = tmp_path_factory.mktemp("generation_runs")
    args = ["--model", str(model_dir), "--prompts", json.dumps(prompts),
            "--max-tokens", str(MAX_TOKENS)]  # fmt: skip
    for i, (name, (env, flags)) in enumerate(RUNS.items()):
        worker_pool.submit(f"generation/{name}", "generation_worker.py", [*args, *flags],
                           root / f"run{i}.pt", env)  # fmt: skip
    worker_pool.wait([f"generation/{name}" for name in RUNS])
    return lambda name: worker_pool.result(f"generation/{name}")


@pytest.fixture(scope="module")
def hf_tokens(model_dir, prompts):
    return hf_greedy_tokens(model_dir, prompts, MAX_TOKENS)


def test_default_generation_is_vllms_own_qwen3_token_for_token(runs):
    default, stock = runs("plugin default"), runs("plugin excluded")
    assert default["registered"] and "vllm-npu-ext 0.1.0 registered" in default["log"]
    assert not stock["registered"] and "vllm-npu-ext" not in stock["log"]
    assert default["model_classes"][0] == stock["model_classes"][0] == VLLM_QWEN3
    assert not any(name.startswith("vllm_npu_ext") for name in default["model_classes"])
    assert default["tokens"] == stock["tokens"]
    _assert_generated(default["tokens"])


OPT_IN_BACKENDS = {
    "ours, platform path": "backend: platform kernels (cpu); compiled by vLLM",
    "ours, NPU path": "backend: NPU path (torch_npu emulator on the CPU)",
}


@pytest.mark.parametrize("name", OPT_IN_BACKENDS)
def test_opt_in_generation_runs_our_class_and_equals_hf_generate(runs, hf_tokens, name):
    run = runs(name)
    assert run["model_classes"][0] == OUR_QWEN3
    assert OPT_IN_BACKENDS[name] in run["log"]
    assert run["tokens"] == hf_tokens
    _assert_generated(hf_tokens)


def test_opt_in_generation_on_the_npu_path_runs_fused_operators(runs):
    calls = runs("ours, NPU path")["fused_calls"]
    for operator in ("npu_linear", "npu_rms_norm", "npu_add_rms_norm", "npu_mrope",
                     "npu_swiglu"):  # fmt: skip
        assert calls.get(operator, 0) > 0, calls
    # float32: q/k/v through the merged projection (npu_grouped_matmul takes one tensor only).
    assert not calls.get("npu_grouped_matmul"), calls
    # With a KV cache, attention goes through vLLM's attention layer, which owns the cache.
    assert not calls.get("npu_fusion_attention"), calls


def _assert_generated(tokens: list[list[int]]) -> None:
    assert [len(t) for t in tokens] == [MAX_TOKENS] * len(PROMPTS)
    assert all(len(set(t)) >= MAX_TOKENS // 2 for t in tokens), tokens  # not one repeated token
