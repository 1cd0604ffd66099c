"""Greedy generation on one in-process vLLM engine, in its own process.

    python tests/support/generation_worker.py --model DIR --out FILE --prompts JSON \\
        [--max-tokens 32] [--emulate | --compile]

`--prompts` is a JSON list of token-id lists. The caller's environment decides which plugins
load (`VLLM_PLUGINS`) and whether generation gets our class (`VLLM_NPU_EXT_GENERATION`).
With --emulate the torch_npu emulator goes in before vLLM is imported, so a model of ours
takes the NPU path; --compile runs vLLM's torch.compile (otherwise the engine is eager).
Saved (torch.save, a dict): `tokens` (generated token ids per prompt), `model_classes` (the
model's MRO), `registered` (whether our plugin's `register()` ran in this process) and
`fused_calls` (calls of each torch_npu operator during generation; empty unless emulated).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from server import KV_CACHE_BYTES  # this script's directory, tests/support, is on sys.path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", required=True, help="JSON list of token-id lists")
    parser.add_argument("--max-tokens", type=int, default=32)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--emulate", action="store_true")
    mode.add_argument("--compile", action="store_true")
    args = parser.parse_args()

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if not args.compile:
        # An eager engine compiles nothing of the model, but vLLM 0.23's CPU sampler compiles
        # its `compiled_random_sample` (`@torch.compile`, vllm/v1/sample/ops/topk_topp_sampler.py,
        # `TopKTopPSampler.forward_cpu`) in the warm-up's dummy sampler run: 55 s of Inductor
        # and g++ per engine on 2 cores, for a CPU-only helper greedy decoding never calls
        # (vllm-ascend samples with its own sampler). Without torch.compile it runs eagerly.
        os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    if args.emulate:
        from vllm_npu_ext import emulator

        emulator.install()
    from vllm import LLM, SamplingParams

    from vllm_npu_ext.selfcheck import engine_probe

    llm = LLM(
        model=args.model, runner="generate", dtype="float32", max_model_len=256, seed=0,
        enforce_eager=not args.compile, kv_cache_memory_bytes=KV_CACHE_BYTES,
    )  # fmt: skip
    counter = engine_probe.fused_call_counter(sys.modules["torch_npu"] if args.emulate else None)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    prompts = [{"prompt_token_ids": ids} for ids in json.loads(args.prompts)]
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    plugin = sys.modules.get("vllm_npu_ext")
    torch.save(
        {
            "tokens": [list(o.outputs[0].token_ids) for o in outputs],
            "model_classes": llm.apply_model(engine_probe.class_names)[0],
            "registered": getattr(plugin, "_registered_in_pid", None) == os.getpid(),
            "fused_calls": dict(counter.counts),
        },
        args.out,
    )


if __name__ == "__main__":
    sys.exit(main())
