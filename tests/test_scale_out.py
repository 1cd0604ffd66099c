"""Tensor parallelism: `--tensor-parallel-size 2` gives the same embeddings as one rank, on the
platform path and on the NPU path (`VLLM_NPU_EXT_EMULATE=1`), and a TP server stops cleanly
under load.

vLLM's CPU backend runs one worker process per rank. Its automatic thread binding gives each
rank its own NUMA node, and this machine has one, so the ranks are bound by hand, one core
each (`VLLM_CPU_OMP_THREADS_BIND=0|1`). The two TP servers run one after the other: the
SIGTERM test stops the platform one before the emulated one starts. The platform one runs on
the vLLM 0.23 stack only (`PLATFORM_TP_SERVER` says why).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
import torch
from support.engines import PARITY_TEXTS
from support.hf_oracle import MIN_COSINE, cosines, embeddings_of_edited_model, hf_embeddings
from support.loadgen import cosine, embed_alone, embed_batch, served_model, word_texts
from support.server import TEST_SERVER_FLAGS, running_server
from support.shutdown import group_alive_after, load_in_background, wait_exit

TP = 2
SHUTDOWN_LIMIT_S = 30
BIAS_CONFIG = "attention_bias_fp32"  # q/k/v/o biases: o_proj's is row-parallel
# The platform path's TP server runs on the vLLM 0.23 stack only (tests/support/stacks.py).
PLATFORM_TP_SERVER = pytest.mark.one_stack(reason=(
    "the platform path under TP (vLLM's parallel layers and kernels under our model class, the "
    "same code of ours on both versions); on vLLM 0.32 our fused TP layers run in "
    "test_tensor_parallel_npu_path_matches_one_rank_and_hf and the shutdown guard under load in "
    "test_long_inputs' SIGTERM test"))  # fmt: skip


def _rank_cores() -> str:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < TP:
        raise RuntimeError(f"tensor parallel size {TP} needs {TP} cores, this machine has {cores}")
    per_rank = len(cores) // TP
    return "|".join(
        ",".join(str(c) for c in cores[r * per_rank : (r + 1) * per_rank]) for r in range(TP)
    )


@contextlib.contextmanager
def _tp_server(model_dir, root, env=None):
    args = [str(model_dir), *TEST_SERVER_FLAGS, "--tensor-parallel-size", str(TP)]
    env = {"VLLM_CPU_OMP_THREADS_BIND": _rank_cores(), **(env or {})}
    with running_server(args, root / "server.log", env) as server:
        yield server


@pytest.fixture(scope="module")
def tp_server(tiny_model_dir, tmp_path_factory):
    with _tp_server(tiny_model_dir, tmp_path_factory.mktemp("tp_server")) as server:
        yield server


@pytest.fixture(scope="module")
def emulated_tp_server(engine_runs, tmp_path_factory):
    """TP 2 on the NPU path, serving the checkpoint with q/k/v/o biases."""
    root = tmp_path_factory.mktemp("emulated_tp_server")
    model_dir = engine_runs.model_dir(BIAS_CONFIG)
    with _tp_server(model_dir, root, {"VLLM_NPU_EXT_EMULATE": "1"}) as server:
        yield server


@PLATFORM_TP_SERVER
@pytest.mark.parametrize("batched", [False, True], ids=["one text per request", "one batch"])
def test_tensor_parallel_embeddings_match_one_rank(tp_server, embedding_server, batched):
    texts = word_texts(16, 31, 1, 60)
    model = served_model(embedding_server.base_url)
    one_rank = embed_alone(embedding_server.base_url, model, texts)
    send = embed_batch if batched else embed_alone
    two_ranks = send(tp_server.base_url, model, texts)
    assert min(cosine(a, b) for a, b in zip(one_rank, two_ranks, strict=True)) >= MIN_COSINE


@PLATFORM_TP_SERVER
def test_tensor_parallel_server_runs_our_model_on_every_rank(tp_server):
    log = tp_server.log_text()
    assert log.count("vllm-npu-ext built Qwen3ForEmbedding") >= TP


@PLATFORM_TP_SERVER
def test_sigterm_under_load_exits_cleanly_in_bounded_time(tp_server):
    """Stops the platform TP server (after the tests above used it).

    vLLM stops its engine before its HTTP server, so a request arriving in between gets a
    5xx (with a message) rather than a refused connection; every request must still end,
    and every rank's worker must go with the server.
    """
    outcomes: list = []
    thread = load_in_background(tp_server, outcomes, concurrency=16)
    time.sleep(5)  # let the load build up
    code, stopped_in = wait_exit(tp_server, SHUTDOWN_LIMIT_S)
    leftover = group_alive_after(tp_server.process.pid, grace_s=15)
    thread.join(timeout=120)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(tp_server.process.pid, signal.SIGKILL)
    answered = sum(o.ok for o in outcomes)
    refused = sum(o.status == 0 for o in outcomes)
    print(f"SIGTERM under load: exit {code} after {stopped_in:.1f} s; {answered} answered, "
          f"{len(outcomes) - answered - refused} 5xx, {refused} connection errors")  # fmt: skip
    assert code == 0, tp_server.log_tail(60)
    assert not leftover, "engine processes outlived the server"
    assert not thread.is_alive(), "a client request hung after the server stopped"
    assert "Application shutdown complete" in tp_server.log_text()
    assert answered > 0
    unexplained = [o for o in outcomes if not (o.ok or o.status == 0 or _server_error(o))]
    assert not unexplained, [(o.status, o.error) for o in unexplained[:5]]


def _server_error(outcome) -> bool:
    return outcome.status >= 500 and bool(outcome.error)


@pytest.mark.parametrize("name", [BIAS_CONFIG])
def test_tensor_parallel_npu_path_matches_one_rank_and_hf(emulated_tp_server, engine_runs, name):
    model = served_model(emulated_tp_server.base_url)
    two_ranks = torch.tensor(embed_batch(emulated_tp_server.base_url, model, PARITY_TEXTS))
    one_rank = engine_runs[name]["batch"]  # the NPU path on one rank, same checkpoint
    expected = hf_embeddings(engine_runs.model_dir(name), PARITY_TEXTS)
    vs_one_rank = cosines(two_ranks, one_rank).min().item()
    vs_hf = cosines(two_ranks, expected).min().item()
    print(f"NPU path, TP 2: worst cosine {vs_one_rank:.7f} to one rank, {vs_hf:.7f} to HF")
    assert vs_one_rank >= MIN_COSINE and vs_hf >= MIN_COSINE
    log = emulated_tp_server.log_text()
    assert log.count("backend: NPU path (torch_npu emulator on the CPU)") >= TP


@pytest.mark.parametrize("name", [BIAS_CONFIG])
def test_a_row_parallel_bias_added_by_every_rank_or_none_would_be_seen(engine_runs, name):
    """o_proj's bias must be added once, before the all-reduce (`fused._bias`): added by both
    ranks it would count twice, dropped it would count zero times. Either moves the
    embeddings far below the parity bar of the test above, so that test can see a broken
    rule."""
    model_dir = engine_runs.model_dir(name)
    expected = hf_embeddings(model_dir, PARITY_TEXTS)
    for factor in (2.0, 0.0):
        def scale_o_bias(model, factor=factor):
            for layer in model.layers:
                layer.self_attn.o_proj.bias.data *= factor

        wrong = embeddings_of_edited_model(model_dir, PARITY_TEXTS, scale_o_bias)
        worst = cosines(wrong, expected).min().item()
        print(f"o_proj bias x{factor}: worst cosine {worst:.5f} to HF")
        assert worst < MIN_COSINE, factor
