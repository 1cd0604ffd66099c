"""benchmarks/_shared_prefix_bench.py (`bench_embed.py` / `bench_rerank.py --shared-prefix`):
the report on recorded passes: tokens computed per pass, the plugin's paired ratios against
each side, and no ratio where a side's outputs disagree with the plugin without sharing."""

from __future__ import annotations

import argparse

import pytest
from support.scripts import load_script

shared = load_script("benchmarks/bench_embed.py").shared_prefix_bench

SCENARIO = shared.embed_scenarios(2)[0]  # (a)
NAMES = shared.side_names("cpu")


def _side(seconds: float, computed: int, outputs: list) -> dict:
    passes = [{"scenario": SCENARIO["name"], "batch_size": 64, "repeat": repeat,
               "seconds": seconds, "texts": 64, "tokens": 1000, "computed_tokens": computed,
               "load": 1.0, "outputs": outputs} for repeat in range(2)]  # fmt: skip
    return {"startup_seconds": 1.0, "kv_cache_bytes": 0, "peak_rss_gib": 1.0,
            "prefix_caching": False, "max_num_batched_tokens": 4096, "passes": passes}


def _results(plugin_outputs) -> dict:
    good = [[1.0, 0.0], [0.0, 1.0]]
    return {
        NAMES[0]: _side(1.0, 400, plugin_outputs),
        NAMES[1]: _side(2.0, 1000, good),
        NAMES[2]: _side(1.6, 1000, good),
        NAMES[3]: _side(1.2, 700, good),
    }


ARGS = argparse.Namespace(dtype="float32", device="cpu")


def test_ratios_and_tokens_computed_per_side():
    tables, summary, failures = shared.report(_results([[1.0, 0.0], [0.0, 1.0]]), ARGS, "m",
                                              [SCENARIO], scores=False, bound=0.99999)  # fmt: skip
    assert failures == []
    workload = summary["workloads"]["model-card"]
    assert workload["plugin_vs"] == pytest.approx({NAMES[1]: 2.0, NAMES[2]: 1.6, NAMES[3]: 1.2})
    assert workload["sides"][NAMES[0]]["computed_tokens_per_pass"] == 400
    assert workload["targets"] == {"plugin-noshare": 1.6, "stock": 1.5}
    assert "| plugin | 64.0 | 1000 | 400 |" in tables


def test_a_side_off_the_plugin_without_sharing_withholds_every_ratio():
    _, _, failures = shared.report(_results([[0.0, 1.0], [1.0, 0.0]]), ARGS, "m", [SCENARIO],
                                   scores=False, bound=0.99999)  # fmt: skip
    assert failures and failures[0].startswith("model-card: side plugin agrees")


def test_the_small_block_side_is_the_smallest_each_platform_takes():
    assert shared.side_names("cpu")[3] == "stock-bs32"  # vLLM's CPU attention: multiples of 32
    assert shared.side_names("npu")[3] == "stock-bs16"


def _named(name: str) -> argparse.Namespace:
    return argparse.Namespace(name=name)


def test_a_chosen_side_runs_with_the_plugin_and_its_reference():
    side_list = [_named(name) for name in NAMES]
    assert [s.name for s in shared.chosen_sides(side_list, ["stock"])] == list(NAMES[:3])
    assert [s.name for s in shared.chosen_sides(side_list, None)] == list(NAMES)
    with pytest.raises(SystemExit, match="unknown \\['stok'\\]"):
        shared.chosen_sides(side_list, ["stok"])


def test_workloads_name_the_scenarios_by_the_issues_letters():
    assert [s["name"] for s in shared.embed_scenarios(2, "c")] == ["prefix-256"]
    assert [s["name"] for s in shared.embed_scenarios(2)] == ["model-card", "prefix-256"]
    with pytest.raises(SystemExit, match="--workloads"):
        shared.embed_scenarios(2, "b")
