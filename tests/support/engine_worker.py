"""Runs one in-process vLLM embedding engine with the plugin and saves what the tests check.

    python tests/support/engine_worker.py --model DIR --dtype float32 --out FILE --texts JSON \\
        [--emulate] [--engine-args JSON] [--repeat-texts JSON] [--skip-packed]
        [--compiled '{"cudagraph_mode": "PIECEWISE"}']

One process per checkpoint keeps each engine's global state (distributed groups, compile
caches) out of the pytest process; the caller's environment reaches the plugin (e.g.
VLLM_NPU_EXT_KV_CACHE_FREE). The engine and the common results (model classes, NPU path,
batch and single embeddings, forward_packed under each fusion configuration, fused operator
calls, KV-cache figures) come from `vllm_npu_ext.selfcheck.engine_probe`, as in selfcheck.
With --emulate the tests also get the platform path on the same engine (the emulator switched
off for one more pass) and the device operators per layer of each fusion configuration.
`--repeat-texts` (one text per path: NPU first, then platform) embeds each text twice in a
row, with vLLM's own prefix-cache figures for both requests (`repeat`). `--skip-packed`
leaves out the forward_packed runs (fusion variants, operator counts), which never touch the
engine's KV cache. `--compiled` runs a compiled engine instead (`_compiled_run`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from vllm_npu_ext.selfcheck import engine_probe

PREFIX_CACHE_COUNTERS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", required=True)
    parser.add_argument("--texts", required=True, help="JSON list of texts")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--engine-args", default="{}", help="JSON: more vllm.LLM arguments")
    parser.add_argument("--repeat-texts", default="[]", help="JSON: [NPU text, platform text]")
    parser.add_argument("--skip-packed", action="store_true", help="no forward_packed runs")
    parser.add_argument("--compiled", help="JSON compilation config: a compiled engine run")
    args = parser.parse_args()
    texts, repeat_texts = json.loads(args.texts), json.loads(args.repeat_texts)

    if args.compiled is not None:
        torch.save(_compiled_run(args, texts), args.out)
        return
    llm = engine_probe.build_llm(
        args.model, args.dtype, args.emulate, max_model_len=256, disable_log_stats=False,
        **json.loads(args.engine_args),
    )  # fmt: skip
    results = engine_probe.probe(llm, texts, args.emulate, variants=not args.skip_packed)
    results["block_size"] = llm.llm_engine.vllm_config.cache_config.block_size
    first_path = "npu" if args.emulate else "platform"
    results["repeat"] = {first_path: _embed_twice(llm, repeat_texts[0])} if repeat_texts else {}
    if args.emulate:
        from vllm_npu_ext import emulator

        emulator.uninstall()
        results["platform"] = engine_probe.embed(llm, texts)
        if repeat_texts:
            results["repeat"]["platform"] = _embed_twice(llm, repeat_texts[1])
        emulator.install()
        if not args.skip_packed:
            results["op_counts"] = _op_counts(llm)
            results["compiled_counts"] = _compiled_counts(llm)
    torch.save(results, args.out)


def _compiled_run(args, texts) -> dict:
    """vLLM compiles the model (`--compiled` adds to its compilation config): embeddings,
    dynamo's counters and the emulated operators' kernel calls (made by the compiled graph)."""
    llm = engine_probe.build_llm(
        args.model, args.dtype, args.emulate, compiled=True, max_model_len=256,
        compilation_config=json.loads(args.compiled), **json.loads(args.engine_args),
    )  # fmt: skip
    from vllm_npu_ext import emulator

    emulator.reset_counts()
    results = engine_probe.probe_compiled(llm, texts)
    results["kernel_calls"] = dict(emulator.calls)
    results["model_classes"] = llm.apply_model(engine_probe.class_names)[0]
    return results


def _embed_twice(llm, text: str) -> dict:
    """`text` embedded in two requests one after the other, with vLLM's cache figures:
    `num_cached_tokens` of each request and the change of its prefix-cache counters."""
    before = _prefix_cache_counters(llm)
    outputs = [llm.embed([text], use_tqdm=False)[0] for _ in range(2)]
    after = _prefix_cache_counters(llm)
    return {
        "embeddings": torch.tensor([o.outputs.embedding for o in outputs], dtype=torch.float32),
        "num_cached_tokens": [o.num_cached_tokens for o in outputs],
        "prompt_tokens": len(outputs[0].prompt_token_ids),
        **{name: after[name] - before[name] for name in PREFIX_CACHE_COUNTERS},
    }


def _prefix_cache_counters(llm) -> dict[str, float]:
    values = dict.fromkeys(PREFIX_CACHE_COUNTERS, 0.0)
    for metric in llm.get_metrics():
        if metric.name in values:
            values[metric.name] += metric.value
    return values


def _count_ops_module():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import count_ops

    return count_ops


def _compiled_counts(llm) -> dict:
    """Graph breaks and ops inside/outside vLLM's piecewise graphs (benchmarks/count_ops.py)."""
    count_compiled, vllm_config = _count_ops_module().count_compiled, llm.llm_engine.vllm_config
    return llm.apply_model(lambda model: count_compiled(model, [7, 3], vllm_config))[0]


def _op_counts(llm) -> dict[str, int]:
    """Device operators per decoder layer (benchmarks/count_ops.py) for each configuration."""
    count_layer_ops = _count_ops_module().count_layer_ops

    from vllm_npu_ext.envs import FUSIONS

    def run(model):
        base = model.model.plan.fusions
        configs = {"all_on": base, **{f"no_{name}": base.without(name) for name in FUSIONS}}
        return {
            name: count_layer_ops(model, config, [7, 3])["per_layer"]
            for name, config in configs.items()
        }

    return llm.apply_model(run)[0]


if __name__ == "__main__":
    sys.exit(main())
