"""Runs one in-process engine with the plugin on shared-prefix steps and saves what the tests
check (tests/model_executor/test_shared_prefix.py).

    python tests/support/shared_prefix_worker.py --model DIR --dtype float32 --out FILE \\
        [--emulate] [--compiled] [--rerank]

Embedding engines: the prompts of `shared_prefix_cases.case_prompts` in one step (`batch`),
each alone (`alone`, one request per step: nothing shared), what sharing counted for the batch
(`stats`: tokens of the step and tokens computed), and the batch under each of
`shared_prefix_cases.MUTATIONS` (`mutations`). With --emulate all of it first on the NPU path
(the torch_npu stand-in), then on the platform path of the same engine, under "npu" and
"platform". --compiled: vLLM compiles the model (the NPU path, emulated).
Rerank engines (--rerank, the tiny Qwen3-Reranker served as `--reranker` serves it): one query
scored against several documents in one step and one document per step.
"""

from __future__ import annotations

import argparse
import sys

import torch
from shared_prefix_cases import MUTATIONS, RERANK_PROMPT, case_prompts

from vllm_npu_ext.selfcheck import engine_probe

RERANK_QUERY = "which river flows through Paris and into the sea at Le Havre?"
RERANK_DOCUMENTS = [
    "The Seine.",
    "The Seine flows through Paris and on to the sea at Le Havre, past Rouen.",
    "Berlin lies on the Spree.",
    "The Seine.",
    RERANK_PROMPT,
]


def _stats(llm) -> dict:
    def stats(model):
        sharing = model.shared_prefixes
        return None if sharing is None else dict(vars(sharing.stats))

    return llm.apply_model(stats)[0]


def _embed(llm, prompts) -> torch.Tensor:
    outputs = llm.embed([{"prompt_token_ids": ids} for ids in prompts], use_tqdm=False)
    return torch.tensor([o.outputs.embedding for o in outputs], dtype=torch.float32)


def _delta(before: dict | None, after: dict | None) -> dict | None:
    if before is None or after is None:
        return None
    return {name: after[name] - before[name] for name in ("shared_steps", "tokens",
                                                           "computed_tokens")}  # fmt: skip


def embedding_run(llm) -> dict:
    """The cases on the engine's current path (module docstring)."""
    from shared_prefix_cases import mutation

    prompts = case_prompts(llm.get_tokenizer())
    before = _stats(llm)
    batch = _embed(llm, prompts)
    stats = _delta(before, _stats(llm))
    alone = torch.cat([_embed(llm, [ids]) for ids in prompts])
    mutated = {}
    for name in MUTATIONS:
        with mutation(name):
            mutated[name] = _embed(llm, prompts)
    return {"batch": batch, "alone": alone, "stats": stats, "mutations": mutated,
            "prompts": prompts}  # fmt: skip


def rerank_run(llm) -> dict:
    from vllm_npu_ext import reranker

    template = reranker.template_text()

    def scores(documents):
        outputs = llm.score(RERANK_QUERY, documents, chat_template=template, use_tqdm=False)
        return [o.outputs.score for o in outputs]

    before = _stats(llm)
    batch = scores(RERANK_DOCUMENTS)
    stats = _delta(before, _stats(llm))
    alone = [scores([document])[0] for document in RERANK_DOCUMENTS]
    return {"batch": batch, "alone": alone, "stats": stats}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", required=True)
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--compiled", action="store_true")
    parser.add_argument("--rerank", action="store_true")
    args = parser.parse_args()
    engine_args = {"max_model_len": 256, "gpu_memory_utilization": 0.1}
    if args.rerank:
        from vllm_npu_ext import reranker

        engine_args.update(convert="auto", hf_overrides=reranker.HF_OVERRIDES)
    llm = engine_probe.build_llm(args.model, args.dtype, args.emulate, compiled=args.compiled,
                                 **engine_args)  # fmt: skip
    run = rerank_run if args.rerank else embedding_run
    results = {"first": "npu" if args.emulate else "platform"}
    results[results["first"]] = run(llm)
    if args.emulate and not args.compiled:
        from vllm_npu_ext import emulator

        emulator.uninstall()
        results["platform"] = run(llm)
        emulator.install()
    results["min_len"] = llm.apply_model(
        lambda model: model.shared_prefixes and model.shared_prefixes.min_len)[0]
    results["graph_mode"] = llm.apply_model(lambda model: model.graph_mode)[0]
    torch.save(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
