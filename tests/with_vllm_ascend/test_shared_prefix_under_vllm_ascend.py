"""Shared prefixes under vllm-ascend's own platform, worker and model runner (stand-in `npu`
device), in its default graph mode and in piecewise graphs.

One bf16 head_dim-128 checkpoint (the shapes FIA takes), texts behind Qwen3-Embedding's
instruction plus an unrelated one, embedded in one step and one per step
(`benchmarks/_vllm_ascend_engine.py`):
- our default, one graph per forward: the sharing step runs that compiled forward eagerly (no
  captured graph holds shared-prefix attention) and every other step replays as before;
- piecewise (`VLLM_NPU_EXT_FULL_GRAPH=0`): the sharing step replays the graphs of the smallest
  capture size that holds its unique rows, attention between them;
- the bf16 Qwen3-Reranker in one graph per forward: one query against documents in one step.
Each must compute only the unique tokens, equal the texts one per step and Hugging Face
within the bf16 bound, and rerank scores must equal each pair alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from support.hf_oracle import cosines, hf_embeddings
from support.server import DIE_WITH_PARENT
from support.vllm_ascend_env import TEST_COMPILATION, TESTS, subprocess_env, vllm_port

from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

INSTRUCTION = ("Instruct: Given a web search query, retrieve relevant passages that answer "
               "the query\nQuery:")  # fmt: skip
TEXTS = [INSTRUCTION + " what is the capital of france", "unrelated text about the weather",
         INSTRUCTION + " how tall is mount everest in meters", INSTRUCTION + " x",
         INSTRUCTION + " which river flows through paris and into the sea"]  # fmt: skip
DOCUMENTS = ["The Seine.", "The Seine flows through Paris to the sea at Le Havre.",
             "Berlin lies on the Spree.", "The Seine."]  # fmt: skip
MIN_COSINE = min_embedding_cosine(torch.bfloat16)
RERANK_MAX_DIFF = 1e-2  # bf16 scores, one step against one pair per step (both eager here)
ENGINE_SCRIPT = TESTS.parent / "benchmarks" / "_vllm_ascend_engine.py"


def engine_module():
    sys.path.insert(0, str(ENGINE_SCRIPT.parent))
    import _vllm_ascend_engine

    return _vllm_ascend_engine


def start_engine(model_dir, out, log, *flags, **env):
    with open(log, "wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(ENGINE_SCRIPT), "--model", str(model_dir), "--out", str(out),
             *flags], env=subprocess_env(**env), stdout=output, stderr=subprocess.STDOUT,
            preexec_fn=DIE_WITH_PARENT,
        )  # fmt: skip


@pytest.fixture(scope="module")
def runs(vllm_ascend_started, tmp_path_factory):
    from vllm_npu_ext.tiny_model import make_tiny_model

    engine = engine_module()
    root = tmp_path_factory.mktemp("shared_prefix_vllm_ascend")
    model_dir = make_tiny_model(root / "model", **engine.STOCK_CHECKPOINT)
    reranker_dir = make_tiny_model(root / "reranker", preset="reranker",
                                   **engine.STOCK_CHECKPOINT)  # fmt: skip
    graphs = ("--engine-args", json.dumps({**engine.STOCK_ENGINE_ARGS, "enforce_eager": False,
                                           "compilation_config": TEST_COMPILATION}))
    plan = {
        "full": (model_dir, ("--texts", json.dumps(TEXTS), *graphs), {}),
        "piecewise": (model_dir, ("--texts", json.dumps(TEXTS), *graphs),
                      {"VLLM_NPU_EXT_FULL_GRAPH": "0"}),
        "rerank": (reranker_dir, ("--texts", json.dumps(DOCUMENTS), "--rerank",
                                  "which river flows through Paris?", *graphs), {}),
    }  # fmt: skip
    processes = {}
    try:
        for index, (name, (directory, flags, env)) in enumerate(plan.items()):
            out, log = root / f"{name}.json", root / f"{name}.log"
            env = {**env, "VLLM_PORT": vllm_port("shared_prefix", index)}
            processes[name] = (out, log, start_engine(directory, out, log, *flags, **env))
        results = {}
        for name, (out, log, process) in processes.items():
            process.wait(timeout=900)
            assert process.returncode == 0, log.read_text(errors="replace")[-6000:]
            results[name] = json.loads(out.read_text())
        results["model_dir"] = model_dir
        return results
    finally:
        for _, _, process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.mark.parametrize("mode", ["full", "piecewise"])
def test_the_step_computes_its_unique_tokens_once(runs, mode):
    sharing = runs[mode]["shared_prefixes"]
    assert sharing["shared_steps"] == 1, sharing
    assert sharing["computed_tokens"] < sharing["tokens"] * 0.6, sharing


@pytest.mark.parametrize("mode", ["full", "piecewise"])
def test_embeddings_equal_one_per_step_and_hugging_face(runs, mode):
    batch = torch.tensor(runs[mode]["embeddings"])
    assert cosines(batch, torch.tensor(runs[mode]["embeddings_one_by_one"])).min() >= MIN_COSINE
    assert cosines(batch, hf_embeddings(runs["model_dir"], TEXTS)).min() >= MIN_COSINE


def test_one_graph_per_forward_runs_the_sharing_step_outside_its_graphs(runs):
    result = runs["full"]
    assert result["graph_mode"] == "full" and result["graphs"]["captures"] > 0
    assert result["batch_graph_replays"] == 0
    assert result["shared_prefixes"]["last_graph_mode"] == "NONE"
    # the steps of one text each replayed their graph, updated
    assert result["full_graph"]["updates"] >= len(TEXTS)


def test_piecewise_replays_the_graph_of_the_unique_rows(runs):
    result = runs["piecewise"]
    sharing = result["shared_prefixes"]
    unique = sharing["computed_tokens"]
    sizes = sorted(result["capture_sizes"])
    expected = next(size for size in sizes if size >= unique)
    assert sharing["last_graph_mode"] == "PIECEWISE"
    assert sharing["last_rows"] == expected < sharing["tokens"]
    assert result["batch_graph_replays"] == result["layers"] + 1


def test_rerank_scores_of_one_step_equal_each_pair_alone(runs):
    result = runs["rerank"]
    assert result["shared_prefixes"]["shared_steps"] == 1
    diffs = [abs(a - b) for a, b in zip(result["embeddings"], result["embeddings_one_by_one"],
                                        strict=True)]  # fmt: skip
    assert max(diffs) <= RERANK_MAX_DIFF
