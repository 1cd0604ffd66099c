#!/usr/bin/env python
"""What computing shared prefixes once costs: host time per step, and the shortest prefix
worth sharing.

    python benchmarks/bench_shared_prefix.py --host        # planning time per step (~10 s)
    python benchmarks/bench_shared_prefix.py --min-len     # 0.6B shapes, one engine (~10 min)

--host: the host work sharing adds to a step of `--batch-sizes` texts of ~20 tokens behind
Qwen3-Embedding's instruction (as vllm-ascend #13021 profiles): the plan
(`find_shared_prefixes`) and the step's indices (unique rows, the map back, the attention
layout and its key rows), the fastest and the median of `--repeats` runs (other work on the
machine only adds), next to a step of unrelated texts (the plan's cost when nothing is
shared).

--min-len: one in-process engine of `--preset` shapes (default 0.6b) embeds 64 texts that
share a prefix of P tokens and add 12 of their own, for each P, with sharing on (min_len 1)
and off (min_len above P) taking turns on the same engine; the ratio per P says from which
prefix length sharing pays on this machine (the engine's platform path: vLLM's CPU kernels).
Output: a markdown table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import log, markdown_table  # noqa: E402


def host_step(ids: np.ndarray, lengths: list[int], min_len: int) -> float:
    """Seconds of the host work of one step (module docstring)."""
    from vllm_npu_ext.ops.packed import PackedSeqs
    from vllm_npu_ext.ops.shared_prefix import find_shared_prefixes

    start = time.perf_counter()
    seqs = PackedSeqs.from_seq_lens(lengths)
    plan = find_shared_prefixes(ids, seqs, min_len)
    if plan is not None:
        for name in ("unique_rows", "original_to_unique", "kv_rows"):
            plan.tensor(name, "cpu", plan.num_unique if name != "original_to_unique" else None)
    return time.perf_counter() - start


def host_times(batch_sizes: list[int], repeats: int, min_len: int) -> list[dict]:
    """Texts as token ids: a 14-token instruction (what Qwen's tokenizer makes of the model
    card's) and 4..10 tokens of their own, ~20 tokens each."""
    rng = np.random.default_rng(0)
    instruction = rng.integers(10, 150_000, 14).tolist()
    rows = []
    for batch in batch_sizes:
        texts = [instruction + rng.integers(10, 150_000, rng.integers(4, 11)).tolist()
                 for _ in range(batch)]  # fmt: skip
        lengths = [len(text) for text in texts]
        ids = np.array([token for text in texts for token in text])
        unrelated = rng.integers(10, 150_000, ids.shape[0])
        shared = [host_step(ids, lengths, min_len) for _ in range(repeats)]
        alone = [host_step(unrelated, lengths, min_len) for _ in range(repeats)]
        rows.append({"batch": batch, "tokens": int(ids.shape[0]),
                     "mean_tokens": round(float(np.mean(lengths)), 1),
                     "shared_ms": 1e3 * min(shared),
                     "shared_median_ms": 1e3 * statistics.median(shared),
                     "nothing_shared_ms": 1e3 * min(alone)})  # fmt: skip
    return rows


def min_len_runs(args) -> list[dict]:
    import os

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from bench_embed import built_model
    from vllm import LLM

    llm = LLM(model=str(args.model or built_model(args.preset)), runner="pooling",
              convert="embed", dtype=args.dtype, max_model_len=1024, seed=0,
              gpu_memory_utilization=0.3)  # fmt: skip
    vocab = llm.llm_engine.vllm_config.model_config.get_vocab_size()
    rng = np.random.default_rng(1)

    def prompts(prefix_len: int):
        prefix = rng.integers(10, vocab, prefix_len).tolist()
        return [{"prompt_token_ids": prefix + rng.integers(10, vocab, args.own).tolist()}
                for _ in range(args.texts)]  # fmt: skip

    def set_min_len(value: int):
        def change(model):
            model.shared_prefixes.min_len = value

        llm.apply_model(change)

    def timed(batch) -> float:
        start = time.perf_counter()
        llm.embed(batch, use_tqdm=False)
        return time.perf_counter() - start

    llm.embed(prompts(8), use_tqdm=False)  # warm-up
    rows = []
    for prefix_len in args.prefix_lengths:
        on, off = [], []
        for repeat in range(args.repeats):
            for sharing in ((True, False) if repeat % 2 == 0 else (False, True)):
                set_min_len(1 if sharing else prefix_len + 1)
                (on if sharing else off).append(timed(prompts(prefix_len)))
        rows.append({"prefix_tokens": prefix_len, "shared_s": statistics.median(on),
                     "whole_s": statistics.median(off),
                     "speedup": statistics.median(off) / statistics.median(on)})  # fmt: skip
        log(f"prefix {prefix_len}: {rows[-1]}")
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", action="store_true", help="planning time per step")
    parser.add_argument("--min-len", action="store_true", help="break-even prefix length")
    parser.add_argument("--batch-sizes", default="64,512")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--model", type=Path)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--own", type=int, default=12, help="own tokens per text")
    parser.add_argument("--prefix-lengths", default="1,2,4,8,16,32")
    args = parser.parse_args(argv)
    args.batch_sizes = [int(v) for v in args.batch_sizes.split(",")]
    args.prefix_lengths = [int(v) for v in args.prefix_lengths.split(",")]
    if not (args.host or args.min_len):
        parser.error("choose --host and/or --min-len")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    summary = {}
    if args.host:
        from vllm_npu_ext import envs

        rows = host_times(args.batch_sizes, args.repeats, envs.SHARED_PREFIX_MIN_TOKENS())
        print(markdown_table(["texts", "tokens", "mean tokens", "host ms, shared (min / median)",
                              "host ms, nothing shared (min)"],
                             [[r["batch"], r["tokens"], r["mean_tokens"],
                               f"{r['shared_ms']:.2f} / {r['shared_median_ms']:.2f}",
                               r["nothing_shared_ms"]] for r in rows]))  # fmt: skip
        summary["host"] = rows
    if args.min_len:
        rows = min_len_runs(args)
        print(markdown_table(["shared prefix tokens", "shared s", "whole s", "speed-up"],
                             [[r["prefix_tokens"], r["shared_s"], r["whole_s"], r["speedup"]]
                              for r in rows]))  # fmt: skip
        summary["min_len"] = rows
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
