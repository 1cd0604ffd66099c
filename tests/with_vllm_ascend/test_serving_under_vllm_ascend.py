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
  does; count_ops.py's `--vllm-ascend` runs it too), eight runs started together:
  `plugin` (tiny float32, eager: worker, runner, device, no KV cache, operators of a decoder
  layer); `stock` and `plugin_bf16` (stock vllm-ascend, our model plugin left out of
  VLLM_PLUGINS, and ours on one bf16 head_dim-128 checkpoint, eager: parity, KV cache, launches
  per layer); `stock_graph`, `piecewise_bf16` (`VLLM_NPU_EXT_FULL_GRAPH=0`) and `full_bf16` (our
  default: one graph per forward, FIA's lengths updated per replay) in default graph mode:
  vllm-ascend's compiler and fusion passes, its ACLGraphWrapper capturing every capture size
  on the stand-in's `NPUGraph` and replaying them, parity on other batch boundaries, launches
  in the graphs and between replays; `reranker_full_bf16` (a bf16 Qwen3-Reranker scored in one
  graph per forward); `graph` (the float32 tiny model, piecewise).
"""

from __future__ import annotations

import itertools
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
from support.server import DIE_WITH_PARENT, TEST_SERVER_FLAGS, Server
from support.vllm_ascend_env import (
    TEST_CAPTURE_SIZES,
    TEST_COMPILATION,
    TESTS,
    server_env,
    subprocess_env,
    vllm_port,
)

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
            ports = (vllm_port("serving", index) for index in itertools.count())
            self.servers["tp2"] = Server(tp2, root / "tp2.log", server_env(VLLM_PORT=next(ports)))
            # The reranker serves in default graph mode (ACL graphs on the stand-in's NPUGraph),
            # capturing the tests' sizes (TEST_CAPTURE_SIZES), as do the graph-mode engines.
            reranker = [str(self.reranker_dir), "--reranker", "--dtype", "float32",
                        "--max-model-len", "512",
                        "--compilation-config", json.dumps(TEST_COMPILATION)]  # fmt: skip
            self.servers["reranker"] = Server(reranker, root / "reranker.log",
                                              server_env(VLLM_PORT=next(ports)))
            # Stock vllm-ascend and our model side by side on one bf16 checkpoint of the
            # shapes stock's attention takes (STOCK_CHECKPOINT in the engine script).
            engine = engine_module()
            self.stock_dir = make_tiny_model(root / "stock-model", **engine.STOCK_CHECKPOINT)
            bf16 = ("--engine-args", json.dumps(engine.STOCK_ENGINE_ARGS))
            bf16_graphs = ("--engine-args", json.dumps(
                {**engine.STOCK_ENGINE_ARGS, "enforce_eager": False,
                 "compilation_config": TEST_COMPILATION}))  # fmt: skip
            split = {"VLLM_NPU_EXT_FULL_GRAPH": "0"}
            # A Qwen3-Reranker of the shapes FIA takes, scored in default graph mode.
            self.reranker_bf16_dir = make_tiny_model(
                root / "reranker-bf16", preset="reranker", **engine.STOCK_CHECKPOINT)
            rerank = ("--rerank", QUERY, "--texts", json.dumps(DOCUMENTS), *bf16_graphs)
            runs = (("plugin", tiny_model_dir, (), {}),
                    ("reranker_full_bf16", self.reranker_bf16_dir, rerank, {}),
                    ("stock", self.stock_dir, ("--stock", *bf16), {}),
                    ("plugin_bf16", self.stock_dir, bf16, {}),
                    ("full_bf16", self.stock_dir, (*bf16_graphs, "--stale-update"), {}),
                    ("piecewise_bf16", self.stock_dir, bf16_graphs, split),
                    ("stock_graph", self.stock_dir, ("--stock", *bf16_graphs), {}),
                    ("graph", tiny_model_dir,
                     ("--engine-args", json.dumps({"enforce_eager": False,
                                                   "compilation_config": TEST_COMPILATION})),
                     {}))  # fmt: skip
            for name, model_dir, flags, env in runs:
                out, log = root / f"{name}.json", root / f"{name}.log"
                env = {**env, "VLLM_PORT": next(ports)}
                self.engines[name] = (out, log, start_engine(model_dir, out, log, *flags, **env))
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


def start_engine(model_dir, out, log, *flags, **env):
    """The engine script on `model_dir`, embedding PARITY_TEXTS unless `flags` give texts."""
    texts = () if "--texts" in flags else ("--texts", json.dumps(PARITY_TEXTS))
    with open(log, "wb") as output:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, str(ENGINE_SCRIPT), "--model", str(model_dir), "--out", str(out),
             *texts, *flags],
            env=subprocess_env(**env), stdout=output, stderr=subprocess.STDOUT,
            preexec_fn=DIE_WITH_PARENT,
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
    assert f"'cudagraph_capture_sizes': {TEST_CAPTURE_SIZES}" in log


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


def test_a_float32_decoder_layer_launches_twelve_kernels_eagerly(plugin_engine):
    """float32 (outside FIA's and vllm.qkv_rmsnorm_rope's domain): q/k norms and one npu_mrope
    for q and k, npu_fusion_attention inside our attention op with its result copied."""
    entry = engine_module().entry(0, plugin_engine, "")
    assert entry["launches_between_replays_per_layer"] == {
        "aten.copy_.default": 1, "torch_npu.npu_add_rms_norm": 1,
        "torch_npu.npu_fusion_attention": 1, "torch_npu.npu_linear": 4,
        "torch_npu.npu_mrope": 1, "torch_npu.npu_rms_norm": 3, "torch_npu.npu_swiglu": 1,
    }, entry  # fmt: skip
    assert entry["inside"] == {"vllm_npu_ext.cache_free_attention": {
        "aten.copy_.default": 1, "torch_npu.npu_fusion_attention": 1}}, entry
    assert entry["launches_per_layer"] == 12 and entry["kv_cache_tensor_bytes"] == 0


@pytest.fixture(scope="module")
def stock_engine(started):
    returncode, output, out = started.engine("stock")
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


@pytest.fixture(scope="module")
def plugin_bf16_engine(started):
    returncode, output, out = started.engine("plugin_bf16")
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


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
    assert r["forward"]["launches"]["triton_kernel._compute_slot_mapping_kernel"] == 1
    assert calls["_C_ascend.npu_add_rms_norm_bias"] >= 2 and "npu_add_rms_norm" not in calls
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    for key in ("embeddings", "embeddings_one_by_one"):
        worst = cosines(torch.tensor(r[key]), want).min().item()
        print(f"stock vllm-ascend {key} vs Hugging Face (bf16): worst cosine {worst:.6f}")
        assert worst >= min_embedding_cosine(torch.bfloat16)


# A decoder layer of each side in eager mode on one bf16 head_dim-128 checkpoint, every launch
# counted (those inside the attention ops too; op_counter.py).
STOCK_EAGER_LAYER = {
    "_C_ascend.npu_add_rms_norm_bias": 1, "atb._npu_reshape_and_cache": 1,
    "aten.copy_.default": 1, "torch_npu.npu_fused_infer_attention_score": 1,
    "torch_npu.npu_rms_norm": 3, "torch_npu.npu_swiglu": 1, "vllm.npu_rotary_embedding": 1,
    "vllm.unquantized_gemm": 4,
}  # fmt: skip
OUR_EAGER_LAYER = {
    "torch_npu.npu_add_rms_norm": 1, "torch_npu.npu_fused_infer_attention_score": 1,
    "torch_npu.npu_linear": 4, "torch_npu.npu_rms_norm": 1, "torch_npu.npu_swiglu": 1,
    "vllm.qkv_rmsnorm_rope": 1,
}  # fmt: skip


def test_side_by_side_with_stock_on_one_checkpoint(stock_engine, plugin_bf16_engine, started):
    """Eager, the same bf16 checkpoint, stand-in and counter: parity with Hugging Face, the KV
    cache vllm-ascend's runner allocated, and a decoder layer's launches. Ours: one merged q/k/v
    matmul and vllm-ascend's own `vllm.qkv_rmsnorm_rope` (split, q/k norms and RoPE; the
    first layer's input norm has no residual), FIA writing straight into the layer's output
    (`.out`). Stock: the q/k norms and its rotary op apart, and its attention op's
    ReshapeAndCache, FIA and the copy of its result into the layer's output
    (vllm-ascend 0.23.0.post1 `AscendAttentionBackendImpl.forward_fused_infer_attention`; its
    second copy, in `AscendAttentionBackendImpl.forward`, copies those rows onto themselves, which
    PyTorch's copy_ skips and op_counter.py does not count)."""
    stock, ours = stock_engine, plugin_bf16_engine
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    worst = {name: cosines(torch.tensor(r["embeddings"]), want).min().item()
             for name, r in (("stock", stock), ("ours", ours))}  # fmt: skip
    print(f"bf16 checkpoint, worst cosine to Hugging Face: {worst}")
    assert min(worst.values()) >= min_embedding_cosine(torch.bfloat16)
    assert ours["model_base"].startswith("vllm_npu_ext.model_executor.models.qwen3.")
    assert "q/k norms and rotary: vllm.qkv_rmsnorm_rope (one launch)" in ours["log"]
    assert stock["kv_cache_tensor_bytes"] == 16 << 20 and ours["kv_cache_tensor_bytes"] == 0
    module = engine_module()
    stock_entry, our_entry = module.entry(0, stock, ""), module.entry(0, ours, "")
    assert stock_entry["launches_between_replays_per_layer"] == STOCK_EAGER_LAYER, stock_entry
    assert our_entry["launches_between_replays_per_layer"] == OUR_EAGER_LAYER, our_entry
    assert stock_entry["inside"]["vllm.maybe_chunk_residual"] == {}  # TP=1: returns its input
    assert (our_entry["launches_per_layer"], stock_entry["launches_per_layer"]) == (9, 13)


def graph_run(started, name):
    returncode, output, out = started.engine(name)
    assert returncode == 0, output[-6000:]
    return {**json.loads(out.read_text()), "log": output}


@pytest.fixture(scope="module")
def graph_engine(started):
    return graph_run(started, "graph")


def test_default_graph_mode_captures_and_replays_vllm_ascends_acl_graphs(graph_engine):
    """float32, default graph mode: PIECEWISE (vLLM's choice for pooling), vllm-ascend's own
    compiler with its fusion passes (npugraph_ex off: vllm-ascend turns it off for piecewise
    graphs, `NPUPlatform.check_and_update_config`), its ACLGraphWrapper capturing every capture
    size on the
    stand-in's NPUGraph and replaying one graph per piece. FIA does not take float32, so our
    attention op splits the graphs, and the log says why."""
    r, log = graph_engine, graph_engine["log"]
    assert r["runner"] == "vllm_ascend.worker.model_runner_v1.NPUModelRunner"
    assert r["cudagraph_mode"] == "PIECEWISE" and r["device"] == "npu:0"
    assert "'enable_npugraph_ex': False" in log and "Replaying aclgraph" in log
    assert ("piecewise graphs, cache-free attention between them: torch.float32 with head_dim "
            "32 is outside FIA's TND domain") in log  # fmt: skip
    entry = engine_module().graph_entry(r)
    pieces = r["layers"] + 1
    assert entry["mode"] == "piecewise" and entry["graph_replays_per_forward"] == pieces
    sizes = entry["capture_sizes"]
    assert r["capture_sizes"] == TEST_CAPTURE_SIZES  # the tests' list, not the default one
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


def test_float32_piecewise_graphs_leave_only_attention_between_replays(graph_engine):
    """count_ops.py's piecewise entry: per decoder layer, our attention op runs between
    replays (npu_fusion_attention and its result copy); the layer's other 11 launches are in
    the graphs (float32 q/k/v from one merged matmul, v copied out of it)."""
    entry = engine_module().graph_entry(graph_engine)
    assert entry["launches_between_replays_per_layer"] == {
        "aten.copy_.default": 1, "torch_npu.npu_fusion_attention": 1}, entry
    assert entry["launches_in_graphs_per_layer"] == {
        "aten.clone.default": 1, "torch_npu.npu_add_rms_norm": 2, "torch_npu.npu_linear": 4,
        "torch_npu.npu_mrope": 1, "torch_npu.npu_rms_norm": 2, "torch_npu.npu_swiglu": 1,
    }, entry  # fmt: skip


@pytest.fixture(scope="module")
def full_bf16_engine(started):
    return graph_run(started, "full_bf16")


@pytest.fixture(scope="module")
def piecewise_bf16_engine(started):
    return graph_run(started, "piecewise_bf16")


@pytest.fixture(scope="module")
def stock_graph_engine(started):
    return graph_run(started, "stock_graph")


def _assert_bf16_parity(run, started) -> None:
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    for key in ("embeddings", "embeddings_one_by_one"):
        worst = cosines(torch.tensor(run[key]), want).min().item()
        print(f"{run['graph_mode']} {key} vs Hugging Face (bf16): worst cosine {worst:.6f}")
        assert worst >= min_embedding_cosine(torch.bfloat16), (key, worst)


def test_bf16_default_graph_mode_replays_one_graph_per_forward(full_bf16_engine, started):
    """bf16 with head_dim 128 in default graph mode, no flag: vllm-ascend's ACLGraphWrapper
    captures the whole forward as one graph per capture size, attention inside (FIA `.out`
    with a max workspace in a task group behind an ExternalEvent), and after each replay the
    model gives every layer's FIA the step's sequence lengths. No device launch of the model
    between replays; parity with Hugging Face on other boundaries and padded sizes than the
    captures' (batched, then one text per step). Replays that were not updated would block
    the stand-in's stream (tests/emulator/npu_device/test_full_graph_attention.py shows it)."""
    r, log = full_bf16_engine, full_bf16_engine["log"]
    assert "one graph per forward for cache-free pooling" in log
    assert "one graph per forward with attention inside" in log and "Replaying aclgraph" in log
    assert "Enabled custom fusions: norm_quant" in log  # vllm-ascend's passes still run
    entry = engine_module().graph_entry(r)
    assert entry["mode"] == "full" and entry["graph_replays_per_forward"] == 1
    assert r["graphs"]["captures"] == entry["capture_sizes"] >= 8
    assert entry["launches_between_replays_per_layer"] == {}, entry
    assert entry["launches_in_graphs_per_layer"] == {
        "torch_npu.npu_add_rms_norm": 2, "torch_npu.npu_fused_infer_attention_score": 1,
        "torch_npu.npu_linear": 4, "torch_npu.npu_swiglu": 1, "vllm.qkv_rmsnorm_rope": 1,
    }, entry  # fmt: skip
    assert "Graph capturing finished" in entry["graph_capture"]
    _assert_bf16_parity(r, started)


def test_piecewise_and_stock_graph_modes_on_the_bf16_checkpoint(
    piecewise_bf16_engine, stock_graph_engine, started
):
    """The same checkpoint in piecewise graphs, ours (VLLM_NPU_EXT_FULL_GRAPH=0) and stock's
    (its default; vLLM 0.23 serves pooling in no other graph mode). Stock needs vllm-ascend's
    operator library (its `AscendRMSNorm` makes the first `enable_custom_op()` call inside the
    traced forward: the stand-in's `vllm_ascend_C`) and its Triton QK-norm + RoPE operator,
    which its fusion pass puts in the graphs for bf16 head_dim-128 models (the stand-in's,
    `emulator/operators/vllm_ascend_triton.py`); its `maybe_chunk_residual` ops launch nothing
    at TP=1, so the graphs hold nothing of them. Between replays, ours runs FIA into the
    graph's buffer; stock its ReshapeAndCache, FIA and result copy, and the slot-mapping kernel
    once per forward."""
    ours, stock = piecewise_bf16_engine, stock_graph_engine
    assert "piecewise graphs, cache-free attention between them: VLLM_NPU_EXT_FULL_GRAPH=0" \
        in ours["log"]  # fmt: skip
    assert stock["model_base"] == "vllm.model_executor.models.qwen3.Qwen3ForCausalLM"
    module = engine_module()
    our_entry, stock_entry = module.graph_entry(ours), module.graph_entry(stock)
    for entry in (our_entry, stock_entry):
        assert entry["mode"] == "piecewise"
        assert entry["graph_replays_per_forward"] == ours["layers"] + 1
    in_graphs = {"torch_npu.npu_add_rms_norm": 2, "torch_npu.npu_linear": 4,
                 "torch_npu.npu_swiglu": 1, "vllm.qkv_rmsnorm_rope": 1}  # fmt: skip
    assert our_entry["launches_in_graphs_per_layer"] == in_graphs, our_entry
    assert our_entry["launches_between_replays_per_layer"] == {
        "torch_npu.npu_fused_infer_attention_score": 1}, our_entry
    assert stock_entry["launches_in_graphs_per_layer"] == {
        "_C_ascend.npu_add_rms_norm_bias": 2, "torch_npu.npu_swiglu": 1,
        "vllm.qkv_rmsnorm_rope": 1, "aten.mm.default": 4,  # vllm.unquantized_gemm's matmul
    }, stock_entry  # fmt: skip
    assert stock_entry["launches_between_replays_per_layer"] == {
        "atb._npu_reshape_and_cache": 1, "aten.copy_.default": 1,
        "torch_npu.npu_fused_infer_attention_score": 1,
    }, stock_entry  # fmt: skip
    assert stock_entry["launches_per_forward_besides"][
        "triton_kernel._compute_slot_mapping_kernel"] == 1
    # vLLM's Python ops are entered at capture: the graphs hold what they launch (the
    # matmul of unquantized_gemm; nothing of maybe_chunk_residual at TP=1), never the op.
    assert stock_entry["host_code_ops_in_graphs_per_capture"] == {}, stock_entry
    _assert_bf16_parity(ours, started)
    _assert_bf16_parity(stock, started)


def test_ours_launches_fewer_kernels_per_layer_than_stock_in_every_mode(
    plugin_bf16_engine, stock_engine, piecewise_bf16_engine, stock_graph_engine, full_bf16_engine
):
    """Per decoder layer, in graphs and between replays together (eager 9 vs 13, piecewise
    9 vs 11, ours in one graph per forward 9), and per forward outside the replays, the
    runner's launches included: ours fewer than stock's in the mode stock serves, as
    `count_ops.py --vllm-ascend` computes it (`against_stock`)."""
    module = engine_module()
    entries = {name: module.entry(0, run, "") for name, run in (
        ("ours eager", plugin_bf16_engine), ("stock eager", stock_engine),
        ("ours piecewise", piecewise_bf16_engine), ("stock piecewise", stock_graph_engine),
        ("ours full graph", full_bf16_engine))}  # fmt: skip
    compared = module.against_stock(entries)
    print(f"ours against stock: {compared}")
    assert set(compared) == {"ours eager", "ours piecewise", "ours full graph"}
    assert all(c is not None and c["fewer"] for c in compared.values()), compared
    launches = {name: e["launches_per_layer"] for name, e in entries.items()}
    assert launches["ours full graph"] <= launches["ours piecewise"]
    # a comparison that can fail: stock's eager layer against ours in one graph per forward
    assert not module.against_stock({"ours eager": entries["stock eager"],
                                     "stock eager": entries["ours full graph"]})["ours eager"][
        "fewer"]  # fmt: skip


# A bf16 score against the float32 model card: one bf16 rounding step at 1.0 (2**-8); scores
# are probabilities, and the model's last hidden state is rounded to bf16 before the head.
BF16_RERANK_MAX_DIFF = 2.0**-8


def test_the_bf16_reranker_replays_one_graph_per_forward_at_parity(started):
    """Qwen3-Reranker (vLLM's sequence-classification adapter over our model: its forward is
    ours, so the per-replay update runs too) in default graph mode, bf16 head_dim 128: one
    graph per forward, scores equal the model card's computation within a bf16 step, the
    documents scored together and one per step."""
    r = graph_run(started, "reranker_full_bf16")
    assert "built Qwen3ForSequenceClassification" in r["log"]
    entry = engine_module().graph_entry(r)
    assert entry["mode"] == "full" and entry["graph_replays_per_forward"] == 1, entry
    assert entry["launches_between_replays_per_layer"] == {}, entry
    want = hf_rerank_scores(started.reranker_bf16_dir, QUERY, DOCUMENTS)
    for key in ("embeddings", "embeddings_one_by_one"):  # the scores, in --rerank runs
        worst = max(abs(a - b) for a, b in zip(r[key], want, strict=True))
        print(f"bf16 reranker, one graph per forward, {key}: max |score - model card| {worst:.2e}")
        assert worst <= BF16_RERANK_MAX_DIFF, (key, worst)


def bf16_max_abs_bound(layers: int, roundings_per_layer: int) -> float:
    """The largest per-component error a bf16 embedding may have against the float32 oracle,
    to first order.

    Each bf16 rounding of a hidden state moves it by at most u = 2**-9 relative (bf16 keeps 8
    significant bits); the path from the embedding lookup (exact: bf16 weights) to the pooled
    vector rounds once per launch of each decoder layer (`roundings_per_layer`: each launch
    writes a bf16 result) and once in the final norm. Assuming the layers pass a relative
    error on with gain at most 1 (first order; float32 accumulation inside each operator adds
    terms of order 2**-24), the pooled state h is off by at most n * u relative in L2 norm, and
    its L2-normalised embedding e = h / |h| by |de| <= 2 |dh| / |h| <= 2 n u, which bounds
    every component.
    """
    roundings = roundings_per_layer * layers + 1
    return 2 * roundings * 2.0**-9


def per_text_max_abs(got, want) -> list[float]:
    return (torch.tensor(got).float() - want.float()).abs().amax(dim=-1).tolist()


def test_one_graph_per_forward_batches_of_unequal_texts_match_hugging_face_per_text(
    full_bf16_engine, started
):
    """The real path: vllm-ascend's runner in default graph mode, our model's forward looking
    up each step's boundaries in the forward context after the compiled model returns
    (forward_context.packed_seqs_for_layer) and updating every layer's captured FIA. A batch of five
    texts of unequal lengths in one replay, each within the derived bound of Hugging Face;
    the same engine with the update giving each FIA the boundaries of its capture (one
    sequence: `--stale-update`) fails that bound for every text but the first, whose
    boundaries a stale update keeps."""
    r = full_bf16_engine
    figures = r["full_graph"]
    widest = figures["widest_update"]  # padded: the last sequence may be the padding
    assert len(widest) >= len(PARITY_TEXTS) and len(set(widest[: len(PARITY_TEXTS)])) >= 3, widest
    assert figures["updates"] >= 1 + len(PARITY_TEXTS)  # the batch, then one text per step
    entry = engine_module().graph_entry(r)
    bound = bf16_max_abs_bound(r["layers"], entry["launches_per_layer"])
    want = hf_embeddings(started.stock_dir, PARITY_TEXTS)
    errors = {key: per_text_max_abs(r[key], want)
              for key in ("embeddings", "embeddings_one_by_one", "embeddings_stale_update")}
    print(f"one graph per forward, per-text max |e - HF| (bound {bound:.4f}): {errors}")
    assert max(errors["embeddings"]) <= bound and max(errors["embeddings_one_by_one"]) <= bound
    stale = errors["embeddings_stale_update"]
    assert stale[0] <= bound and min(stale[1:]) > bound, stale


def test_launches_outside_the_replay_per_forward_are_fewer_than_stocks(
    full_bf16_engine, stock_graph_engine
):
    """Every launch the host issues during one embed call besides the graph replays: the
    runner's input preparation and pooling included. vllm-ascend's runner refreshes its
    cos/sin tables every step (`update_cos_sin`); our pooling model does not read them, and
    stops it (patches/vllm_ascend_cos_sin.py), where stock spends six launches on it. In
    one graph per forward the update re-issues each layer's FIA as a task update, not a
    launch: one task update per layer and replay, and two event tasks per layer in each
    graph (the ExternalEvent wait and reset), which NPUGraph.operators leaves out."""
    ours, stock = full_bf16_engine, stock_graph_engine
    assert "per-step cos/sin update stopped" in ours["log"]
    assert ours["forward"]["runner_update_cos_sin"] == {}, ours["forward"]
    assert sum(stock["forward"]["runner_update_cos_sin"].values()) == 6, stock["forward"]
    totals = {name: sum(r["forward"]["launches"].values())
              for name, r in (("ours", ours), ("stock", stock))}  # fmt: skip
    print(f"launches per forward outside the replays: {totals}; ours "
          f"{ours['forward']['launches']}; stock {stock['forward']['launches']}")
    assert totals["ours"] < totals["stock"]
    figures, layers = ours["full_graph"], ours["layers"]
    assert figures["update_calls"] == figures["updates"] * layers
    assert ours["graphs"]["event_nodes"] == 2 * layers * ours["graphs"]["captures"]
