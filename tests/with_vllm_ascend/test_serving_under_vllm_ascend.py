"""The whole server inside vllm-ascend: NPUPlatform, NPUWorker and NPUModelRunner, unchanged, on
the stand-in's host-backed `npu` device (`VLLM_NPU_EXT_EMULATE=1 vllm-npu-ext serve ...
--enforce-eager` with vllm-ascend on the path).

- `tp2_server`: the tiny checkpoint with tensor parallelism 2 (two NPUWorkers whose HCCL
  groups are the stand-in's gloo-carried `hccl`): embeddings at parity with Hugging Face, every
  bad input 400 with a message, no traceback in the log, `device_config=npu`.
- `reranker_server`: `--reranker` on a tiny Qwen3-Reranker: /rerank and /score at parity with
  the model card's formula.
- `benchmarks/_vllm_ascend_engine.py` (one in-process engine per run, as a worker process
  does; count_ops.py's `--vllm-ascend` runs it too): the worker, runner and device, the KV
  cache as vllm-ascend's runner allocated it, the operators of a decoder layer (count_ops.py's
  entries); stock vllm-ascend (our model plugin left out of VLLM_PLUGINS) under the same
  stand-in, which stops at its first Triton kernel; and our model in default graph mode, which
  stops where vllm-ascend's compiler imports its graph compiler.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import torch
from support.bad_requests import BAD_INPUTS, MALFORMED_JSON
from support.engines import PARITY_TEXTS
from support.hf_oracle import MIN_COSINE, cosines, hf_embeddings
from support.loadgen import embed_batch, served_model
from support.rerank_oracle import hf_rerank_scores
from support.rerank_servers import DOCUMENTS, QUERY, rerank_scores
from support.server import TEST_SERVER_FLAGS, Server
from support.vllm_ascend_env import TESTS, subprocess_env

RERANK_MAX_DIFF = 1e-5  # float32, as benchmarks/README.md's parity rule
ENGINE_SCRIPT = TESTS.parent / "benchmarks" / "_vllm_ascend_engine.py"
# vLLM's triton placeholder: vllm-ascend's block table launches vLLM's slot-mapping kernel
# (worker/block_table.py:165) for every KV-cached model; without a Triton backend it is a plain
# function.
STOCK_OBSTACLE = "'function' object is not subscriptable"
# Default graph mode: vLLM's compile backend configures vllm-ascend's fusion passes
# (compilation/graph_fusion_pass_manager.py:55), whose base class imports Huawei's graph
# compiler, npugraph_ex or else torchair, for `register_replacement`
# (compilation/passes/base_pattern.py:9-12, :55); neither exists off Ascend, nor in the stand-in.
GRAPH_OBSTACLE = "No module named 'torchair'"


class Started:
    """Both servers and the three engine runs, started together (start-ups overlap on the 2
    cores: vLLM's start-up is mostly single-threaded Python), always stopped."""

    def __init__(self, tiny_model_dir, root):
        from vllm_npu_ext.tiny_model import make_tiny_model

        self.reranker_dir = make_tiny_model(root / "reranker-model", preset="reranker")
        self.servers, self.engines = {}, {}
        try:
            tp2 = [str(tiny_model_dir), "--enforce-eager", "--tensor-parallel-size", "2",
                   *TEST_SERVER_FLAGS]  # fmt: skip
            self.servers["tp2"] = Server(tp2, root / "tp2.log", subprocess_env())
            reranker = [str(self.reranker_dir), "--reranker", "--enforce-eager", "--dtype",
                        "float32", "--max-model-len", "512"]  # fmt: skip
            self.servers["reranker"] = Server(reranker, root / "reranker.log", subprocess_env())
            runs = (("plugin", ()), ("stock", ("--stock",)),
                    ("graph", ("--engine-args", json.dumps({"enforce_eager": False}))))
            for name, flags in runs:
                out, log = root / f"{name}.json", root / f"{name}.log"
                self.engines[name] = (out, log, start_engine(tiny_model_dir, out, log, *flags))
        except BaseException:
            self.stop()
            raise

    def server(self, name):
        server = self.servers[name]
        server.wait_healthy()
        return server

    def engine(self, name):
        out, log, process = self.engines[name]
        process.wait(timeout=900)
        return process.returncode, log.read_text(errors="replace"), out

    def stop(self):
        for server in self.servers.values():
            server.stop()
        for _, _, process in self.engines.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def started(vllm_ascend_started, tiny_model_dir, tmp_path_factory):
    runs = Started(tiny_model_dir, tmp_path_factory.mktemp("serving"))
    try:
        yield runs
    finally:
        runs.stop()


@pytest.fixture(scope="module")
def tp2_server(started):
    server = started.server("tp2")
    server.model = served_model(server.base_url)
    return server


@pytest.fixture(scope="module")
def reranker_server(started):
    server = started.server("reranker")
    server.model, server.model_dir = str(started.reranker_dir), started.reranker_dir
    return server


def start_engine(model_dir, out, log, *flags):
    with open(log, "wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(ENGINE_SCRIPT), "--model", str(model_dir), "--out", str(out),
             "--texts", json.dumps(PARITY_TEXTS), *flags],
            env=subprocess_env(), stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.fixture(scope="module")
def plugin_engine(started):
    returncode, output, out = started.engine("plugin")
    assert returncode == 0, output[-6000:]
    return json.loads(out.read_text())


def test_the_server_runs_on_vllm_ascends_platform_with_an_npu_device(tp2_server):
    log = tp2_server.log_text()
    assert "Platform plugin ascend is activated" in log
    assert "device_config=npu" in log
    assert "backend: NPU path (torch_npu emulator on the CPU)" in log
    assert "tensor_parallel_size=2" in log


def test_tp2_embeddings_match_hugging_face(tp2_server, tiny_model_dir):
    got = torch.tensor(embed_batch(tp2_server.base_url, tp2_server.model, PARITY_TEXTS))
    worst = cosines(got, hf_embeddings(tiny_model_dir, PARITY_TEXTS)).min().item()
    print(f"vllm-ascend TP=2 server vs Hugging Face: worst cosine {worst:.7f}")
    assert worst >= MIN_COSINE


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_400(tp2_server, case):
    body = {"model": tp2_server.model, **BAD_INPUTS[case]}
    response = httpx.post(f"{tp2_server.base_url}/v1/embeddings", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]


def test_malformed_json_gets_400_and_no_traceback_is_logged(tp2_server, tiny_model_dir):
    response = httpx.post(
        f"{tp2_server.base_url}/v1/embeddings", content=MALFORMED_JSON,
        headers={"content-type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 400
    got = torch.tensor(embed_batch(tp2_server.base_url, tp2_server.model, PARITY_TEXTS[:2]))
    assert cosines(got, hf_embeddings(tiny_model_dir, PARITY_TEXTS[:2])).min() >= MIN_COSINE
    assert "Traceback" not in tp2_server.log_text()


@pytest.mark.parametrize("path", ["/rerank", "/score"])
def test_the_reranker_matches_the_model_card(reranker_server, path):
    got = rerank_scores(reranker_server, QUERY, DOCUMENTS, path=path)
    want = hf_rerank_scores(reranker_server.model_dir, QUERY, DOCUMENTS)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    print(f"vllm-ascend reranker server {path}: max |score - model card| {worst:.2e}")
    assert worst <= RERANK_MAX_DIFF
    assert "device_config=npu" in reranker_server.log_text()


def test_vllm_ascends_worker_and_runner_serve_our_model_on_npu(plugin_engine, tiny_model_dir):
    r = plugin_engine
    assert r["worker"] == "vllm_ascend.worker.worker.NPUWorker"
    assert r["runner"] == "vllm_ascend.worker.model_runner_v1.NPUModelRunner"
    assert r["torch_npu_is_stand_in"] is True
    assert r["device"] == "npu:0" and r["parameter_devices"] == ["npu:0"]
    assert r["npu_tensors"] and r["device_allocated_bytes"] > 0
    got = torch.tensor(r["embeddings"])
    assert cosines(got, hf_embeddings(tiny_model_dir, PARITY_TEXTS)).min() >= MIN_COSINE


def test_the_cache_free_model_gets_no_kv_cache_from_vllm_ascends_runner(plugin_engine):
    """One encoder-only group (vLLM adds it for our attention), and 0 bytes of KV tensors."""
    assert plugin_engine["kv_cache_groups"] == 1
    assert plugin_engine["kv_cache_tensor_bytes"] == 0


def engine_module():
    """benchmarks/_vllm_ascend_engine.py, whose `entry` makes count_ops.py's entries."""
    sys.path.insert(0, str(ENGINE_SCRIPT.parent))
    import _vllm_ascend_engine

    return _vllm_ascend_engine


def test_a_decoder_layer_runs_twelve_device_operators(plugin_engine):
    entry = engine_module().entry(0, plugin_engine, "")
    assert entry["ops"] == {
        "torch_npu.npu_add_rms_norm": 1, "torch_npu.npu_linear": 4,
        "torch_npu.npu_rms_norm": 3, "torch_npu.npu_rotary_mul": 2, "torch_npu.npu_swiglu": 1,
        "vllm_npu_ext.cache_free_attention": 1,
    }, entry  # fmt: skip
    assert entry["per_layer"] == 12 and entry["kv_cache_tensor_bytes"] == 0


def test_stock_vllm_ascend_stops_at_its_first_triton_kernel(started):
    """Stock vllm-ascend (our model plugin left out) under the same stand-in: its worker loads
    and warms up (the stand-in's `_npu_matmul_add_fp32`, `_npu_rotary_embedding`), then its
    block table launches vLLM's Triton slot-mapping kernel, which has no backend here."""
    returncode, output, _ = started.engine("stock")
    assert returncode != 0
    assert STOCK_OBSTACLE in output
    assert "block_table.py" in output and "compute_slot_mapping" in output
    assert "vllm-npu-ext built" not in output  # vLLM's own Qwen3, with vllm-ascend's ops
    entry = engine_module().entry(returncode, None, output)
    assert STOCK_OBSTACLE in entry["blocked"]


def test_default_graph_mode_stops_at_vllm_ascends_graph_compiler_import(started):
    """Without --enforce-eager (PIECEWISE for pooling) the engine loads and starts compiling our
    model (torch_npu.__version__ goes into vllm-ascend's compile hash), then vllm-ascend's
    fusion passes need npugraph_ex/torchair, before any ACL graph is captured."""
    returncode, output, _ = started.engine("graph")
    assert returncode != 0
    assert GRAPH_OBSTACLE in output and "base_pattern.py" in output
    assert "capture_model" in output  # NPUModelRunner.capture_model compiles first
    assert "cudagraph_mode': <CUDAGraphMode.PIECEWISE" in output
