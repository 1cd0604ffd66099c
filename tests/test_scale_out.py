"""Tensor parallelism: `--tensor-parallel-size 2` gives the same embeddings as one rank.

vLLM's CPU backend runs one worker process per rank. Its automatic thread binding gives each
rank its own NUMA node, and this machine has one, so the ranks are bound by hand, one core
each (`VLLM_CPU_OMP_THREADS_BIND=0|1`).
"""

from __future__ import annotations

import os

import pytest
from support.hf_oracle import MIN_COSINE
from support.loadgen import cosine, embed_alone, embed_batch, served_model, word_texts
from support.server import running_server

TP = 2


def _rank_cores() -> str:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < TP:
        raise RuntimeError(f"tensor parallel size {TP} needs {TP} cores, this machine has {cores}")
    per_rank = len(cores) // TP
    return "|".join(
        ",".join(str(c) for c in cores[r * per_rank : (r + 1) * per_rank]) for r in range(TP)
    )


@pytest.fixture(scope="module")
def tp_server(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_server")
    args = [str(tiny_model_dir), "--dtype", "float32", "--max-model-len", "128",
            "--gpu-memory-utilization", "0.3", "--tensor-parallel-size", str(TP)]
    env = {"VLLM_CPU_OMP_THREADS_BIND": _rank_cores()}
    with running_server(args, root / "server.log", env) as server:
        yield server


@pytest.mark.parametrize("batched", [False, True], ids=["one text per request", "one batch"])
def test_tensor_parallel_embeddings_match_one_rank(tp_server, embedding_server, batched):
    texts = word_texts(16, 31, 1, 60)
    model = served_model(embedding_server.base_url)
    one_rank = embed_alone(embedding_server.base_url, model, texts)
    send = embed_batch if batched else embed_alone
    two_ranks = send(tp_server.base_url, model, texts)
    assert min(cosine(a, b) for a, b in zip(one_rank, two_ranks, strict=True)) >= MIN_COSINE


def test_tensor_parallel_server_runs_our_model_on_every_rank(tp_server):
    log = tp_server.log_text()
    assert log.count("vllm-npu-ext built Qwen3ForEmbedding") >= TP
