"""The shared-prefix workloads of `bench_embed.py --shared-prefix` and `bench_rerank.py
--shared-prefix`: four sides on the prompts users send with a shared beginning.

Sides (all alive together, taking turns per pass as `bench_embed.Bench` runs them):
- plugin: vllm-npu-ext as installed (no KV cache; prefixes a step shares computed once);
- plugin-noshare: the same with `VLLM_NPU_EXT_SHARED_PREFIX=0` (today's plugin: every text
  whole);
- stock: vLLM without our plugin, prefix caching on (vLLM's default for these models) at its
  default block size (128 on CPU and on vllm-ascend);
- stock-bs16: the same at `--block-size 16`, its best case for short shared prefixes (on the
  CPU `stock-bs32`: vLLM 0.32's CPU attention takes multiples of 32 only, "No common block
  size for 16 (CPU_ATTN: [MultipleOf(32)])").
Stock's KV cache is sized `STOCK_KV_CACHE_BYTES` (the passes need far less; a default-sized
cache would take most of the machine's memory for each stock side).

Workloads (issue 44):
- (a) `model-card`: 64 queries of 4-16 words behind Qwen3-Embedding's model-card instruction
  ("Instruct: Given a web search query, retrieve relevant passages that answer the
  query\\nQuery:"), one call of 64;
- (b) `rerank-32`: one query against 32 documents of 32-256 tokens through Qwen3-Reranker's
  template, one score call;
- (c) `prefix-256`: bench_embed's shared-prefix scenario (a ~256-token instruction before
  queries of 8-64 tokens, calls of 16, 32 queries per pass).
`--workloads a,c` (bench_embed) runs only the named ones; `--shared-prefix-sides` only the
named sides, with the plugin and plugin-noshare always among them (every ratio is the
plugin's, every side's outputs are checked against plugin-noshare's).
Every pass uses new queries (and documents); the instruction is the same in every pass, as a
deployment's is, and the warm-up runs it first, so stock's prefix cache holds its blocks.

Reported per workload and side: texts/s, prompt tokens and tokens computed per pass (prompt
minus prefix-cache hits minus rows the plugin shared), and the plugin's paired speed ratios
against the three others. Outputs are compared with plugin-noshare's on the same inputs:
a side whose outputs are off (bench_embed.MIN_COSINE_VS_HF for embeddings, MAX_SCORE_DIFF for
scores) withholds every ratio.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from _common import cosine, log, markdown_table, median
from _embed_report import GIB, json_safe, load_average, paired_ratios, throughput

SMALL_BLOCK = {"npu": 16, "cpu": 32}  # the smallest block size each platform's stock takes
STOCK_KV_CACHE_BYTES = 1 << 30
# The targets: the plugin's speed against each side, per workload.
TARGETS = {"model-card": {"plugin-noshare": 1.6, "stock": 1.5},
           "rerank-32": {"plugin-noshare": 1.25}, "prefix-256": {"stock": 1.0}}  # fmt: skip
MAX_SCORE_DIFF = {"float32": 1e-5, "float16": 0.01, "bfloat16": 0.02}


def side_names(device: str) -> tuple[str, ...]:
    return ("plugin", "plugin-noshare", "stock", f"stock-bs{SMALL_BLOCK[device]}")


def sides(side_cls, ours: dict, stock: dict, device: str) -> list:
    """The four `bench_embed.Side`s (module docstring); `ours`/`stock`: their environments
    (ours with the CPU's float32 matmuls off, so both multiply as stock does: like for like)."""
    ours = {**ours, "VLLM_NPU_EXT_CPU_FLOAT32_MATMUL": "0"}
    stock_args = {"kv_cache_memory_bytes": STOCK_KV_CACHE_BYTES}
    small = {**stock_args, "block_size": SMALL_BLOCK[device]}
    names = side_names(device)
    return [
        side_cls(names[0], "vllm", ours),
        side_cls(names[1], "vllm", {**ours, "VLLM_NPU_EXT_SHARED_PREFIX": "0"}),
        side_cls(names[2], "vllm", stock, engine_args=stock_args),
        side_cls(names[3], "vllm", stock, engine_args=small),
    ]


def chosen_sides(side_list: list, wanted: list[str] | None) -> list:
    """`side_list` limited to the names in `wanted` (all where None or empty), the plugin and
    plugin-noshare always kept (module docstring)."""
    known = [side.name for side in side_list]
    unknown = sorted(set(wanted or ()) - set(known))
    if unknown:
        raise SystemExit(f"--shared-prefix-sides: unknown {unknown}, known {known}")
    keep = set(wanted or known) | set(known[:2])
    return [side for side in side_list if side.name in keep]


# bench_embed's `--workloads` letters (issue 44's) and the scenario each names.
EMBED_WORKLOADS = {"a": "model-card", "c": "prefix-256"}


def embed_scenarios(repeats: int, workloads: str = "a,c") -> list[dict]:
    """The embedding workloads named by `workloads` (letters of `EMBED_WORKLOADS`)."""
    letters = [letter for letter in workloads.split(",") if letter]
    if not letters or set(letters) - set(EMBED_WORKLOADS):
        raise SystemExit(f"--workloads: expected letters of {sorted(EMBED_WORKLOADS)} joined by "
                         f"commas, got {workloads!r}")  # fmt: skip
    names = {EMBED_WORKLOADS[letter] for letter in letters}
    return [scenario for scenario in _embed_scenarios(repeats) if scenario["name"] in names]


def _embed_scenarios(repeats: int) -> list[dict]:
    base = {"repeats": repeats, "keep_outputs": True, "min_tokens": 8}
    return [
        {**base, "name": "model-card", "kind": "model_card", "batch_sizes": [64],
         "texts_per_pass": 64, "min_words": 4, "max_words": 16, "prefix_tokens": 0,
         "max_tokens": 64},
        {**base, "name": "prefix-256", "batch_sizes": [16], "texts_per_pass": 32,
         "prefix_tokens": 256, "max_tokens": 64},
    ]  # fmt: skip


def rerank_scenario(repeats: int) -> dict:
    return {"name": "rerank-32", "batch_sizes": [32], "repeats": repeats, "pairs_per_pass": 32,
            "min_tokens": 32, "max_tokens": 256, "query_tokens": 16, "keep_outputs": True}


def run(bench, side_list: list, scenarios: list[dict]) -> None:
    """Start the sides (plugins first: stock reserves memory at start), take turns on each
    workload, warm-up included, then stop them."""
    for side in side_list:
        bench.start(side)
    names = [side.name for side in side_list]
    for scenario in scenarios:
        bench.take_turns(names, scenario, scenario["batch_sizes"][0])
    for name in names:
        bench.finish(name)


def output_agreement(results: dict, scenario: str, side: str, scores: bool) -> float:
    """Worst agreement of `side`'s outputs with plugin-noshare's on the same passes: the
    minimum cosine (embeddings) or the maximum score difference (scores)."""
    reference = {(r["batch_size"], r["repeat"]): r.get("outputs")
                 for r in results["plugin-noshare"]["passes"] if r["scenario"] == scenario}
    values = []
    for record in results[side]["passes"]:
        other = reference.get((record["batch_size"], record["repeat"]))
        if record["scenario"] != scenario or other is None or record.get("outputs") is None:
            continue
        for a, b in zip(record["outputs"], other, strict=True):
            values.append(abs(a - b) if scores else cosine(a, b))
    if not values:
        return float("nan")
    return max(values) if scores else min(values)


def report(results: dict, args, model, scenarios: list[dict], scores: bool,
           bound: float) -> tuple[str, dict, list[str]]:  # fmt: skip
    """Tables, the summary and the parity failures (module docstring)."""
    parts, summary, failures = [], {"model": str(model), "dtype": args.dtype,
                                    "device": args.device, "workloads": {}}, []  # fmt: skip
    for scenario in scenarios:
        name = scenario["name"]
        rows, figures = [], {}
        names = side_names(args.device)
        for side in names:
            if side not in results:
                continue
            passes = [r for r in results[side]["passes"] if r["scenario"] == name]
            rate = throughput(results[side], name)[scenario["batch_sizes"][0]]
            agreement = output_agreement(results, name, side, scores)
            off = agreement > bound if scores else agreement < bound
            if off:
                failures.append(f"{name}: side {side} agrees with plugin-noshare only to "
                                f"{agreement:.3g} (bound {bound:g})")  # fmt: skip
            computed = median([r.get("computed_tokens", r["tokens"]) for r in passes])
            vs = {b: _ratio(results, name, "plugin", b) for b in names[1:] if b in results}
            figures[side] = {"texts_per_s": rate["texts_per_s"], "tokens_per_pass":
                             rate["tokens_per_pass"], "computed_tokens_per_pass": computed,
                             "agreement": agreement, "load_average": load_average(results[side])}
            rows.append([side, rate["texts_per_s"], rate["tokens_per_pass"], computed,
                         f"{agreement:.2e}" if scores else f"{agreement:.6f}",
                         vs.get(side, float("nan")) if side != "plugin" else 1.0])  # fmt: skip
        plugin_vs = {b: _ratio(results, name, "plugin", b) for b in names[1:] if b in results}
        summary["workloads"][name] = {"sides": figures, "plugin_vs": plugin_vs,
                                      "targets": TARGETS.get(name, {})}  # fmt: skip
        header = ["side", "texts/s", "prompt tokens/pass", "tokens computed/pass",
                  "max |score diff|" if scores else "min cos vs noshare", "plugin / side"]
        parts.append(f"{_title(scenario)}\n\n" + markdown_table(header, rows))
    parts.append(_sides_table(results))
    return "\n\n".join(parts) + "\n", json_safe(summary), failures


def _ratio(results: dict, scenario: str, side: str, baseline: str) -> float:
    values = paired_ratios(results, scenario, side, baseline)
    return next(iter(values.values()), float("nan"))


def _title(scenario: dict) -> str:
    titles = {
        "model-card": "(a) 64 queries of 4-16 words behind the model card's instruction, one "
                      "call, new queries each pass",
        "rerank-32": "(b) one query, 32 documents of 32-256 tokens, Qwen3-Reranker's template",
        "prefix-256": "(c) a ~256-token instruction before queries of 8-64 tokens, calls of 16",
    }  # fmt: skip
    return f"{titles[scenario['name']]}; median of {scenario['repeats']} passes:"


def _sides_table(results: dict) -> str:
    header = ["side", "start-up s", "KV cache GiB", "peak RSS GiB", "prefix caching",
              "max batched tokens", "load avg"]  # fmt: skip
    rows = [[name, r["startup_seconds"], r["kv_cache_bytes"] / GIB, r["peak_rss_gib"],
             r["prefix_caching"], r["max_num_batched_tokens"], load_average(r)]
            for name, r in results.items()]  # fmt: skip
    return markdown_table(header, rows)


def strip_outputs(results: dict) -> None:
    """Drop the kept outputs (compared already) from every pass record."""
    for result in results.values():
        for record in result["passes"]:
            record.pop("outputs", None)


def execute(args, model: Path, worker: Path, bench_cls, scenarios: list[dict], scores: bool,
            bound: float) -> int:  # fmt: skip
    """Run the four sides on `scenarios`, always stop them, print the tables (withheld where a
    side's outputs are off: exit status 1) and, last, the summary JSON line."""
    from bench_embed import side_catalogue, vllm_plugins

    catalogue = side_catalogue()
    side_list = sides(type(catalogue["plugin"]), {"VLLM_PLUGINS": vllm_plugins(True)},
                      {"VLLM_PLUGINS": vllm_plugins(False)}, args.device)  # fmt: skip
    side_list = chosen_sides(side_list, args.shared_prefix_sides)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="shared_prefix."))
    work_dir.mkdir(parents=True, exist_ok=True)
    bench = bench_cls(args, model, work_dir, worker)
    try:
        run(bench, side_list, scenarios)
    finally:
        bench.kill_all()
    tables, summary, failures = report(bench.results, args, model, scenarios, scores, bound)
    strip_outputs(bench.results)
    if failures:
        for workload in summary["workloads"].values():
            workload["plugin_vs"] = None
        summary["parity_failures"] = failures
        print("No speed ratio reported: " + "; ".join(failures), file=sys.stderr)
    else:
        print(tables)
    log(f"worker logs: {work_dir}")
    line = json.dumps(summary)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    return 1 if failures else 0
