"""Two nodes on one machine over loopback, as docs/serving.md's multi-node commands run them.

- data parallel 2: the head node serves the API and runs rank 0
  (`--data-parallel-size 2 --data-parallel-size-local 1`), the second node runs rank 1 headless
  (`--headless --data-parallel-start-rank 1`);
- tensor parallel 2 across two nodes (`--nnodes 2 --node-rank 0|1 --master-addr 127.0.0.1`),
  node 1 headless.

Each node is its own `vllm-npu-ext serve` process group with its own bootstrap probe
(tests/support/bootstrap_probe.py), bound to its own core, and must serve the embeddings of one
rank (the shared `embedding_server`); under data parallel each rank must finish requests of
its own (vLLM's per-engine request counter on the head node's /metrics). The two
configurations run one after the other (module fixture, parametrized), each stopped before
the next starts.
"""

from __future__ import annotations

import contextlib
import os
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.bootstrap_order import assert_ordered
from support.bootstrap_probe import probe_server_env, read_records
from support.hf_oracle import MIN_COSINE
from support.loadgen import cosine, embed_alone, embed_batch, served_model, word_texts
from support.server import TEST_SERVER_FLAGS, Server, free_port, running_server

LOOPBACK = "127.0.0.1"
pytestmark = pytest.mark.one_stack(reason=(
    "vLLM's multi-node data- and tensor-parallel machinery; what of ours runs in it (the serve "
    "arguments, server.main's headless branch into vLLM's ServeSubcommand.cmd, the bootstrap, our "
    "model under TP) is the same code on both versions: on vLLM 0.32, tests/cli (arguments), "
    "tests/bootstrap (every process of a server) and test_scale_out's NPU-path TP server"))


def _data_parallel(port: int) -> tuple[list[str], list[str]]:
    common = ["--data-parallel-size", "2", "--data-parallel-size-local", "1",
              "--data-parallel-address", LOOPBACK,
              "--data-parallel-rpc-port", str(port)]  # fmt: skip
    return common, ["--headless", "--data-parallel-start-rank", "1", *common]


def _tensor_parallel(port: int) -> tuple[list[str], list[str]]:
    common = ["--tensor-parallel-size", "2", "--nnodes", "2", "--master-addr", LOOPBACK,
              "--master-port", str(port)]  # fmt: skip
    return [*common, "--node-rank", "0"], [*common, "--node-rank", "1", "--headless"]


LAYOUTS = {"data parallel": _data_parallel, "tensor parallel": _tensor_parallel}


def _node_env(probe_dir, core: int) -> dict[str, str]:
    """One core per node (each node has one local rank); distinct VLLM_PORTs, since vLLM picks
    its other ports upwards from it and two nodes starting at once could take the same one."""
    probe_dir.mkdir()
    return {**probe_server_env(probe_dir), "VLLM_CPU_OMP_THREADS_BIND": str(core),
            "VLLM_PORT": str(free_port())}  # fmt: skip


@contextlib.contextmanager
def _headless_node(args, root, env):
    """The second node: no API server, so no health check; stopped afterwards."""
    node = Server(args, root / "node1.log", env)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module", params=list(LAYOUTS))
def two_nodes(request, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param.replace(" ", "_"))
    cores = sorted(os.sched_getaffinity(0))
    head_args, headless_args = LAYOUTS[request.param](free_port())
    model = [str(tiny_model_dir), *TEST_SERVER_FLAGS]
    envs = [_node_env(root / f"probe{rank}", cores[rank % len(cores)]) for rank in (0, 1)]
    with _headless_node([*model, *headless_args], root, envs[1]) as headless, \
            running_server([*model, *head_args], root / "node0.log", envs[0]) as head:  # fmt: skip
        head.probe_dir, headless.probe_dir = root / "probe0", root / "probe1"
        head.layout = request.param
        yield head, headless


@pytest.mark.parametrize("batched", [False, True], ids=["one text per request", "one batch"])
def test_two_nodes_serve_the_embeddings_of_one_rank(two_nodes, embedding_server, batched):
    head, headless = two_nodes
    texts = word_texts(8, 41, 1, 60)
    model = served_model(embedding_server.base_url)
    one_rank = embed_alone(embedding_server.base_url, model, texts)
    send = embed_batch if batched else embed_alone
    vectors = send(head.base_url, model, texts)
    worst = min(cosine(a, b) for a, b in zip(one_rank, vectors, strict=True))
    print(f"{head.layout}, two nodes: worst cosine {worst:.7f} to one rank")
    assert worst >= MIN_COSINE
    assert headless.process.poll() is None, headless.log_tail()


def _finished_requests_per_engine(base_url: str) -> dict[str, float]:
    """vLLM's `vllm:request_success_total` on the head node's /metrics, summed per `engine`
    label (the data-parallel rank whose engine finished the request)."""
    counts: dict[str, float] = {}
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            engine = labels.get("engine", "?")
            counts[engine] = counts.get(engine, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.parametrize("two_nodes", ["data parallel"], indirect=True)
def test_both_data_parallel_ranks_serve_requests(two_nodes, embedding_server):
    """Concurrent requests to the head node are shared between rank 0 (head) and rank 1
    (the headless node): each engine finished some, by its own request counter."""
    head, headless = two_nodes
    model = served_model(embedding_server.base_url)
    before = _finished_requests_per_engine(head.base_url)
    texts = word_texts(16, 43, 1, 40)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda text: embed_alone(head.base_url, model, [text]), texts))
    after = _finished_requests_per_engine(head.base_url)
    served = {engine: after.get(engine, 0.0) - before.get(engine, 0.0) for engine in after}
    print(f"requests finished per data-parallel rank: {served}")
    assert set(served) == {"0", "1"} and sum(served.values()) == len(texts), served
    assert served["0"] > 0 and served["1"] > 0, served
    assert headless.process.poll() is None, headless.log_tail()


# vLLM's model-inspection subprocess: started only when its model-info cache (keyed by the hash
# of the model's source file) misses, so whether a node has one depends on the cache's state.
INSPECTION_SUBPROCESS = "-m vllm.model_executor.models.registry"


@pytest.mark.parametrize("node", [0, 1], ids=["head node", "headless node"])
def test_every_process_of_both_nodes_puts_our_package_first(two_nodes, node):
    server = two_nodes[node]
    records = read_records(server.probe_dir)
    titles = [f"{r['title']} {r['process_name']}" for r in records]
    # Every node runs a launcher and at least one worker; data parallel adds its EngineCore.
    assert len(records) >= 2 and any("Worker" in title for title in titles), titles
    log = server.log_text()
    for record in records:
        assert_ordered(record, server.probe_dir, ("at_general_plugin_load", "final"))
        if INSPECTION_SUBPROCESS in record["title"]:
            continue  # vLLM captures its output (`_run_in_subprocess`): nothing reaches the log
        assert f"vllm-npu-ext custom-op bootstrap in pid {record['pid']}:" in log
    assert log.count("vllm-npu-ext built Qwen3ForEmbedding") >= 1
