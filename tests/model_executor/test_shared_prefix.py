"""Shared prefixes computed once per step, inside real vLLM engines (issue 44's cases).

Engines in subprocesses (tests/support/shared_prefix_worker.py), sharing on (the default):
a float32 tiny model (NPU path through npu_fusion_attention under the stand-in, then the
platform path: vLLM's CPU kernel), a bfloat16 head_dim-128 one (npu_fused_infer_attention_score),
the same float32 model compiled by vLLM, and the tiny Qwen3-Reranker. One step holds
`shared_prefix_cases.case_prompts`: two groups, unequal lengths, a text equal to its prefix that
is the whole of the others' prefix, a duplicate, unrelated texts. Each embedding must equal the
text embedded alone and Hugging Face's within today's bounds (`min_embedding_cosine`), the step
must compute only its unique tokens, and each of issue 44's mutations must fail those checks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.engines import ENGINE_CONFIGS
from support.shared_prefix_cases import EXPECTED_MEMBERS, MUTATIONS

from vllm_npu_ext.model_executor import shared_prefix
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.ops.shared_prefix import find_shared_prefixes
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine
from vllm_npu_ext.tiny_model import make_tiny_model

RERANK_MAX_DIFF = 1e-6  # float32 scores: batched and alone run the same kernels
RUNS = {
    "fp32": {"dtype": "float32", "model": "gqa2_tied_fp32", "args": ["--emulate"]},
    "bf16": {"dtype": "bfloat16", "model": "gqa4_bf16", "args": ["--emulate"]},
    "compiled": {"dtype": "float32", "model": "gqa2_tied_fp32",
                 "args": ["--emulate", "--compiled"]},
    "rerank": {"dtype": "float32", "model": "reranker", "args": ["--emulate", "--rerank"]},
}  # fmt: skip
EMBEDDING_RUNS = [(run, path) for run in ("fp32", "bf16") for path in ("npu", "platform")]
EMBEDDING_RUNS.append(("compiled", "npu"))


@pytest.fixture(scope="module")
def runs(worker_pool, engine_runs, tmp_path_factory):
    root = tmp_path_factory.mktemp("shared_prefix")
    model_dirs = {"reranker": make_tiny_model(root / "reranker", preset="reranker")}
    for name, run in RUNS.items():
        model = run["model"]
        model_dir = model_dirs.get(model) or engine_runs.model_dir(model)
        model_dirs[name] = model_dir
        args = ["--model", str(model_dir), "--dtype", run["dtype"], *run["args"]]
        worker_pool.submit(f"shared_prefix/{name}", "shared_prefix_worker.py", args,
                           root / f"{name}.pt")  # fmt: skip
    worker_pool.wait([f"shared_prefix/{name}" for name in RUNS])
    return _Runs(worker_pool, model_dirs)


class _Runs:
    """The runs' results by name; a run that failed raises where a test reads it (the tests of
    the other runs still run)."""

    def __init__(self, pool, model_dirs):
        self.pool, self.model_dirs = pool, model_dirs

    def __getitem__(self, name: str) -> dict:
        return {**self.pool.result(f"shared_prefix/{name}"), "model_dir": self.model_dirs[name]}


def _hf_embeddings(model_dir, prompts) -> torch.Tensor:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        rows = [model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1] for ids in prompts]
    return F.normalize(torch.stack(rows), dim=-1)


def _min_cosine(run: str) -> float:
    return min_embedding_cosine(getattr(torch, RUNS[run]["dtype"]))


def _worst(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.float(), b.float(), dim=-1).min().item()


@pytest.mark.parametrize(("run", "path"), EMBEDDING_RUNS)
def test_the_step_groups_as_expected_and_computes_its_unique_tokens_only(runs, run, path):
    result = runs[run]
    prompts = result[path]["prompts"]
    seqs = PackedSeqs.from_seq_lens([len(ids) for ids in prompts])
    ids = np.array([token for prompt in prompts for token in prompt])
    plan = find_shared_prefixes(ids, seqs, result["min_len"])
    assert [group.members for group in plan.groups] == list(EXPECTED_MEMBERS)
    assert plan.q_lens[0] == len(prompts[0])  # the whole prefix of 3 and 5, computed once
    assert result[path]["stats"] == {"shared_steps": 1, "tokens": plan.num_tokens,
                                     "computed_tokens": plan.num_unique}  # fmt: skip


@pytest.mark.parametrize(("run", "path"), EMBEDDING_RUNS)
def test_each_embedding_equals_the_text_alone_and_hugging_face(runs, run, path):
    result = runs[run][path]
    assert _worst(result["batch"], result["alone"]) >= _min_cosine(run)
    oracle = _hf_embeddings(runs[run]["model_dir"], result["prompts"])
    assert _worst(result["batch"], oracle) >= _min_cosine(run)


@pytest.mark.parametrize("mutation", MUTATIONS)
@pytest.mark.parametrize(("run", "path"), EMBEDDING_RUNS)
def test_each_mutation_fails_the_parity_check(runs, run, path, mutation):
    """Own tokens not attending to the prefix, own positions restarting at 0, another group's
    prefix: the check of `test_each_embedding_equals_the_text_alone_and_hugging_face` fails."""
    result = runs[run][path]
    assert _worst(result["mutations"][mutation], result["alone"]) < _min_cosine(run)


@pytest.mark.parametrize("path", ["npu", "platform"])
def test_rerank_scores_of_one_step_equal_each_pair_alone(runs, path):
    result = runs["rerank"][path]
    assert result["stats"]["shared_steps"] == 1
    assert result["stats"]["computed_tokens"] < result["stats"]["tokens"] / 2
    assert max(abs(a - b) for a, b in zip(result["batch"], result["alone"], strict=True)) \
        <= RERANK_MAX_DIFF  # fmt: skip


def test_kv_cache_engines_never_share(engine_runs):
    """Engines with vLLM's KV cache never share (prefix caching is theirs); cache-free ones say
    that they do, at build."""
    assert ENGINE_CONFIGS["kv_cache_fp32"]["env"]["VLLM_NPU_EXT_KV_CACHE_FREE"] == "0"
    assert "shared prefixes of" not in engine_runs["kv_cache_fp32"]["log"]
    assert "shared prefixes of 4+ tokens computed once" in engine_runs["gqa2_tied_fp32"]["log"]


class _Parallel:
    pipeline_parallel_size = data_parallel_size = 1


class _Config:
    parallel_config = _Parallel()
    model_config = object()
    lora_config = None


@pytest.mark.parametrize(("value", "cache_free", "expected"),
                         [("1", True, True), ("0", True, False), ("1", False, False)])
def test_the_switch_and_the_kv_cache_decide_whether_a_model_shares(monkeypatch, value,
                                                                   cache_free, expected):
    monkeypatch.setenv("VLLM_NPU_EXT_SHARED_PREFIX", value)
    sharing = shared_prefix.for_model(_Config(), cache_free, "none")
    assert (sharing is not None) == expected


def test_lora_and_parallel_stages_turn_sharing_off():
    """Adapters differ per request (a prefix computed with one is not another's); pipeline
    and data-parallel ranks expect the step's token counts."""
    lora = type("LoraConfig", (_Config,), {"lora_config": object()})()
    assert shared_prefix.for_model(lora, True, "none") is None
    stages = type("Parallel", (), {"pipeline_parallel_size": 2, "data_parallel_size": 1})()
    assert shared_prefix.for_model(type("C", (_Config,), {"parallel_config": stages})(),
                                   True, "none") is None  # fmt: skip


@pytest.mark.parametrize(("mode", "graph_mode", "expected"), [
    ("NONE", "piecewise", (10, "NONE")),
    ("PIECEWISE", "piecewise", (16, "PIECEWISE")),  # the smallest capture size that holds 10
    ("PIECEWISE", "full", (10, "NONE")),  # one graph per forward: its captures hold no sharing
])  # fmt: skip
def test_the_graph_is_chosen_for_the_unique_rows(mode, graph_mode, expected):
    from vllm.config.compilation import CUDAGraphMode

    plan = find_shared_prefixes(*_ids_and_seqs([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 8, 9, 10]]),
                                4)  # fmt: skip
    assert plan.num_unique == 10
    sharing = shared_prefix.SharedPrefixes(4, graph_mode)
    rows, chosen = sharing.rows_and_mode(plan, CUDAGraphMode[mode], [1, 2, 4, 8, 16, 24])
    assert (rows, chosen.name) == expected


def test_steps_with_computed_tokens_or_one_request_are_not_planned():
    sharing = shared_prefix.SharedPrefixes(2, "none")
    ids = torch.tensor([1, 2, 3, 1, 2, 4])
    offsets = torch.tensor([0, 3, 6], dtype=torch.int32)
    assert sharing.plan(ids, offsets, [0, 0]) is not None
    assert sharing.plan(ids, offsets, [0, 3]) is None  # a chunk after computed tokens
    assert sharing.plan(ids, offsets[:2], [0]) is None
    assert sharing.stats.shared_steps == 1


def _ids_and_seqs(texts):
    ids = np.array([token for text in texts for token in text])
    return ids, PackedSeqs.from_seq_lens([len(text) for text in texts])


@pytest.mark.parametrize("graph_mode", ["none", "piecewise"])
def test_every_step_row_gets_the_hidden_state_of_the_unique_row_that_holds_it(graph_mode):
    """What the pooler reads, for every pooling type (last token, mean, every row): the model
    runs the unique rows (ids and positions gathered: own tokens keep their positions) and
    each step row, padding included, comes back from its unique row."""
    from vllm.config.compilation import CUDAGraphMode

    texts = [[5, 6, 7, 8, 1], [9, 9], [5, 6, 7, 8], [5, 6, 7, 8, 2, 3]]
    ids, seqs = _ids_and_seqs(texts)
    plan = find_shared_prefixes(ids, seqs, 4)
    padded = seqs.num_tokens + 3
    input_ids = torch.tensor([*ids, 0, 0, 0])
    positions = torch.tensor([*(p for t in texts for p in range(len(t))), 0, 0, 0])
    seen = {}

    def run_model(rows_ids, rows_positions):  # a row-wise "model": its id and its position
        seen["rows"] = rows_ids.shape[0]
        return torch.stack([rows_ids, rows_positions], dim=1).float()

    real = seqs.num_tokens
    expected = torch.stack([input_ids[:real], positions[:real]], dim=1).float()
    sharing = shared_prefix.SharedPrefixes(4, graph_mode)
    mode = CUDAGraphMode.PIECEWISE if graph_mode == "piecewise" else CUDAGraphMode.NONE
    with _forward_context(mode):  # piecewise: the rows go into the runner's buffers
        out = sharing.forward(run_model, plan, input_ids, positions, [1, 2, 4, 8, 16])
    assert seen["rows"] == (plan.num_unique if graph_mode == "none" else 16)
    assert out.shape == (padded, 2)
    assert torch.equal(out[:real], expected)


def _forward_context(mode):
    """A minimal vLLM forward context running under graph `mode`."""
    from vllm.config import VllmConfig
    from vllm.forward_context import BatchDescriptor, set_forward_context

    return set_forward_context({}, VllmConfig(), num_tokens=16, cudagraph_runtime_mode=mode,
                               batch_descriptor=BatchDescriptor(num_tokens=16))
