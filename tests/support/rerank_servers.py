"""Reranker engines and servers for the tests: started once, shared, always stopped.

- `run_rerank_engine`: one in-process engine subprocess (`rerank_engine_worker.py`, run by
  the session's `WorkerPool`) that scores `ENGINE_CASES` on the emulated NPU path, then on
  the platform path.
- `reranker_server`: `vllm-npu-ext serve --reranker` with no model (the built-in tiny
  reranker, created in a private cache directory), float32, on the platform path.
- `emulated_reranker_server`: the same command on an untied-embedding tiny reranker with
  `VLLM_NPU_EXT_EMULATE=1` (every process runs the NPU path under the emulator) and a
  server-wide instruction (`SERVER_INSTRUCTION`).

Each server object gets `model_dir` (for the oracle), `instruction` (the server's default
instruction, None for the model card's) and `model` (the served name).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from unittest import mock

import httpx

from support.engines import WorkerPool
from support.server import running_server
from vllm_npu_ext.tiny_model import DEFAULT_RERANKER_NAME, default_model_dir, make_tiny_model

MAX_MODEL_LEN = 512
SERVER_ARGS = ["--reranker", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
               "--gpu-memory-utilization", "0.3"]  # fmt: skip
SERVER_INSTRUCTION = 'Given a "question" about cities, find passages that name the city \\ 🏙'
QUERY = "What is the capital of France?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "a",
    "",
    "Berlin is the capital of Germany; it has many museums and a long history 1989.",
    "x y z",
    "The capital of France is a city on the Seine with about two million people. " * 4,
    "Ünïcödé tëxt ✓ and <tags> {{ braces }}",
]
# Per-request instruction in the engine run: one that changes every score.
CASE_INSTRUCTION = "Given a city name, judge whether the passage describes its weather"
ENGINE_CASES = [
    {"query": QUERY, "documents": DOCUMENTS},
    {"query": QUERY, "documents": DOCUMENTS[:3], "instruction": CASE_INSTRUCTION},
    {"query": "a", "documents": ["b"]},
]


def run_rerank_engine(pool: WorkerPool, work_dir: Path, model_dir: Path) -> dict:
    """The engine worker's results for `ENGINE_CASES`, plus its log."""
    args = ["--model", str(model_dir), "--cases", json.dumps(ENGINE_CASES)]
    pool.submit("rerank_engine", "rerank_engine_worker.py", args, work_dir / "rerank_engine.pt")
    pool.wait(["rerank_engine"])
    return pool.result("rerank_engine")


@contextlib.contextmanager
def reranker_server(root: Path):
    """`vllm-npu-ext serve --reranker`, no model given: the built-in tiny reranker."""
    env = {"XDG_CACHE_HOME": str(root / "cache")}
    with running_server(SERVER_ARGS, root / "server.log", env) as server:
        with mock.patch.dict("os.environ", env):
            server.model_dir = default_model_dir("reranker")
        server.instruction = None
        server.model = DEFAULT_RERANKER_NAME
        yield server


@contextlib.contextmanager
def emulated_reranker_server(root: Path):
    """An untied tiny reranker, emulated NPU path in every process, a server instruction."""
    model_dir = make_tiny_model(root / "untied", preset="reranker", tie_word_embeddings=False)
    env = {"XDG_CACHE_HOME": str(root / "cache"), "VLLM_NPU_EXT_EMULATE": "1"}
    args = [str(model_dir), *SERVER_ARGS, "--reranker-instruction", SERVER_INSTRUCTION]
    with running_server(args, root / "server.log", env) as server:
        server.model_dir = model_dir
        server.instruction = SERVER_INSTRUCTION
        server.model = str(model_dir)
        yield server


def post(server, path: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.base_url + path, json={"model": server.model, **body},
                      timeout=timeout)  # fmt: skip


def rerank_scores(server, query: str, documents: list, path: str = "/rerank", **extra):
    """Relevance scores in document order, from a rerank endpoint (or /score's `queries`)."""
    if path.endswith("score"):
        response = post(server, path, {"queries": query, "documents": documents, **extra})
        response.raise_for_status()
        return [d["score"] for d in sorted(response.json()["data"], key=lambda d: d["index"])]
    response = post(server, path, {"query": query, "documents": documents, **extra})
    response.raise_for_status()
    results = sorted(response.json()["results"], key=lambda r: r["index"])
    return [r["relevance_score"] for r in results]
