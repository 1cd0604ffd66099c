"""Shared fixtures: tiny checkpoints, in-process engine runs and one real server per session.

A vLLM engine takes tens of seconds to start on 2 cores, so each checkpoint's engine run and
the HTTP server are session-scoped and shared by every test that needs them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel import build as host_kernel_build
from vllm_npu_ext.tiny_model import make_tiny_model

TESTS_DIR = Path(__file__).resolve().parent

# Odd lengths on purpose: 1-token inputs, repeated words, digits, punctuation.
PARITY_TEXTS = [
    "a",
    "Hello world, the query!",
    "The document is long and has many tokens in it; it keeps going for a while 12345.",
    "x y z",
    "retrieval " * 17,
]

# Checkpoint configurations for the parity runs: GQA ratios 1, 2 and 4, tied and untied
# embeddings, head_dim 32, 64 and 128; three in float32 (fused attention through
# npu_fusion_attention, q/k/v through the merged projection: npu_fused_infer_attention_score
# and a three-tensor npu_grouped_matmul take no float32) and one in bfloat16 with head_dim 128
# (through npu_fused_infer_attention_score, whose TND layout takes head_dim 128 or 192 only,
# and npu_grouped_matmul), as Qwen3-Embedding runs on Ascend.
GQA4 = {
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "hidden_size": 160, "intermediate_size": 352,
}
ENGINE_CONFIGS: dict[str, dict] = {
    "gqa2_tied_fp32": {"dtype": "float32", "overrides": {}},
    "gqa1_untied_fp32": {
        "dtype": "float32",
        "overrides": {
            "num_key_value_heads": 4, "tie_word_embeddings": False, "num_hidden_layers": 3,
        },
    },
    "gqa4_fp32": {"dtype": "float32", "overrides": GQA4},
    "gqa4_bf16": {"dtype": "bfloat16", "overrides": {**GQA4, "head_dim": 128}},
}


def pytest_collection_modifyitems(config, items):
    """The NPU tier runs only when selected (`-m npu`); elsewhere it is deselected, not skipped."""
    if "npu" in (config.getoption("-m") or ""):
        return
    deselected = [item for item in items if item.get_closest_marker("npu")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("npu")]


@pytest.fixture(scope="session", autouse=True)
def host_kernel_cache(tmp_path_factory):
    """One host build of our AscendC kernel per session, in the session's tmp directory (unless
    VLLM_NPU_EXT_HOST_KERNEL_CACHE is set), shared with the subprocesses tests start."""
    variable = host_kernel_build.CACHE_VARIABLE
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get(variable):
            patch.setenv(variable, str(tmp_path_factory.mktemp("host_kernel")))
        yield Path(os.environ[variable])


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


# Compiled engine runs (vLLM compiles the NPU path): configuration -> compilation config.
# bfloat16 also forces a full graph mode (the plugin falls back to PIECEWISE) and keeps
# dynamo's shape guards, so a recompilation for a new batch shape fails the run.
COMPILED_RUNS: dict[str, dict] = {
    "gqa2_tied_fp32": {},
    "gqa4_bf16": {
        "cudagraph_mode": "FULL_AND_PIECEWISE", "dynamic_shapes_config": {"evaluate_guards": True},
    },
}


class EngineRuns:
    """Runs `tests/support/engine_worker.py` once per configuration, on first use."""

    def __init__(self, root: Path):
        self.root = root
        self._results: dict[str, dict] = {}

    def compiled(self, name: str) -> dict:
        """The compiled engine run of configuration `name` (`COMPILED_RUNS`)."""
        compilation = COMPILED_RUNS[name]
        # evaluate_guards needs vLLM to call the compiled function through dynamo.
        env = {"VLLM_USE_BYTECODE_HOOK": "0"} if compilation.get("dynamic_shapes_config") else {}
        return self._run(f"{name}_compiled", name, ["--compiled", json.dumps(compilation)], env)

    def model_dir(self, name: str) -> Path:
        path = self.root / name
        if not (path / "model.safetensors").exists():
            make_tiny_model(path, **ENGINE_CONFIGS[name]["overrides"])
        return path

    def __getitem__(self, name: str) -> dict:
        return self._run(name, name, [], {})

    def _run(self, key: str, name: str, extra: list[str], env: dict[str, str]) -> dict:
        if key not in self._results:
            out = self.root / f"{key}.pt"
            command = [
                sys.executable, str(TESTS_DIR / "support" / "engine_worker.py"),
                "--model", str(self.model_dir(name)), "--dtype", ENGINE_CONFIGS[name]["dtype"],
                "--out", str(out), "--texts", json.dumps(PARITY_TEXTS), "--emulate", *extra,
            ]  # fmt: skip
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=900, env={**os.environ, **env}
            )
            if done.returncode != 0:
                log = done.stdout[-3000:] + done.stderr[-6000:]
                raise RuntimeError(f"engine run {key} failed:\n{log}")
            self._results[key] = {**torch.load(out), "log": done.stdout + done.stderr}
        return self._results[key]


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory) -> EngineRuns:
    return EngineRuns(tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="session")
def embedding_server(tiny_model_dir, tmp_path_factory):
    """`vllm-npu-ext serve` on the tiny checkpoint (float32), shared by all HTTP tests."""
    from support.bootstrap_probe import probe_server_env
    from support.server import running_server

    root = tmp_path_factory.mktemp("server")
    probe_dir = root / "probe"
    probe_dir.mkdir()
    args = [str(tiny_model_dir), "--dtype", "float32", "--max-model-len", "128",
            "--gpu-memory-utilization", "0.3"]  # fmt: skip
    with running_server(args, root / "server.log", probe_server_env(probe_dir)) as server:
        server.probe_dir = probe_dir
        yield server


@pytest.fixture(scope="session")
def emulated_embedding_server(tiny_model_dir, tmp_path_factory):
    """`vllm-npu-ext serve` of the tiny float32 checkpoint on the NPU path (torch_npu
    emulator in every vLLM process), vLLM's default graph mode."""
    from support.server import running_server

    root = tmp_path_factory.mktemp("emulated_server")
    args = [str(tiny_model_dir), "--dtype", "float32", "--max-model-len", "128",
            "--gpu-memory-utilization", "0.3"]  # fmt: skip
    with running_server(args, root / "server.log", {"VLLM_NPU_EXT_EMULATE": "1"}) as server:
        yield server


@pytest.fixture(scope="session")
def reranker_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "reranker", preset="reranker")


@pytest.fixture(scope="session")
def rerank_engine_run(reranker_model_dir, tmp_path_factory) -> dict:
    """`tests/support/rerank_engine_worker.py` on the tiny reranker: emulated, then platform."""
    from support.rerank_servers import run_rerank_engine

    return run_rerank_engine(tmp_path_factory.mktemp("rerank_engine"), reranker_model_dir)


@pytest.fixture(scope="session")
def reranker_server(tmp_path_factory):
    """`vllm-npu-ext serve --reranker` (built-in tiny reranker, float32, platform path)."""
    from support.rerank_servers import reranker_server

    with reranker_server(tmp_path_factory.mktemp("reranker_server")) as server:
        yield server


@pytest.fixture(scope="module")
def emulated_reranker_server(tmp_path_factory):
    """The reranker server with VLLM_NPU_EXT_EMULATE=1 and a server instruction (one module
    uses it; stopped after that module)."""
    from support.rerank_servers import emulated_reranker_server

    with emulated_reranker_server(tmp_path_factory.mktemp("emulated_reranker")) as server:
        yield server
