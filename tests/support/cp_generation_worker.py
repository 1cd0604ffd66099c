"""Greedy generation on one vLLM 0.23 engine on vllm-ascend's NPUPlatform under the torch_npu
stand-in, with or without context parallelism; writes what the CP decode tests check as JSON.

    VLLM_NPU_EXT_EMULATE=1 PYTHONPATH=<vllm-ascend site>:tests \\
        python tests/support/cp_generation_worker.py --model DIR --out FILE \\
        --prompts JSON --max-tokens N [--engine-args JSON] [--stock] [--merges ours,vllm-ascend]

`--prompts` is a JSON list of token-id lists. `--force-token ID` makes every generated token
`ID` (vLLM's `allowed_token_ids`, applied after the raw logprobs are taken: the logprobs
returned are the model's), so that a run and its baseline decode the same tokens whatever
their greedy margins (`support/cp_decode.py`). `--engine-args` go to `vllm.LLM` over the common
ones below (`tensor_parallel_size`, `decode_context_parallel_size`,
`prefill_context_parallel_size`, `enforce_eager`, `compilation_config`). `--stock` leaves our
general plugin out of VLLM_PLUGINS (stock vllm-ascend). `--rounds 2` generates the prompts a
second time after each merge's first (results `<merge>, again`: prefix-cache hits; each run
records its requests' cached tokens). `--merges`: with CP, the prompts are generated once per
merge, in this order, in the same engine: `ours` (the patch, our CANN
operator standing in for the built extension), `vllm-ascend` (the patch undone in every
worker: vllm-ascend's own pair). Results per run: token ids and, per step, the chosen
token's logprob and the top two; what each worker's probes counted (`cp_worker_extension`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# The baselines' and eager runs' settings (the engines at vLLM's defaults override them):
# the ascend block size, every token to its own rank in turn, whole prompts prefilled in one
# step, no prefix caching, eager.
COMMON_ENGINE_ARGS = dict(
    runner="generate", dtype="bfloat16", block_size=128, cp_kv_cache_interleave_size=1,
    enable_prefix_caching=False, enable_chunked_prefill=False, max_model_len=4096,
    max_num_batched_tokens=4096, max_num_seqs=4, kv_cache_memory_bytes=64 << 20, seed=0,
    enforce_eager=True, worker_extension_cls="support.cp_worker_extension.CPProbe",
)  # fmt: skip
OUR_PLUGIN = "vllm_npu_ext"


def _logprobs(output) -> list[dict]:
    """Per generated token: its logprob and the two best (token id, logprob)."""
    steps = []
    for token, ranked in zip(output.token_ids, output.logprobs, strict=True):
        best = sorted(ranked.items(), key=lambda item: item[1].rank)[:2]
        steps.append({"logprob": ranked[token].logprob,
                      "top": [[tid, lp.logprob] for tid, lp in best]})  # fmt: skip
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--engine-args", default="{}")
    parser.add_argument("--stock", action="store_true")
    parser.add_argument("--merges", default="ours")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--force-token", type=int, default=None)
    args = parser.parse_args()
    if args.stock:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
        from _vllm_ascend_engine import STOCK_PLUGINS

        os.environ["VLLM_PLUGINS"] = STOCK_PLUGINS

    from vllm import LLM, SamplingParams

    started = time.monotonic()
    llm = LLM(args.model, **{**COMMON_ENGINE_ARGS, **json.loads(args.engine_args)})
    config = llm.llm_engine.vllm_config
    results = {"start_s": time.monotonic() - started, "runs": {},
               "cudagraph_mode": str(config.compilation_config.cudagraph_mode),
               "async_scheduling": bool(config.scheduler_config.async_scheduling),
               "layers": config.model_config.hf_config.num_hidden_layers}  # fmt: skip
    cp = config.parallel_config.decode_context_parallel_size > 1 or (
        config.parallel_config.prefill_context_parallel_size > 1)
    forced = None if args.force_token is None else [args.force_token]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=2,
                            ignore_eos=True, allowed_token_ids=forced)  # fmt: skip
    prompts = [{"prompt_token_ids": ids} for ids in json.loads(args.prompts)]
    for merge in args.merges.split(",") if cp else ["none"]:
        results["installed"] = llm.collective_rpc("cp_probe_install", args=(merge == "ours",))
        if cp:
            llm.collective_rpc("cp_set_patch", args=(merge == "ours",))
        for round_ in range(args.rounds):
            llm.collective_rpc("cp_probe_reset")
            began = time.monotonic()
            outputs = llm.generate(prompts, greedy, use_tqdm=False)
            results["runs"][merge if round_ == 0 else f"{merge}, again"] = {
                "generate_s": time.monotonic() - began,
                "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                "logprobs": [_logprobs(o.outputs[0]) for o in outputs],
                "cached_tokens": [o.num_cached_tokens for o in outputs],  # prefix-cache hits
                "workers": llm.collective_rpc("cp_probe_counts"),
            }
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main()
