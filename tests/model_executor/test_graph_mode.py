"""Graph mode: vLLM compiles the NPU path, and attention is the only piece outside the graphs.

- Start-up: the per-architecture config hook keeps cache-free pooling out of full graphs
  (real `EngineArgs.create_engine_config`, as `vllm serve` builds it), and the model refuses
  a final config whose graphs would capture attention.
- The attention op reads the batch's sequence boundaries when it runs, not when traced.
- Engines (tests/conftest.py `COMPILED_RUNS`): vLLM compiles the NPU path under the
  torch_npu emulator: equal to Hugging Face and to the eager NPU path, no graph break, one
  graph for every batch shape; `benchmarks/count_ops.py`'s split of the compiled forward.
- The HTTP server in its default graph mode.
"""

from __future__ import annotations

import httpx
import pytest
import torch
from support.engines import COMPILED_RUNS, ENGINE_CONFIGS, PARITY_TEXTS
from support.hf_oracle import cosines, hf_embeddings
from support.stacks import EMULATED_SERVER

from vllm_npu_ext.model_executor.layers.cache_free import op as cache_free_op
from vllm_npu_ext.model_executor.models import qwen3_config
from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs

SPLIT = cache_free_op.SPLITTING_OP
# The model's build line when vLLM compiles it on the CPU platform, which captures no graphs
# (where graphs are captured the line says how attention meets them: graph-modes.md).
COMPILED_BUILD_LOG = "; compiled by vLLM; attention: cache-free causal"
# Compiled against Hugging Face float32, per engine dtype (the bar).
MIN_COSINE_VS_HF = {"float32": 0.99999, "bfloat16": 0.9999}
# Compiled against the eager NPU path: the same operators, so near-identical.
MIN_COSINE_VS_EAGER = 0.999999


@pytest.fixture
def hooked(monkeypatch):
    """Our registry wrappers and config hook installed (as register() does); undone after."""
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    import vllm_npu_ext
    from vllm_npu_ext.patches import vllm_model_registry

    for name in ("VLLM_NPU_EXT_GENERATION", "VLLM_NPU_EXT_KV_CACHE_FREE"):
        monkeypatch.delenv(name, raising=False)
    saved = {name: MODELS_CONFIG_MAP.get(name) for name in qwen3_config.HOOKS}
    vllm_model_registry.install(vllm_npu_ext.model_registrations())
    qwen3_config.install()
    yield
    vllm_model_registry.uninstall()
    for name, entry in saved.items():
        MODELS_CONFIG_MAP.pop(name)
        if entry is not None:
            MODELS_CONFIG_MAP[name] = entry


@pytest.fixture
def hook_log(monkeypatch):
    """The hook's log lines (vLLM re-configures logging while it builds the config, which
    drops handlers added to its child loggers, so the logger itself is replaced)."""
    lines: list[str] = []

    class Recorder:
        def warning(self, message, *args):
            lines.append(message % args)

        info = warning

    monkeypatch.setattr(qwen3_config, "logger", Recorder())
    return lambda: lines


def engine_config(model_dir, runner: str, compilation: dict):
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model_dir), runner=runner, max_model_len=128, compilation_config=compilation
    )
    return args.create_engine_config()


FORCED = {"cudagraph_mode": "FULL", "splitting_ops": ["vllm::unified_attention_with_output"]}


def test_config_hook_takes_pooling_runs_out_of_full_graphs(hooked, tiny_model_dir, hook_log):
    config = engine_config(tiny_model_dir, "pooling", dict(FORCED))
    assert any("cudagraph_mode FULL would capture" in message for message in hook_log())
    assert config.compilation_config.splitting_ops == [*FORCED["splitting_ops"], SPLIT]
    # CPU has no static graphs (cudagraph_mode ends NONE); the hook's own decision:
    config.compilation_config.cudagraph_mode = type(config.compilation_config.cudagraph_mode)[
        "FULL_AND_PIECEWISE"
    ]
    qwen3_config.Qwen3GraphModeHook.verify_and_update_config(config)
    assert config.compilation_config.cudagraph_mode.name == "PIECEWISE"


def test_config_hook_leaves_generation_runs_alone(hooked, tiny_model_dir, hook_log):
    config = engine_config(tiny_model_dir, "generate", dict(FORCED))
    assert config.compilation_config.splitting_ops == FORCED["splitting_ops"]
    assert hook_log() == []
    config.compilation_config.cudagraph_mode = type(config.compilation_config.cudagraph_mode)[
        "FULL"
    ]
    qwen3_config.Qwen3GraphModeHook.verify_and_update_config(config)
    assert config.compilation_config.cudagraph_mode.name == "FULL"


def test_reranker_runs_get_the_hook_too(hooked, tmp_path):
    """`--reranker` serves Qwen3ForSequenceClassification (vLLM's adapter over our class): its
    graphs must split at our attention op as the embedding runs' do, and vLLM's own config
    entry for that architecture (the reranker's head conversion) still runs."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.models.config import Qwen3ForSequenceClassificationConfig

    from vllm_npu_ext import reranker
    from vllm_npu_ext.tiny_model import make_tiny_model

    model_dir = make_tiny_model(tmp_path / "reranker", preset="reranker")
    config = EngineArgs(
        model=str(model_dir), runner="pooling", max_model_len=128,
        hf_overrides=dict(reranker.HF_OVERRIDES), compilation_config=dict(FORCED),
    ).create_engine_config()  # fmt: skip
    assert config.model_config.architecture == qwen3_config.RERANKER_ARCHITECTURE
    assert config.compilation_config.splitting_ops == [*FORCED["splitting_ops"], SPLIT]
    assert qwen3_config.Qwen3RerankerGraphModeHook.previous is Qwen3ForSequenceClassificationConfig
    assert config.model_config.hf_config.num_labels == 1  # vLLM's conversion: one logit


def test_default_splitting_ops_include_the_attention_op(hooked, tiny_model_dir):
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode

    engine_config(tiny_model_dir, "pooling", {})
    config = CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
    config.set_splitting_ops_for_v1(all2all_backend="naive")  # vllm-ascend's PIECEWISE fill
    assert SPLIT in config.splitting_ops
    assert "vllm::unified_attention_with_output" in config.splitting_ops


@pytest.mark.parametrize(
    ("mode", "splitting_ops", "problem"),
    [
        ("FULL", None, "captures whole forward passes"),
        ("FULL_DECODE_ONLY", None, "captures whole forward passes"),
        ("PIECEWISE", ["vllm::unified_attention_with_output"], "add it to splitting_ops"),
        ("PIECEWISE", ["vllm::unified_attention_with_output", SPLIT], None),
        ("PIECEWISE", [], None),  # vLLM runs no piecewise graphs without splitting ops
        ("NONE", ["vllm::unified_attention_with_output"], None),
    ],
)
def test_start_up_check_refuses_graphs_that_capture_attention(mode, splitting_ops, problem):
    from types import SimpleNamespace

    from vllm.config.compilation import CUDAGraphMode

    compilation = SimpleNamespace(cudagraph_mode=CUDAGraphMode[mode], splitting_ops=splitting_ops)
    config = SimpleNamespace(compilation_config=compilation, additional_config={})
    if problem is None:
        qwen3_config.check_graph_mode(config, compiled=True)
    else:
        with pytest.raises(ValueError, match=problem):
            qwen3_config.check_graph_mode(config, compiled=True)


def test_start_up_check_refuses_vllm_ascend_profiling_chunks():
    from types import SimpleNamespace

    from vllm.config.compilation import CUDAGraphMode

    compilation = SimpleNamespace(cudagraph_mode=CUDAGraphMode.PIECEWISE, splitting_ops=None)
    additional = {"profiling_chunk_config": {"enabled": True}}
    config = SimpleNamespace(compilation_config=compilation, additional_config=additional)
    with pytest.raises(ValueError, match="profiling_chunk_config needs a KV cache"):
        qwen3_config.check_graph_mode(config, compiled=True)


def test_attention_op_reads_sequence_boundaries_at_run_time(monkeypatch):
    """Compiled once, the op still follows each batch's boundaries (none are baked in)."""
    from vllm_npu_ext import emulator
    from vllm_npu_ext.model_executor import forward_context

    torch.manual_seed(0)
    q, k, v = torch.randn(9, 4, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    batches = [PackedSeqs.from_seq_lens([4, 5]), PackedSeqs.from_seq_lens([2, 3, 4])]
    current = []
    monkeypatch.setattr(forward_context, "packed_seqs_for_layer", lambda name, tokens: current[-1])

    def layer(q, k, v):
        return cache_free_op.cache_free_attention(
            q * 1.0, k, v, "model.layers.0.self_attn.attn", 0.25, True, "fusion_attention"
        ) + 1.0

    with emulator.emulated(), torch.no_grad():
        compiled = torch.compile(layer, fullgraph=True, backend="inductor")
        outputs = []
        for seqs in batches:
            current.append(seqs)
            outputs.append(compiled(q, k, v))
            expected = attention.varlen_attention_native(q, k, v, seqs, 0.25) + 1.0
            torch.testing.assert_close(outputs[-1], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(outputs[0], outputs[1])


def test_attention_op_schema_and_fake_kernel(monkeypatch):
    """It writes only `output` (declared), and its fake kernel agrees with the real one.

    The op reads the batch's boundaries from vLLM's forward context when it runs; opcheck runs
    it outside one, so the boundaries are given here (two sequences of 2 and 3 tokens)."""
    from vllm_npu_ext.model_executor import forward_context

    monkeypatch.setattr(
        forward_context, "packed_seqs_for_layer",
        lambda name, tokens: PackedSeqs.from_seq_lens([2, 3]),
    )
    torch.manual_seed(0)
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    args = (q, k, torch.randn(5, 2, 16), torch.empty_like(q), "layer", 0.25, False,
            "fused_infer_attention_score")  # fmt: skip
    torch.library.opcheck(
        torch.ops.vllm_npu_ext.cache_free_attention.default, args,
        test_utils=("test_schema", "test_faketensor"),
    )  # fmt: skip


def test_compiled_forward_splits_only_at_attention(engine_runs):
    """count_ops.py on the engine's model: no graph break; attention alone between graphs."""
    name = "gqa2_tied_fp32"
    counts = engine_runs[name]["compiled_counts"]
    assert counts["graph_breaks"] == 0, counts
    assert counts["ops_outside_graphs_per_layer"] == 1, counts
    assert counts["outside_ops"] == {"vllm_npu_ext.cache_free_attention": counts["graphs"] - 1}
    # what the op issues: the fused attention and the copy into the graph's output buffer
    assert counts["outside_device_ops"] == {
        "torch_npu.npu_fusion_attention": counts["graphs"] - 1,
        "aten.copy_.default": counts["graphs"] - 1,
    }, counts
    assert counts["ops_per_layer"] == engine_runs[name]["op_counts"]["all_on"], counts


@pytest.fixture(scope="module")
def oracle(engine_runs):
    runs = COMPILED_RUNS
    return {name: hf_embeddings(engine_runs.model_dir(name), PARITY_TEXTS) for name in runs}


@pytest.mark.parametrize("name", list(COMPILED_RUNS))
def test_compiled_npu_path_matches_hf_and_eager(engine_runs, oracle, name):
    run, dtype = engine_runs.compiled(name), ENGINE_CONFIGS[name]["dtype"]
    assert COMPILED_BUILD_LOG in run["log"] and "NPU path (torch_npu emulator" in run["log"]
    for embeddings in (run["batch"], run["single"]):
        worst = cosines(embeddings, oracle[name]).min().item()
        assert worst >= MIN_COSINE_VS_HF[dtype], f"{name}: worst cosine vs HF {worst:.7f}"
    worst = cosines(run["batch"], engine_runs[name]["batch"]).min().item()
    assert worst >= MIN_COSINE_VS_EAGER, f"{name}: worst cosine vs eager {worst:.8f}"


@pytest.mark.parametrize("name", list(COMPILED_RUNS))
def test_compiled_engine_has_no_graph_break_and_one_graph_for_all_shapes(engine_runs, name):
    """Six batch shapes (the batch, each text alone) reuse the graph traced at start-up."""
    run = engine_runs.compiled(name)
    assert run["compile"]["graph_breaks"] == 0, run["compile"]
    assert run["compile"]["unique_graphs"] == 1, run["compile"]
    assert run["compile"]["calls_captured"] > 0, run["compile"]


@pytest.mark.parametrize("name", list(COMPILED_RUNS))
def test_compiled_graph_calls_each_emulated_kernel_once_per_layer(engine_runs, name):
    run = engine_runs.compiled(name)
    attention_op = "npu_fusion_attention" if "fp32" in name else "npu_fused_infer_attention_score"
    layers = ENGINE_CONFIGS[name]["overrides"].get("num_hidden_layers", 2)
    forwards = 1 + len(PARITY_TEXTS)  # the batch, then each text alone
    assert run["kernel_calls"].get(attention_op) == layers * forwards, run["kernel_calls"]
    assert run["kernel_calls"].get("npu_swiglu") == layers * forwards, run["kernel_calls"]


def test_forced_full_graph_mode_starts_with_piecewise_fallback(engine_runs):
    run = engine_runs.compiled("gqa4_bf16")
    assert COMPILED_RUNS["gqa4_bf16"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert "cudagraph_mode FULL_AND_PIECEWISE would capture cache-free attention" in run["log"]


@EMULATED_SERVER
def test_http_server_serves_the_compiled_npu_path(emulated_embedding_server, tiny_model_dir):
    server = emulated_embedding_server
    model = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    oracle = hf_embeddings(tiny_model_dir, PARITY_TEXTS)
    for texts in (PARITY_TEXTS, PARITY_TEXTS[:1], PARITY_TEXTS[2:4]):
        body = {"model": model, "input": texts, "encoding_format": "float"}
        response = httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=120)
        assert response.status_code == 200, response.text
        data = sorted(response.json()["data"], key=lambda d: d["index"])
        got = torch.tensor([d["embedding"] for d in data])
        expected = oracle[[PARITY_TEXTS.index(t) for t in texts]]
        assert cosines(got, expected).min().item() >= MIN_COSINE_VS_HF["float32"]
    log = server.log_text()
    assert "NPU path (torch_npu emulator on the CPU)" in log and COMPILED_BUILD_LOG in log


def test_selfcheck_reports_the_compiled_engine():
    """selfcheck's full plan (on Ascend) also runs a compiled engine; its verdicts."""
    from vllm_npu_ext.selfcheck import plan
    from vllm_npu_ext.selfcheck.model_check import compiled_results

    assert plan.FULL.compiled_engine and not plan.QUICK.compiled_engine
    embeddings = torch.nn.functional.normalize(torch.randn(3, 8), dim=-1)
    counters = {"graph_breaks": 0, "break_reasons": [], "unique_graphs": 1}
    graph = {"mode": "piecewise", "captured_sizes": [], "batch_updates": 0, "updates": 0,
             "widest_update": []}  # fmt: skip
    run = {"batch": embeddings, "single": embeddings, "compile": counters, "graph": graph}
    results = compiled_results({"model": "tiny"}, run, embeddings, embeddings, 0.99999)
    assert [r.status for r in results] == ["PASS", "INFO", "PASS", "PASS", "PASS"]
    broken = {**counters, "graph_breaks": 2, "break_reasons": ["data-dependent branch"]}
    run = {**run, "batch": -embeddings, "compile": broken}
    results = compiled_results({"model": "tiny"}, run, embeddings, embeddings, 0.99999)
    assert [r.status for r in results] == ["FAIL", "INFO", "FAIL", "FAIL", "FAIL"]
    assert "graph break: data-dependent branch" in results[0].details


@pytest.mark.parametrize(("value", "compiles"), [(None, True), ("1", True), ("0", False)])
def test_compile_switch(monkeypatch, value, compiles):
    """VLLM_NPU_EXT_COMPILE=0 keeps vLLM from compiling our model (enable_if of the decorator)."""
    from vllm_npu_ext.model_executor.models import qwen3

    if value is None:
        monkeypatch.delenv("VLLM_NPU_EXT_COMPILE", raising=False)
    else:
        monkeypatch.setenv("VLLM_NPU_EXT_COMPILE", value)
    assert qwen3._compiles(None) is compiles
