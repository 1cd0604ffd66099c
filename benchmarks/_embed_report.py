"""Tables and the summary JSON of `bench_embed.py`, from the workers' results."""

from __future__ import annotations

import math
import os
from collections import defaultdict

from _common import cosine, geometric_mean, markdown_table, median

GIB = 2**30
MIXED_SIDES = ("plugin", "plugin-bf16mm", "stock", "hf")


def throughput(result: dict, scenario: str) -> dict[int, dict[str, float]]:
    """Batch size -> median texts/s and tokens/s over that scenario's timed passes."""
    by_batch = defaultdict(list)
    for record in result["passes"]:
        if record["scenario"] == scenario:
            by_batch[record["batch_size"]].append(record)
    return {
        batch: {
            "texts_per_s": median([r["texts"] / r["seconds"] for r in records]),
            "tokens_per_s": median([r["tokens"] / r["seconds"] for r in records]),
            "tokens_per_pass": median([r["tokens"] for r in records]),
        }
        for batch, records in sorted(by_batch.items())
    }


def has_passes(results: dict, scenarios: set[str]) -> bool:
    return any(p["scenario"] in scenarios for r in results.values() for p in r["passes"])


def load_average(result: dict) -> float:
    """Median 1-minute load average at the end of the side's passes (its own threads count)."""
    return median([record["load"] for record in result["passes"]])


def paired_ratios(results: dict, scenario: str, side: str, baseline: str) -> dict[int, float]:
    """Batch size -> median over repeats of side/baseline speed on the same texts.

    Passes with the same (batch size, repeat) embed the same texts and ran back to back.
    """
    if side not in results or baseline not in results:
        return {}
    base = {
        (r["batch_size"], r["repeat"]): r["seconds"]
        for r in results[baseline]["passes"]
        if r["scenario"] == scenario
    }
    by_batch = defaultdict(list)
    for record in results[side]["passes"]:
        key = (record["batch_size"], record["repeat"])
        if record["scenario"] == scenario and key in base:
            by_batch[record["batch_size"]].append(base[key] / record["seconds"])
    return {batch: median(values) for batch, values in sorted(by_batch.items())}


def ratio(results: dict, scenario: str, side: str, baseline: str) -> float:
    """Geometric mean over batch sizes of the paired side/baseline speed ratios."""
    return geometric_mean(list(paired_ratios(results, scenario, side, baseline).values()))


def min_cosine_vs_hf(results: dict, side: str) -> float:
    if "hf" not in results:
        return float("nan")
    pairs = zip(results[side]["check_embeddings"], results["hf"]["check_embeddings"], strict=True)
    return min(cosine(a, b) for a, b in pairs)


def mixed_table(results: dict, args) -> str:
    present = [s for s in MIXED_SIDES if s in results]
    rates = {side: throughput(results[side], "mixed") for side in present}
    header = ["batch"] + [f"{s} {unit}" for s in present for unit in ("texts/s", "tokens/s")]
    header += [f"plugin/{s} (paired)" for s in present[1:] if "plugin" in present]
    rows = []
    for batch in args.batch_sizes:
        row = [batch]
        for side in present:
            row += [rates[side][batch]["texts_per_s"], rates[side][batch]["tokens_per_s"]]
        if "plugin" in present:
            row += [paired_ratios(results, "mixed", "plugin", s)[batch] for s in present[1:]]
        rows.append(row)
    title = (
        f"Mixed lengths ({args.min_tokens}-{args.max_tokens} tokens, log-uniform), "
        f"{args.texts_per_pass} new texts per pass, median of {args.repeats}:"
    )
    return title + "\n\n" + markdown_table(header, rows)


def prefix_table(results: dict, args) -> str:
    """The shared-prefix rows; each side is compared with the plugin's passes of its phase."""
    rows = []
    for side, scenario in (("plugin", "prefix"), ("stock", "prefix"), ("plugin-kv", "prefix-kv")):
        if side not in results:
            continue
        rate = throughput(results[side], scenario)[args.prefix_batch_size]
        rows.append([side, results[side]["prefix_caching"], rate["texts_per_s"],
                     rate["tokens_per_s"], ratio(results, scenario, side, "plugin")])  # fmt: skip
    title = (
        f"Shared instruction prefix (~{args.prefix_tokens} tokens) + queries of 8-64 tokens, "
        f"batch {args.prefix_batch_size}, {args.prefix_texts} new queries per pass "
        "(tokens/s counts prefix tokens, cached or not):"
    )
    header = ["side", "prefix caching", "texts/s", "tokens/s", "vs plugin"]
    return title + "\n\n" + markdown_table(header, rows)


def sides_table(results: dict) -> str:
    header = [
        "side", "start-up s", "KV cache GiB", "peak RSS GiB", "prefix caching",
        "chunked prefill", "max batched tokens", "torch threads", "min cos vs hf", "load avg",
    ]  # fmt: skip
    rows = [
        [name, r["startup_seconds"], r["kv_cache_bytes"] / GIB, r["peak_rss_gib"],
         r["prefix_caching"], r["chunked_prefill"], r["max_num_batched_tokens"],
         r.get("torch_threads"), f"{min_cosine_vs_hf(results, name):.5f}", load_average(r)]
        for name, r in results.items()
    ]  # fmt: skip
    return markdown_table(header, rows)


def ablation_table(results: dict, args) -> str:
    batch = max(args.batch_sizes)
    rows = []
    for name, result in results.items():
        scenario = f"ablation-{name}"
        if batch in throughput(result, scenario):
            gain = ratio(results, scenario, "plugin", name) - 1
            rate = throughput(result, scenario)[batch]["texts_per_s"]
            rows.append([name, rate, f"{gain * 100:+.1f}%"])
    title = f"Per-fusion ablation (batch {batch}; gain = all fusions on vs this variant):"
    return title + "\n\n" + markdown_table(["variant", "texts/s", "gain of the fusion"], rows)


def matmul_table(results: dict) -> str:
    """The plugin against stock at matched matmul precision (bench_embed.py's docstring)."""
    rows = []
    for label, scenario, side, base in (
        ("half-precision matmuls on both (plugin-bf16mm / stock)", "mixed", "plugin-bf16mm",
         "stock"),
        ("float32 matmuls on both (plugin / stock-fp32)", "mixed-fp32", "plugin", "stock-fp32"),
    ):  # fmt: skip
        rows.append([label, ratio(results, scenario, side, base)])
    title = ("CPU matmul precision, like for like (geometric mean of paired texts/s ratios over "
             "batch sizes; by default the plugin multiplies bf16/fp16 weights in float32 on a "
             "CPU without native half-precision matmuls):")  # fmt: skip
    return title + "\n\n" + markdown_table(["comparison", "speed ratio"], rows)


def report(results: dict, args, model) -> tuple[str, dict]:
    """Markdown tables and the summary dict (the JSON line)."""
    parts = []
    if any(s in results for s in MIXED_SIDES):
        parts.append(mixed_table(results, args))
    if has_passes(results, {"prefix", "prefix-kv"}):
        parts.append(prefix_table(results, args))
    parts.append(sides_table(results))
    busiest = max(load_average(r) for r in results.values())
    if busiest > (os.cpu_count() or 1) + 1:
        parts.append(
            f"Warning: load average up to {busiest:.1f} on {os.cpu_count()} cores: other work "
            "ran during the passes; absolute figures are low and ratios noisy."
        )
    if args.run_ablation and "plugin" in results:
        parts.append(ablation_table(results, args))
    if has_passes(results, {"mixed-fp32"}) or "plugin-bf16mm" in results:
        parts.append(matmul_table(results))
    summary = {
        "plugin_bf16mm_vs_stock": ratio(results, "mixed", "plugin-bf16mm", "stock"),
        "plugin_vs_stock": ratio(results, "mixed", "plugin", "stock"),
        "plugin_vs_stock_fp32": ratio(results, "mixed-fp32", "plugin", "stock-fp32"),
        "plugin_vs_hf": ratio(results, "mixed", "plugin", "hf"),
        "prefix_plugin_vs_stock": ratio(results, "prefix", "plugin", "stock"),
        "prefix_plugin_kv_vs_plugin": ratio(results, "prefix-kv", "plugin-kv", "plugin"),
        "model": str(model), "dtype": args.dtype, "quick": args.quick, "device": args.device,
        "sides": {name: side_summary(results, name) for name in results},
    }  # fmt: skip
    return "\n\n".join(parts) + "\n", json_safe(summary)


def side_summary(results: dict, name: str) -> dict:
    result = results[name]
    scenarios = sorted({record["scenario"] for record in result["passes"]})
    return {
        "throughput": {scenario: throughput(result, scenario) for scenario in scenarios},
        "startup_seconds": result["startup_seconds"],
        "kv_cache_gib": result["kv_cache_bytes"] / GIB,
        "peak_rss_gib": result["peak_rss_gib"],
        "prefix_caching": result["prefix_caching"],
        "min_cosine_vs_hf": min_cosine_vs_hf(results, name),
        "load_average": load_average(result),
    }


def json_safe(value):
    """NaN/inf -> None, recursively (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value
