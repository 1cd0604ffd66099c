"""The whole server inside vllm-ascend: NPUPlatform, NPUWorker and NPUModelRunner, unchanged, on
the stand-in's host-backed `npu` device (`VLLM_NPU_EXT_EMULATE=1 vllm-npu-ext serve ...
--enforce-eager` with vllm-ascend on the path).

- `tp2_server`: the tiny checkpoint with tensor parallelism 2 (two NPUWorkers whose HCCL
  groups are the stand-in's gloo-carried `hccl`): embeddings at parity with Hugging Face, every
  bad input 400 with a message, no traceback in the log, `device_config=npu`.
- `reranker_server`: `--reranker` on a tiny Qwen3-Reranker, in default graph mode (piecewise
  ACL graphs captured and replayed on the stand-in's NPUGraph): /rerank and /score at parity
  with the model card's formula.
- `benchmarks/_vllm_ascend_engine.py` (one in-process engine per run, as a worker process
  does; count_ops.py's `--vllm-ascend` runs it too): the worker, runner and device, the KV
  cache as vllm-ascend's runner allocated it, the operators of a decoder layer (count_ops.py's
  entries); stock vllm-ascend (our model plugin left out of VLLM_PLUGINS) under the same
  stand-in beside our model, on one bf16 checkpoint (parity, KV cache, operators per layer);
  and our model and stock in default graph mode:
  vllm-ascend's compiler and fusion passes, its ACLGraphWrapper capturing every capture size on
  the stand-in's `NPUGraph` and replaying them, parity on other batch boundaries, and the
  operators inside the graphs and between replays (count_ops.py's `vllm_ascend_graph` and
  `stock_vllm_ascend_graph`).
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
from support.vllm_ascend_env import TESTS, server_env, subprocess_env

from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

RERANK_MAX_DIFF = 1e-5  # float32, as benchmarks/README.md's parity rule
ENGINE_SCRIPT = TESTS.parent / "benchmarks" / "_vllm_ascend_engine.py"


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
            self.servers["tp2"] = Server(tp2, root / "tp2.log", server_env())
            # The reranker serves in default graph mode (ACL graphs on the stand-in's NPUGraph).
            reranker = [str(self.reranker_dir), "--reranker", "--dtype", "float32",
                        "--max-model-len", "512"]  # fmt: skip
            self.servers["reranker"] = Server(reranker, root / "reranker.log", server_env())
            # Stock vllm-ascend and our model side by side on one bf16 checkpoint of the
            # shapes stock's attention takes (STOCK_CHECKPOINT in the engine script).
            engine = engine_module()
            self.stock_dir = make_tiny_model(root / "stock-model", **engine.STOCK_CHECKPOINT)
            bf16 = ("--engine-args", json.dumps(engine.STOCK_ENGINE_ARGS))
            runs = (("plugin", tiny_model_dir, ()), ("stock", self.stock_dir, ("--stock", *bf16)),
                    ("plugin_bf16", self.stock_dir, bf16),
                    ("graph_bf16", self.stock_dir, ("--engine-args", json.dumps(
                        {**engine.STOCK_ENGINE_ARGS, "enforce_eager": False}))),
                    ("stock_graph", self.stock_dir, ("--stock", "--engine-args", json.dumps(
                        {**engine.STOCK_ENGINE_ARGS, "enforce_eager": False}))),
                    ("graph", tiny_model_dir,
                     ("--engine-args", json.dumps({"enforce_eager": False}))))  # fmt: skip
            for name, model_dir, flags in runs:
                out, log = root / f"{name}.json", root / f"{name}.log"
                self.engines[name] = (out, log, start_engine(model_dir, out, log, *flags))
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
    log = reranker_server.log_text()
    assert "device_config=npu" in log and "Graph capturing finished" in log


def test_the_reranker_replays_acl_graphs_at_parity(reranker_server):
    """One document per request: 88-220 tokens, under the largest capture size (256), so each
    step replays the graphs captured for its padded size (seven documents in one step exceed it
    and run eagerly)."""
    want = hf_rerank_scores(reranker_server.model_dir, QUERY, DOCUMENTS)
    got = [rerank_scores(reranker_server, QUERY, [document], path="/rerank")[0]
           for document in DOCUMENTS]  # fmt: skip
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= RERANK_MAX_DIFF
    assert "Replaying aclgraph" in reranker_server.log_text()


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


@pytest.fixture(scope="module")
def stock_engine(started):
    returncode, output, out = started.engine("stock")
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


@pytest.fixture(scope="module")
def plugin_bf16_engine(started):
    returncode, output, out = started.engine("plugin_bf16")
    assert returncode == 0, output[-6000:]
    return json.loads(out.read_text())


def test_stock_vllm_ascend_serves_on_the_same_stand_in(stock_engine, started):
    """Stock vllm-ascend (our model plugin left out): vLLM's own Qwen3 with vllm-ascend's
    operators, its attention backend writing and reading a KV cache, its block table's
    Triton slot-mapping kernel (the stand-in's, `emulator/operators/vllm_triton.py`), and its
    operator library (the stand-in's `vllm_ascend_C`, `emulator/operators/vllm_ascend_library.py`):
    `enable_custom_op()` finds it, so the residual norms are `_C_ascend::npu_add_rms_norm_bias`,
    as on Ascend."""
    r = stock_engine
    assert r["worker"] == "vllm_ascend.worker.worker.NPUWorker"
    assert r["runner"] == "vllm_ascend.worker.model_runner_v1.NPUModelRunner"
    assert "vllm-npu-ext built" not in r["log"]
    assert r["model_base"] == "vllm.model_executor.models.qwen3.Qwen3ForCausalLM"
    assert r["device"] == "npu:0" and r["parameter_devices"] == ["npu:0"]
    assert r["dtype"] == "torch.bfloat16"
    calls = r["emulated_calls"]
    assert calls["triton:_compute_slot_mapping_kernel"] >= 1
    assert calls["_npu_reshape_and_cache"] >= 2 and calls["npu_fused_infer_attention_score"] >= 2
    assert r["forward"]["ops"]["triton_kernel._compute_slot_mapping_kernel"] == 1  # one launch
    assert calls["_C_ascend.npu_add_rms_norm_bias"] >= 2 and "npu_add_rms_norm" not in calls
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    for key in ("embeddings", "embeddings_one_by_one"):
        worst = cosines(torch.tensor(r[key]), want).min().item()
        print(f"stock vllm-ascend {key} vs Hugging Face (bf16): worst cosine {worst:.6f}")
        assert worst >= min_embedding_cosine(torch.bfloat16)


def test_side_by_side_with_stock_on_one_checkpoint(stock_engine, plugin_bf16_engine, started):
    """The same bf16 checkpoint, the same stand-in, the same counter: parity with Hugging Face,
    the KV cache vllm-ascend's runner allocated, and a decoder layer's operators. Stock's
    vLLM custom ops count once each, as ours do: `vllm.unified_attention_with_output` holds
    its ATB ReshapeAndCache and its FIA call, `vllm.unquantized_gemm` one matmul."""
    stock, ours = stock_engine, plugin_bf16_engine
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    worst = {name: cosines(torch.tensor(r["embeddings"]), want).min().item()
             for name, r in (("stock", stock), ("ours", ours))}  # fmt: skip
    print(f"bf16 checkpoint, worst cosine to Hugging Face: {worst}")
    assert min(worst.values()) >= min_embedding_cosine(torch.bfloat16)
    assert ours["model_base"].startswith("vllm_npu_ext.model_executor.models.qwen3.")
    assert stock["kv_cache_tensor_bytes"] == 16 << 20 and ours["kv_cache_tensor_bytes"] == 0
    module = engine_module()
    stock_entry, our_entry = module.entry(0, stock, ""), module.entry(0, ours, "")
    assert stock_entry["ops"] == {
        "_C_ascend.npu_add_rms_norm_bias": 1, "torch_npu.npu_rms_norm": 3,
        "torch_npu.npu_swiglu": 1,
        "vllm.maybe_chunk_residual": 1, "vllm.npu_rotary_embedding": 1,
        "vllm.unified_attention_with_output": 1, "vllm.unquantized_gemm": 4,
    }, stock_entry  # fmt: skip
    assert stock_entry["per_layer"] == 12 and our_entry["per_layer"] == 12


@pytest.fixture(scope="module")
def graph_engine(started):
    returncode, output, out = started.engine("graph")
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


def test_default_graph_mode_captures_and_replays_vllm_ascends_acl_graphs(graph_engine):
    """Without --enforce-eager: PIECEWISE (vLLM's choice for pooling), vllm-ascend's own compiler
    with its fusion passes (npugraph_ex off: vllm-ascend turns it off for piecewise graphs,
    platform.py:624-629), its ACLGraphWrapper capturing every capture size on the stand-in's
    NPUGraph and replaying one graph per piece: the layers' pieces between the attention ops."""
    r, log = graph_engine, graph_engine["log"]
    assert r["runner"] == "vllm_ascend.worker.model_runner_v1.NPUModelRunner"
    assert r["cudagraph_mode"] == "PIECEWISE" and r["device"] == "npu:0"
    assert "'enable_npugraph_ex': False" in log and "Replaying aclgraph" in log
    entry = engine_module().graph_entry(r)
    pieces = r["layers"] + 1
    assert entry["graph_replays_per_forward"] == pieces
    sizes = entry["capture_sizes"]
    assert sizes >= 8 and r["graphs"]["captures"] == sizes * pieces
    assert r["graphs"]["replays"] >= 4 * pieces  # warm-up, two embed calls, one per text, ...
    assert entry["kv_cache_tensor_bytes"] == 0


def test_graph_mode_embeddings_match_hf_across_batch_boundaries(graph_engine, tiny_model_dir):
    """Replays on sequence boundaries and padded sizes other than the captures' (5 texts of
    1-17 words in one step, then each alone). A replay that did not run the recorded work
    again left the capture's outputs: cosine 0.18-0.77 (checked by disabling it)."""
    want = hf_embeddings(tiny_model_dir, PARITY_TEXTS)
    for key in ("embeddings", "embeddings_one_by_one"):
        got = torch.tensor(graph_engine[key])
        assert cosines(got, want).min() >= MIN_COSINE, key


def test_graph_mode_runs_one_eager_operator_per_layer_between_replays(graph_engine):
    """count_ops.py's `vllm_ascend_graph` entry: per decoder layer, the cache-free attention op
    runs eagerly between replays; the layer's other 11 device operators are in the graphs
    (the final norm adds one rms_norm to the last piece; vllm-ascend's embedding adds its
    tensor-parallel reduce, `vllm.maybe_pad_and_reduce`, which returns its input at TP=1)."""
    entry = engine_module().graph_entry(graph_engine)
    layers = graph_engine["layers"]
    assert entry["eager_between_replays_per_layer"] == {"vllm_npu_ext.cache_free_attention": 1}
    captured = {name: count * layers for name, count in entry["captured_per_layer"].items()}
    assert captured == {
        "torch_npu.npu_add_rms_norm": 2 * layers, "torch_npu.npu_linear": 4 * layers,
        "torch_npu.npu_rms_norm": 2 * layers + 1, "torch_npu.npu_rotary_mul": 2 * layers,
        "torch_npu.npu_swiglu": layers, "vllm.maybe_pad_and_reduce": 1,
    }, entry  # fmt: skip


@pytest.fixture(scope="module")
def graph_bf16_engine(started):
    returncode, output, out = started.engine("graph_bf16")
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


def test_bf16_graph_mode_traces_vllm_ascends_quant_fusion_and_replays_at_parity(
    graph_bf16_engine, started
):
    """bf16 in default graph mode: vllm-ascend enables its norm-quant fusion pass for
    float16/bfloat16 models and traces its patterns, which call `npu_dynamic_quant` and
    `npu_add_rms_norm_dynamic_quant` (emulator/operators/quant.py; without them the engine did not
    start). Our model has no quantisation to fuse: the graphs replay at parity."""
    r, log = graph_bf16_engine, graph_bf16_engine["log"]
    assert "Enabled custom fusions: norm_quant" in log and "Replaying aclgraph" in log
    assert r["cudagraph_mode"] == "PIECEWISE" and r["dtype"] == "torch.bfloat16"
    pieces = r["layers"] + 1
    assert r["graphs"]["captures"] >= 8 * pieces and r["graphs"]["replays"] >= 4 * pieces
    entry = engine_module().graph_entry(r)
    assert entry["eager_between_replays_per_layer"] == {"vllm_npu_ext.cache_free_attention": 1}
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    for key in ("embeddings", "embeddings_one_by_one"):
        worst = cosines(torch.tensor(r[key]), want).min().item()
        assert worst >= min_embedding_cosine(torch.bfloat16), (key, worst)


@pytest.fixture(scope="module")
def stock_graph_engine(started):
    returncode, output, out = started.engine("stock_graph")
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


def test_stock_vllm_ascend_in_graph_mode_beside_ours(stock_graph_engine, graph_bf16_engine,
                                                     started):  # fmt: skip
    """Stock vllm-ascend in default graph mode, on the bf16 checkpoint our bf16 graph run
    serves. It starts only with vllm-ascend's operator library (its `AscendRMSNorm` makes the
    first `enable_custom_op()` call inside the traced forward, where a failed import stops
    dynamo: the stand-in's `vllm_ascend_C`) and its Triton QK-norm + RoPE operator (its fusion
    pass registers a replacement calling `vllm.qkv_rmsnorm_rope` for bf16 models with head_dim
    128, registered only with triton-ascend: the stand-in's,
    `emulator/operators/vllm_ascend_triton.py`).
    Parity with Hugging Face across batch boundaries; per decoder layer, stock runs its
    attention op eagerly between replays (ReshapeAndCache + FIA into its KV cache) and the
    slot-mapping kernel once per forward; in the graphs the fused QK-norm + RoPE replaced the
    two q/k norms and the rotary op."""
    stock, ours = stock_graph_engine, graph_bf16_engine
    assert stock["model_base"] == "vllm.model_executor.models.qwen3.Qwen3ForCausalLM"
    assert stock["cudagraph_mode"] == "PIECEWISE" and "Replaying aclgraph" in stock["log"]
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    for key in ("embeddings", "embeddings_one_by_one"):
        worst = cosines(torch.tensor(stock[key]), want).min().item()
        print(f"stock vllm-ascend graph mode {key} vs Hugging Face (bf16): worst {worst:.6f}")
        assert worst >= min_embedding_cosine(torch.bfloat16), (key, worst)
    module = engine_module()
    entry, our_entry = module.graph_entry(stock), module.graph_entry(ours)
    layers = stock["layers"]
    assert entry["graph_replays_per_forward"] == layers + 1
    assert entry["eager_between_replays_per_layer"] == {
        "triton_kernel._compute_slot_mapping_kernel": 1 / layers,
        "vllm.unified_attention_with_output": 1,
    }, entry  # fmt: skip
    captured = {name: count * layers for name, count in entry["captured_per_layer"].items()}
    assert captured == {
        "_C_ascend.npu_add_rms_norm_bias": 2 * layers, "torch_npu.npu_rms_norm": 1,
        "torch_npu.npu_swiglu": layers, "vllm.maybe_chunk_residual": 2 * layers,
        "vllm.maybe_pad_and_reduce": 1, "vllm.qkv_rmsnorm_rope": layers,
        "vllm.unquantized_gemm": 4 * layers,
    }, entry  # fmt: skip
    assert stock["emulated_calls"]["vllm.qkv_rmsnorm_rope"] >= layers
    assert entry["kv_cache_tensor_bytes"] == 16 << 20 and our_entry["kv_cache_tensor_bytes"] == 0
