"""Runs one in-process vLLM embedding engine with the plugin and saves what the tests check.

    python tests/support/engine_worker.py --model DIR --dtype float32 --out FILE [--emulate]

One process per checkpoint keeps each engine's global state (distributed groups, compile
caches) out of the pytest process. With --emulate the torch_npu emulator is installed before
the engine is built, so the model runs its NPU path; the emulator is then switched off for a
second pass over the same engine (the platform path), and the loaded model is also run
directly on packed batches under each fusion configuration.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model lives in this process

import torch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", required=True)
    parser.add_argument("--texts", required=True, help="JSON list of texts")
    parser.add_argument("--emulate", action="store_true")
    args = parser.parse_args()
    texts = json.loads(args.texts)

    from vllm_npu_ext.testing import torch_npu_emulator as emulator

    if args.emulate:
        emulator.install()
    from vllm import LLM

    llm = LLM(
        model=args.model, runner="pooling", convert="embed", dtype=args.dtype,
        max_model_len=256, gpu_memory_utilization=0.3, seed=0,
    )  # fmt: skip
    results = {
        "model_mro": llm.apply_model(_class_names)[0],
        "batch": _embed(llm, texts),
        "single": torch.cat([_embed(llm, [t]) for t in texts]),
    }
    if args.emulate:
        results["npu_calls"] = dict(emulator.calls)
        emulator.uninstall()
        results["platform"] = _embed(llm, texts)
        emulator.install()
        results["variants"] = _fusion_variants(llm, texts)
        results["op_counts"] = _op_counts(llm, emulator)
    torch.save(results, args.out)


def _class_names(model) -> list[str]:
    return [f"{cls.__module__}.{cls.__name__}" for cls in type(model).__mro__]


def _embed(llm, texts: list[str]) -> torch.Tensor:
    outputs = llm.embed(texts, use_tqdm=False)
    return torch.tensor([o.outputs.embedding for o in outputs])


def _fusion_variants(llm, texts: list[str]) -> dict[str, torch.Tensor]:
    """forward_packed on the loaded model: all fusions, all off, each one off in turn."""
    from vllm_npu_ext.envs import FUSIONS, FusionConfig
    from vllm_npu_ext.ops.packed import PackedSeqs
    from vllm_npu_ext.ops.pooling import last_token_pool

    tokenizer = llm.get_tokenizer()
    token_ids = [tokenizer(t)["input_ids"] for t in texts]
    seqs = PackedSeqs.from_seq_lens([len(ids) for ids in token_ids])
    input_ids = torch.tensor([i for ids in token_ids for i in ids])
    positions = torch.cat([torch.arange(len(ids)) for ids in token_ids])

    def run(model):
        inner = model.model
        base = inner.fusions  # float32 models attend with npu_fusion_attention
        configs = {"all_on": base, "all_off": FusionConfig.all_off()}
        configs.update({f"no_{name}": base.without(name) for name in FUSIONS})
        with torch.no_grad():
            return {
                name: last_token_pool(
                    inner.forward_packed(input_ids, positions, seqs, config),
                    seqs.cu_seqlens_tensor(),
                ).float()
                for name, config in configs.items()
            }

    return llm.apply_model(run)[0]


def _op_counts(llm, emulator) -> dict[str, int]:
    """Device operators per decoder layer (benchmarks/count_ops.py) for each configuration."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from count_ops import count_layer_ops

    from vllm_npu_ext.envs import FUSIONS

    def run(model):
        base = model.model.fusions
        configs = {"all_on": base, **{f"no_{name}": base.without(name) for name in FUSIONS}}
        return {
            name: count_layer_ops(model, config, [7, 3], emulator)["per_layer"]
            for name, config in configs.items()
        }

    return llm.apply_model(run)[0]


if __name__ == "__main__":
    sys.exit(main())
