"""vLLM engines in processes of their own: one worker run per configuration, kept for the session.

A vLLM engine holds process-wide state (distributed groups, compile caches, the torch_npu
emulator) and takes seconds to start, so each configuration runs once, in a subprocess
(`engine_worker.py` for embeddings, `generation_worker.py` for generation), and every test
that needs it reads the saved results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from support import model_info_cache
from support.server import DIE_WITH_PARENT, KV_CACHE_BYTES
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine
from vllm_npu_ext.tiny_model import corpus, make_tiny_model

SUPPORT_DIR = Path(__file__).resolve().parent
WORKER_TIMEOUT_S = 900

# Odd lengths on purpose: 1-token inputs, repeated words, digits, punctuation.
PARITY_TEXTS = [
    "a",
    "Hello world, the query!",
    "The document is long and has many tokens in it; it keeps going for a while 12345.",
    "x y z",
    "retrieval " * 17,
]
# Each is embedded twice in a row (NPU path, platform path): longer than one 128-token KV
# block, shorter than the engines' 256-token model length.
REPEAT_TEXTS = [" ".join(corpus(num_sentences=10, seed=seed)) for seed in (41, 42)]

# Checkpoint configurations for the parity runs: GQA ratios 1, 2 and 4, tied and untied
# embeddings, head_dim 32, 64 and 128; float32 (fused attention through npu_fusion_attention,
# q/k/v through the merged projection: npu_fused_infer_attention_score and a three-tensor
# npu_grouped_matmul take no float32) and one in bfloat16 with head_dim 128 (through
# npu_fused_infer_attention_score, whose TND layout takes head_dim 128 or 192 only, and
# npu_grouped_matmul), as Qwen3-Embedding runs on Ascend.
# `env` and `engine_args` reach the engine; `kv_cache` says the engine keeps vLLM's KV cache
# (attention then goes through vLLM's attention layer, on the NPU path too); those engines
# skip the forward_packed runs, which are the same code with or without a KV cache.
GQA4 = {
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
    "hidden_size": 160, "intermediate_size": 352,
}  # fmt: skip
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
    # q/k/v/o biases: the NPU path's linear layers with a bias (o_proj's is row-parallel).
    "attention_bias_fp32": {"dtype": "float32", "overrides": {"attention_bias": True}},
    # Pooling with vLLM's KV cache: switched on, or kept by an explicit prefix-caching flag.
    "kv_cache_fp32": {
        "dtype": "float32", "overrides": {}, "kv_cache": True,
        "env": {"VLLM_NPU_EXT_KV_CACHE_FREE": "0"},
    },
    "prefix_caching_fp32": {
        "dtype": "float32", "overrides": {}, "kv_cache": True,
        "engine_args": {"enable_prefix_caching": True},
    },
}  # fmt: skip


def min_cosine_of(name: str) -> float:
    """The cosine to the reference an `ENGINE_CONFIGS` run's embeddings must reach (its dtype's)."""
    return min_embedding_cosine(getattr(torch, ENGINE_CONFIGS[name]["dtype"]))


# Compiled engine runs (vLLM compiles the NPU path): configuration -> compilation config.
# bfloat16 also forces a full graph mode (the plugin falls back to PIECEWISE) and keeps
# dynamo's shape guards, so a recompilation for a new batch shape fails the run.
COMPILED_RUNS: dict[str, dict] = {
    "gqa2_tied_fp32": {},
    "gqa4_bf16": {
        "cudagraph_mode": "FULL_AND_PIECEWISE", "dynamic_shapes_config": {"evaluate_guards": True},
    },
}


class WorkerPool:
    """Worker runs, at most `parallel` at a time (an in-process CPU engine computes on one
    thread, so two engines share a 2-core machine well). Every process it started is killed
    by `close()` if still running."""

    def __init__(self, parallel: int):
        self._executor = ThreadPoolExecutor(max(1, parallel))
        self._futures: dict[str, Future] = {}
        self._running: set[subprocess.Popen] = set()

    def submit(self, name: str, script: str, args: list[str], out: Path, env=None) -> None:
        """Start `tests/support/<script> ARGS --out OUT` under `name` (once per name)."""
        if name not in self._futures:
            model_info_cache.warm()
            self._futures[name] = self._executor.submit(self._run, script, args, out, env)

    def result(self, name: str) -> dict:
        """The run's saved results plus its `log`; raises with the log tail if it failed."""
        return self._futures[name].result()

    def wait(self, names: list[str]) -> None:
        """Until every named run ended (failures are raised by `result`, per name)."""
        futures.wait([self._futures[name] for name in names])

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        for process in list(self._running):
            process.kill()
        self._executor.shutdown(wait=True)

    def _run(self, script: str, args: list[str], out: Path, env) -> dict:
        command = [sys.executable, str(SUPPORT_DIR / script), *args, "--out", str(out)]
        log_path = out.with_suffix(".log")
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                preexec_fn=DIE_WITH_PARENT,
            )
            self._running.add(process)
            try:
                code = process.wait(timeout=WORKER_TIMEOUT_S)
            finally:
                process.kill()  # no-op unless it timed out
                self._running.discard(process)
        text = log_path.read_text(errors="replace")
        if code != 0:
            raise RuntimeError(f"{script} {' '.join(args)[:300]} failed ({code}):\n{text[-8000:]}")
        return {**torch.load(out), "log": text}


class EngineRuns:
    """`engine_worker.py` once per `ENGINE_CONFIGS` entry.

    The first access starts the runs of `needed` (the configurations the collected tests
    use) together with the one asked for, and waits for all of them: no engine keeps
    computing in the background while later tests (servers, timings) run.
    """

    def __init__(self, pool: WorkerPool, root: Path, needed: set[str] = frozenset()):
        self.pool = pool
        self.root = root
        self.needed = set(needed)

    def model_dir(self, name: str) -> Path:
        path = self.root / name
        if not (path / "model.safetensors").exists():
            make_tiny_model(path, **ENGINE_CONFIGS[name]["overrides"])
        return path

    def compiled(self, name: str) -> dict:
        """The compiled engine run of configuration `name` (`COMPILED_RUNS`)."""
        compilation = COMPILED_RUNS[name]
        # evaluate_guards needs vLLM to call the compiled function through dynamo.
        env = {"VLLM_USE_BYTECODE_HOOK": "0"} if compilation.get("dynamic_shapes_config") else {}
        config = ENGINE_CONFIGS[name]
        args = [
            "--model", str(self.model_dir(name)), "--dtype", config["dtype"],
            "--texts", json.dumps(PARITY_TEXTS), "--emulate",
            "--engine-args", json.dumps({"kv_cache_memory_bytes": KV_CACHE_BYTES}),
            "--compiled", json.dumps(compilation),
        ]  # fmt: skip
        key = f"compiled/{name}"
        self.pool.submit(key, "engine_worker.py", args, self.root / f"{name}_compiled.pt", env)
        self.pool.wait([key])
        return self.pool.result(key)

    def __getitem__(self, name: str) -> dict:
        batch = [name, *sorted(self.needed - {name})]
        for each in batch:
            self._submit(each)
        self.needed.clear()
        self.pool.wait([f"engine/{each}" for each in batch])
        return self.pool.result(f"engine/{name}")

    def _submit(self, name: str) -> None:
        config = ENGINE_CONFIGS[name]
        args = [
            "--model", str(self.model_dir(name)), "--dtype", config["dtype"],
            "--texts", json.dumps(PARITY_TEXTS), "--emulate",
            "--engine-args",
            json.dumps({"kv_cache_memory_bytes": KV_CACHE_BYTES, **config.get("engine_args", {})}),
            "--repeat-texts", json.dumps(REPEAT_TEXTS),
            *(["--skip-packed"] if config.get("kv_cache") else []),
        ]  # fmt: skip
        self.pool.submit(f"engine/{name}", "engine_worker.py", args, self.root / f"{name}.pt",
                         config.get("env"))  # fmt: skip
