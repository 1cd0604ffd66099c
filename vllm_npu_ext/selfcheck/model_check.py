"""Selfcheck part 2: the whole model's NPU path in a vLLM engine against Hugging Face on the CPU.

For one checkpoint and engine dtype: `engine_probe` runs `LLM(..., runner="pooling",
convert="embed")` with the plugin in a child process and saves embeddings; here they are
compared, by the cosine of each text's embedding, with Hugging Face transformers' Qwen3 on
the CPU in float32 (last token, L2-normalised), against `min_embedding_cosine(engine dtype)`:

- our-model: vLLM built our Qwen3 class and its NPU path is active;
- fused-ops-ran: each active fusion's torch_npu operator was called during the embed;
- engine-vs-hf: `LLM.embed` on a batch;
- batch-vs-single: each text embedded alone gives the batch's embedding;
- forward_packed[<config>]-vs-hf: the loaded model with all fusions, none, and each one off
  (a fusion whose "no_" variant passes while all_on fails is the broken one);
- fused-vs-unfused: all fusions vs none on the same device;
- graph-mode (each engine): the model's graph mode (eager, piecewise, or full: one graph per
  forward with attention inside), the graph sizes captured, the replays updated for the batch
  forward and in all, and the most sequences one update carried; in one graph per forward
  with graphs captured it passes only if the batch of unequal texts was one replay, updated
  once, with every text its own sequence (else INFO: nothing replayed);
- with the full plan, a second engine in vLLM's default graph mode (on Ascend: one graph per
  forward for bf16 head_dim 128/192, piecewise ACL graphs around our attention op otherwise):
  compiled-graph (no graph break), graph-mode, compiled-vs-hf, compiled-vs-eager,
  compiled-batch-vs-single (a batch of unequal texts against each text alone: a replay given
  stale boundaries fails it);
- INFO hf-<dtype>-vs-hf-fp32: Hugging Face itself in the engine dtype on the CPU, the size of
  the gap that dtype alone opens (no verdict).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from vllm_npu_ext import QWEN3_MODULE
from vllm_npu_ext.selfcheck.engine_probe import FUSED_OPERATORS, QK_PATH_OPERATORS
from vllm_npu_ext.selfcheck.hf_oracle import hf_embeddings
from vllm_npu_ext.selfcheck.parity import dtype_name
from vllm_npu_ext.selfcheck.report import CheckResult
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

# Odd lengths on purpose: a 1-token input, repeated words, digits, punctuation.
TEXTS = (
    "a",
    "Hello world, the query!",
    "The document is long and has many tokens in it; it keeps going for a while 12345.",
    "x y z",
    "retrieval " * 17,
    "What is the capital of France? Paris is the capital and largest city of France.",
)
OUR_MODEL_CLASS = f"{QWEN3_MODULE}.Qwen3ForCausalLM"
ENGINE_TIMEOUT_S = 1800
LOG_TAIL_LINES = 15


class EngineRunError(RuntimeError):
    """The engine child failed; the message names its log."""


def run_engine(
    model_dir: Path, dtype: str, emulate: bool, stem: Path, compiled: bool = False
) -> dict[str, Any]:
    """Run `engine_probe` on `model_dir`; its results, or EngineRunError with the log's tail."""
    out, log = stem.with_suffix(".pt"), stem.with_suffix(".log")
    command = [
        sys.executable, "-m", "vllm_npu_ext.selfcheck.engine_probe", "--model", str(model_dir),
        "--dtype", dtype, "--out", str(out), "--texts", json.dumps(list(TEXTS)),
    ] + (["--emulate"] if emulate else []) + (["--compiled"] if compiled else [])  # fmt: skip
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    try:
        with open(log, "w", encoding="utf-8") as log_file:
            done = subprocess.run(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                timeout=ENGINE_TIMEOUT_S, check=False,
            )  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise EngineRunError(f"engine run exceeded {ENGINE_TIMEOUT_S} s; log: {log}") from error
    if done.returncode != 0 or not out.exists():
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        tail = [line[:300] for line in lines[-LOG_TAIL_LINES:]]
        raise EngineRunError(
            f"engine run exited with status {done.returncode}; log: {log}\n" + "\n".join(tail)
        )
    return torch.load(out)


def cosine_result(base: dict, check: str, actual, expected, min_cos: float | None) -> CheckResult:
    """PASS when every row's cosine reaches `min_cos`; INFO (no verdict) when it is None."""
    fields = {**base, "check": check}
    if actual.shape != expected.shape:
        fields["problem"] = f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        return CheckResult("model", "FAIL", fields)
    cosines = F.cosine_similarity(actual.float(), expected.float(), dim=-1)
    worst = cosines.min().item()
    fields.update(cos_min=worst, worst_text=int(cosines.argmin()))
    if min_cos is None:
        return CheckResult("model", "INFO", fields)
    fields["min_cos"] = min_cos
    return CheckResult("model", "PASS" if worst >= min_cos else "FAIL", fields)


def _compiled_check(base, engine, eager_run, hf32, min_cos) -> list[CheckResult]:
    model_dir, dtype, emulate, workdir = engine
    stem = workdir / f"engine-{base['model']}-{dtype}-compiled"
    try:
        compiled = run_engine(model_dir, dtype, emulate, stem, compiled=True)
    except EngineRunError as error:
        message, *tail = str(error).splitlines()
        fields = {**base, "check": "compiled-engine", "error": message}
        return [CheckResult("model", "FAIL", fields, tail)]
    return compiled_results(base, compiled, eager_run["batch"], hf32, min_cos)


def _our_model_result(base: dict, run: dict[str, Any]) -> CheckResult:
    path = run["npu_path"]
    ours = OUR_MODEL_CLASS in run["model_classes"]
    fields = {
        **base, "check": "our-model", "class": run["model_classes"][0], "ours": ours,
        "npu_path": path["active"], "fusions": ",".join(path["fusions"]) or "none",
        "attention_op": path["attention_op"], "device": path["device"],
    }  # fmt: skip
    return CheckResult("model", "PASS" if ours and path["active"] else "FAIL", fields)


def _fused_calls_result(base: dict, run: dict[str, Any]) -> CheckResult:
    """Every active fusion's operator was called while the engine embedded the batch."""
    path, calls = run["npu_path"], run["fused_calls"]
    expected = [FUSED_OPERATORS[f] for f in path["fusions"] if f in FUSED_OPERATORS]
    if path.get("qk_path") in QK_PATH_OPERATORS:
        expected.append(QK_PATH_OPERATORS[path["qk_path"]])
    if "attention" in path["fusions"]:
        expected.append(f"npu_{path['attention_op']}")
    missing = [op for op in expected if not calls.get(op)]
    counts = ",".join(f"{op}={calls.get(op, 0)}" for op in expected) or "none"
    fields = {**base, "check": "fused-ops-ran", "calls": counts}
    if missing:
        fields["missing"] = ",".join(missing)
    return CheckResult("model", "FAIL" if missing or not path["active"] else "PASS", fields)


def graph_mode_result(base: dict, run: dict[str, Any], engine: str) -> CheckResult:
    """`graph-mode` (module docstring) for one engine's run (`engine`: eager or compiled)."""
    graph = run["graph"]
    widest = len(graph["widest_update"])  # sequences, the padding one included
    fields = {**base, "check": "graph-mode", "engine": engine, "mode": graph["mode"],
              "graphs": len(graph["captured_sizes"]), "batch_updates": graph["batch_updates"],
              "updates": graph["updates"], "widest_update_seqs": widest}  # fmt: skip
    if graph["mode"] != "full" or not graph["captured_sizes"]:
        return CheckResult("model", "INFO", fields)
    ok = graph["batch_updates"] == 1 and widest >= len(TEXTS)
    return CheckResult("model", "PASS" if ok else "FAIL", fields)


def compiled_results(
    base: dict, compiled: dict[str, Any], eager: torch.Tensor, hf32: torch.Tensor, min_cos: float
) -> list[CheckResult]:
    """The compiled engine: no graph break, embeddings equal to Hugging Face and to eager."""
    counters = compiled["compile"]
    fields = {**base, "check": "compiled-graph", "graph_breaks": counters["graph_breaks"],
              "graphs": counters["unique_graphs"]}  # fmt: skip
    details = [f"graph break: {reason}" for reason in counters["break_reasons"]]
    verdict = "PASS" if counters["graph_breaks"] == 0 else "FAIL"
    return [
        CheckResult("model", verdict, fields, details),
        graph_mode_result(base, compiled, "compiled"),
        cosine_result(base, "compiled-vs-hf", compiled["batch"], hf32, min_cos),
        cosine_result(base, "compiled-vs-eager", compiled["batch"], eager, min_cos),
        cosine_result(base, "compiled-batch-vs-single", compiled["batch"], compiled["single"],
                      min_cos),
    ]  # fmt: skip


def check_model(
    label: str, model_dir: Path, dtype: str, emulate: bool, workdir: Path,
    compiled: bool = False,
) -> list[CheckResult]:
    """Every whole-model check for one checkpoint and engine dtype ("auto": the config's);
    `compiled`: also a second engine in vLLM's default graph mode (`compiled_results`)."""
    base: dict[str, Any] = {"model": label, "dtype": dtype}
    try:
        run = run_engine(model_dir, dtype, emulate, workdir / f"engine-{label}-{dtype}")
    except EngineRunError as error:
        message, *tail = str(error).splitlines()
        return [CheckResult("model", "FAIL", {**base, "check": "engine", "error": message}, tail)]
    engine_dtype = getattr(torch, run["npu_path"]["dtype"])
    base["dtype"] = dtype_name(engine_dtype)
    min_cos = min_embedding_cosine(engine_dtype)
    hf32 = hf_embeddings(model_dir, TEXTS)
    results = [
        _our_model_result(base, run),
        _fused_calls_result(base, run),
        graph_mode_result(base, run, "eager"),
        cosine_result(base, "engine-vs-hf", run["batch"], hf32, min_cos),
        cosine_result(base, "batch-vs-single", run["batch"], run["single"], min_cos),
    ]
    variants = run["variants"]
    if run["variants_error"]:
        fields = {**base, "check": "forward_packed", "error": run["variants_error"]}
        results.append(CheckResult("model", "FAIL", fields))
    results += [
        cosine_result(base, f"forward_packed[{name}]-vs-hf", emb, hf32, min_cos)
        for name, emb in variants.items()
    ]
    if variants:
        fused, unfused = variants["all_on"], variants["all_off"]
        results.append(cosine_result(base, "fused-vs-unfused", fused, unfused, min_cos))
    if compiled:
        results += _compiled_check(base, (model_dir, dtype, emulate, workdir), run, hf32, min_cos)
    if engine_dtype != torch.float32:
        check = f"hf-{dtype_name(engine_dtype)}-vs-hf-fp32"
        hf_in_dtype = hf_embeddings(model_dir, TEXTS, engine_dtype)
        results.append(cosine_result(base, check, hf_in_dtype, hf32, None))
    return results
