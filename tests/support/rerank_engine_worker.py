"""Runs one in-process vLLM reranker engine with the plugin and saves what the tests check.

    python tests/support/rerank_engine_worker.py --model DIR --out FILE --cases JSON

The engine is built as `vllm-npu-ext serve --reranker` builds it (`reranker.HF_OVERRIDES`,
float32) with the torch_npu emulator installed, so our model takes the NPU path. Every case
({"query", "documents", "instruction"}) is scored with `LLM.score` and our template on the
emulated NPU path, then, with the emulator switched off, on the platform path of the same
engine. A case's instruction goes in per request (`chat_template_kwargs`).

Saved (torch.save, a dict): `model_classes`, `npu_path` (`engine_probe.npu_path_info`:
active, fusions, attention operator), `fused_calls` (fused torch_npu operator calls during the
emulated scoring), `config`
(architecture, convert type, num_labels, prefix caching, chunked prefill) and `scores`:
{"emulated": [[float]] per case, "platform": [[float]] per case}.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from vllm_npu_ext import reranker
from vllm_npu_ext.selfcheck import engine_probe


def score_cases(llm, cases: list[dict]) -> list[list[float]]:
    from vllm import PoolingParams

    template = reranker.template_text()
    scores = []
    for case in cases:
        params = None
        if case.get("instruction") is not None:
            kwargs = {"chat_template_kwargs": {"instruction": case["instruction"]}}
            params = PoolingParams(extra_kwargs=kwargs)
        outputs = llm.score(
            case["query"], case["documents"], chat_template=template, pooling_params=params,
            use_tqdm=False,
        )  # fmt: skip
        scores.append([output.outputs.score for output in outputs])
    return scores


def engine_config(llm) -> dict:
    config = llm.llm_engine.vllm_config
    return {
        "architecture": config.model_config.architecture,
        "convert_type": config.model_config.convert_type,
        "num_labels": config.model_config.hf_config.num_labels,
        "prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cases", required=True, help="JSON list of cases")
    args = parser.parse_args()
    cases = json.loads(args.cases)

    llm = engine_probe.build_llm(
        args.model, "float32", True, convert="auto", hf_overrides=reranker.HF_OVERRIDES
    )
    from vllm_npu_ext import emulator

    counter = engine_probe.fused_call_counter(emulator)
    results = {
        "model_classes": llm.apply_model(engine_probe.class_names)[0],
        "npu_path": llm.apply_model(engine_probe.npu_path_info)[0],
        "config": engine_config(llm),
        "scores": {"emulated": score_cases(llm, cases)},
        "fused_calls": dict(counter.counts),
    }
    emulator.uninstall()
    results["scores"]["platform"] = score_cases(llm, cases)
    torch.save(results, args.out)


if __name__ == "__main__":
    sys.exit(main())
