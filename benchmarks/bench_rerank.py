#!/usr/bin/env python
"""Offline reranking throughput (pairs/s): vllm-npu-ext vs stock vLLM vs Hugging Face.

    python benchmarks/bench_rerank.py            # Qwen3-Reranker-0.6B shapes, bf16
    python benchmarks/bench_rerank.py --quick    # the tiny reranker (a few minutes)

Each side runs in its own process (`_rerank_worker.py`) on the same generated pairs:

- plugin: vLLM with vllm-npu-ext, configured as `vllm-npu-ext serve --reranker` (our Qwen3
  under vLLM's seq-cls adapter: cache-free, no prefix caching);
- stock: the same vLLM and the same flags with our plugins left out of `VLLM_PLUGINS`
  (vLLM's own Qwen3: KV cache and prefix caching);
- hf: transformers, the model card's computation in length-sorted left-padded batches.

Batch size = documents per query (one `LLM.score` call per query, as one /rerank request;
`hf` forwards that many pairs at a time). Every timed pass scores pairs no pass has seen:
new queries and documents per (batch size, repeat), identical on every side. The sides take
turns, one pass each per (batch size, repeat) in rotating order (`bench_embed.Bench`);
ratios are paired per pass, median over repeats, geometric mean over batch sizes.

Output: markdown tables, then, as the last line, one JSON object with `plugin_vs_stock` and
`plugin_vs_hf` (targets: >= 1.0 and >= 1.2) and every figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _shared_prefix_bench as shared_prefix_bench  # noqa: E402
from _common import markdown_table  # noqa: E402
from _embed_report import (  # noqa: E402
    GIB,
    json_safe,
    load_average,
    paired_ratios,
    ratio,
    throughput,
)
from bench_embed import (  # noqa: E402
    Bench,
    OracleCheck,
    add_run_arguments,
    built_model,
    execute,
    positive_ints,
    side_catalogue,
)

WORKER = Path(__file__).resolve().parent / "_rerank_worker.py"
SIDES = ("plugin", "stock", "hf")
TARGETS = {"plugin_vs_stock": 1.0, "plugin_vs_hf": 1.2}
# Scores are probabilities; above these a side's speed is not reported (bench_embed.execute).
MAX_SCORE_DIFF_VS_HF = {"float32": 1e-5, "float16": 0.01, "bfloat16": 0.02}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny reranker, fewer passes")
    parser.add_argument("--model", type=Path, help="checkpoint dir (default: a built one)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=positive_ints,
                        help="documents per query (default 1,8,32)")  # fmt: skip
    parser.add_argument("--pairs-per-pass", type=int, help="pairs in one timed pass")
    parser.add_argument("--repeats", type=int, help="timed passes per batch size (3)")
    parser.add_argument("--min-tokens", type=int, default=16, help="shortest document")
    parser.add_argument("--max-tokens", type=int, default=384, help="longest document")
    parser.add_argument("--query-tokens", type=int, default=32, help="longest query")
    parser.add_argument("--sides", type=lambda s: s.split(","), default=list(SIDES))
    parser.add_argument("--shared-prefix", action="store_true",
                        help="instead: workload (b), one query against 32 documents, plugin "
                        "with and without sharing against stock at block sizes 128 and 16 "
                        "(_shared_prefix_bench.py)")  # fmt: skip
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    args.batch_sizes = args.batch_sizes or ([1, 8] if args.quick else [1, 8, 32])
    args.pairs_per_pass = args.pairs_per_pass or (16 if args.quick else 48)
    args.repeats = args.repeats or (2 if args.quick else 3)
    unknown = set(args.sides) - set(SIDES)
    if unknown:
        parser.error(f"--sides: unknown {sorted(unknown)}, known {list(SIDES)}")
    if args.min_tokens < 2 or args.max_tokens < args.min_tokens:
        parser.error("need 2 <= --min-tokens <= --max-tokens")
    from vllm_npu_ext.ops.dispatch import npu_available

    args.device = "npu" if npu_available() else "cpu"
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.4 if args.device == "npu" else 0.5
    return args


def scenario(args) -> dict:
    return {
        "name": "rerank", "batch_sizes": args.batch_sizes, "repeats": args.repeats,
        "pairs_per_pass": args.pairs_per_pass, "min_tokens": args.min_tokens,
        "max_tokens": args.max_tokens, "query_tokens": args.query_tokens,
    }  # fmt: skip


def run(bench: Bench, sides: list[str], args) -> None:
    catalogue = side_catalogue()
    for name in sides:  # the plugin (no KV cache) first: stock fills its memory fraction
        bench.start(catalogue[name])
    bench.take_turns(sides, scenario(args), max(8, max(args.batch_sizes)))
    for name in sides:
        bench.finish(name)


def max_diff_vs_hf(results: dict, side: str) -> float:
    if "hf" not in results:
        return float("nan")
    pairs = zip(results[side]["check_scores"], results["hf"]["check_scores"], strict=True)
    return max(abs(a - b) for a, b in pairs)


def report(results: dict, args, model: Path) -> tuple[str, dict]:
    present = [side for side in SIDES if side in results]
    rates = {side: throughput(results[side], "rerank") for side in present}
    baselines = [side for side in present if side != "plugin"] if "plugin" in present else []
    header = ["docs/query"] + [f"{side} pairs/s" for side in present]
    header += [f"plugin/{side}" for side in baselines]
    rows = []
    for batch in args.batch_sizes:
        row = [batch] + [rates[side][batch]["texts_per_s"] for side in present]
        row += [paired_ratios(results, "rerank", "plugin", side)[batch] for side in baselines]
        rows.append(row)
    title = (
        f"Reranking, documents of {args.min_tokens}-{args.max_tokens} tokens (log-uniform), "
        f"queries of 4-{args.query_tokens}, {args.pairs_per_pass} new pairs per pass, median "
        f"of {args.repeats}:"
    )
    side_header = ["side", "start-up s", "KV cache GiB", "peak RSS GiB", "prefix caching",
                   "max |score - hf|", "load avg"]  # fmt: skip
    side_rows = [
        [name, r["startup_seconds"], r["kv_cache_bytes"] / GIB, r["peak_rss_gib"],
         r["prefix_caching"], f"{max_diff_vs_hf(results, name):.2e}", load_average(r)]
        for name, r in results.items()
    ]  # fmt: skip
    parts = [title, markdown_table(header, rows), markdown_table(side_header, side_rows)]
    busiest = max(load_average(r) for r in results.values())
    if busiest > (os.cpu_count() or 1) + 1:
        parts.append(f"Warning: load average up to {busiest:.1f} on {os.cpu_count()} cores: "
                     "other work ran during the passes; ratios are noisy.")  # fmt: skip
    summary = {
        "plugin_vs_stock": ratio(results, "rerank", "plugin", "stock"),
        "plugin_vs_hf": ratio(results, "rerank", "plugin", "hf"),
        "targets": TARGETS, "model": str(model), "dtype": args.dtype, "quick": args.quick,
        "device": args.device, "emulate": args.emulate,
        "sides": {
            name: {"pairs_per_s": {b: v["texts_per_s"] for b, v in rates[name].items()},
                   "startup_seconds": results[name]["startup_seconds"],
                   "prefix_caching": results[name]["prefix_caching"],
                   "max_score_diff_vs_hf": max_diff_vs_hf(results, name),
                   "load_average": load_average(results[name])}
            for name in present
        },
    }  # fmt: skip
    return "\n\n".join(parts) + "\n", json_safe(summary)


def main(argv=None) -> int:
    args = parse_args(argv)
    model = args.model or built_model("reranker" if args.quick else "reranker-0.6b")
    if args.shared_prefix:
        return shared_prefix_bench.execute(
            args, model, WORKER, Bench, [shared_prefix_bench.rerank_scenario(args.repeats)],
            scores=True, bound=shared_prefix_bench.MAX_SCORE_DIFF[args.dtype],
        )  # fmt: skip
    sides = [side for side in SIDES if side in args.sides]
    oracle = OracleCheck("max_score_diff_vs_hf", "max |score - hf|", MAX_SCORE_DIFF_VS_HF,
                         at_least=False)  # fmt: skip
    return execute(args, model, WORKER, lambda bench: run(bench, sides, args), report, oracle)


if __name__ == "__main__":
    sys.exit(main())
