"""Count device operators per Qwen3 decoder layer on the NPU path, under the torch_npu emulator.

    python benchmarks/count_ops.py [--model DIR] [--tokens 37,5,120]

Loads the model into an in-process vLLM engine (with the emulator installed, so the model is
built for the NPU path), then runs one decoder layer on a packed batch for: all fusions on,
all off, and each fusion off in turn. Counted: every torch_npu call, plus every other ATen
operator that launches work on activations (views, aliases and bare allocations excluded;
the emulator's own internals excluded). The rotary-table gather happens once per forward
and is reported separately. Last line: one JSON object with the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# Allocations and reshapes that move no data launch no device work.
FREE_OPS = {
    "empty.memory_format", "empty_like.default", "empty_strided.default", "_unsafe_view.default",
}
TARGET_PER_LAYER = 12


class AtenCounter(TorchDispatchMode):
    """Counts ATen ops issued outside emulated torch_npu operators."""

    def __init__(self, emulator):
        super().__init__()
        self.emulator = emulator
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.emulator.inside_operator() and _launches_work(func):
            self.ops[f"aten.{func.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def _launches_work(func) -> bool:
    if func.__name__ in FREE_OPS:
        return False
    return not any(ret.alias_info is not None for ret in func._schema.returns)


def count_layer_ops(model, fusions, tokens: list[int], emulator) -> dict:
    from vllm_npu_ext.ops.packed import PackedSeqs

    inner = model.model
    seqs = PackedSeqs.from_seq_lens(tokens)
    total = seqs.num_tokens
    positions = torch.cat([torch.arange(n) for n in tokens])
    dtype = inner.embed_tokens.weight.dtype
    hidden = torch.randn(total, inner.config.hidden_size, dtype=dtype)
    residual = torch.randn_like(hidden)
    layer = inner.layers[inner.start_layer]
    npu = sys.modules["torch_npu"]

    per_forward = AtenCounter(emulator)
    emulator.reset_counts()
    with torch.no_grad(), per_forward:
        step = inner.npu_step(npu, positions, dtype, seqs, fusions)
    per_layer = AtenCounter(emulator)
    emulator.reset_counts()
    with torch.no_grad(), per_layer:
        layer(positions, hidden, residual, step)
    npu_calls = {f"torch_npu.{k}": v for k, v in emulator.calls.items() if v}
    ops = dict(sorted({**npu_calls, **per_layer.ops}.items()))
    per_forward_ops = sum(per_forward.ops.values())
    return {"per_layer": sum(ops.values()), "ops": ops, "per_forward": per_forward_ops}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint dir (default: a fresh tiny checkpoint)")
    parser.add_argument("--tokens", default="37,5,120", help="sequence lengths of the batch")
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]

    from vllm_npu_ext import emulator
    from vllm_npu_ext.envs import FUSIONS, FusionConfig
    from vllm_npu_ext.tiny_model import make_tiny_model

    model_dir = args.model or str(make_tiny_model(tempfile.mkdtemp(prefix="count_ops_")))
    emulator.install()
    from vllm import LLM

    llm = LLM(model=model_dir, runner="pooling", convert="embed", dtype="bfloat16",
              max_model_len=512, gpu_memory_utilization=0.3)  # fmt: skip

    def run(model):
        # The model's own fusions: its attention operator is the one its shapes allow.
        base = model.model.fusions
        configs = {"all_on": base, "all_off": FusionConfig.all_off()}
        configs.update({f"no_{name}": base.without(name) for name in FUSIONS})
        return {name: count_layer_ops(model, c, tokens, emulator) for name, c in configs.items()}

    results = llm.apply_model(run)[0]
    _print_table(results)
    summary = {name: r["per_layer"] for name, r in results.items()}
    summary["per_forward_all_on"] = results["all_on"]["per_forward"]
    summary["target_all_on"] = TARGET_PER_LAYER
    summary["meets_target"] = results["all_on"]["per_layer"] <= TARGET_PER_LAYER
    print(json.dumps(summary))
    return 0


def _print_table(results: dict) -> None:
    print("| configuration | ops per decoder layer | per forward (rotary tables) |")
    print("|---|---:|---:|")
    for name, result in results.items():
        print(f"| {name} | {result['per_layer']} | {result['per_forward']} |")
    for name in ("all_on", "all_off"):
        print(f"\n{name}: " + ", ".join(f"{op} x{n}" for op, n in results[name]["ops"].items()))


if __name__ == "__main__":
    sys.exit(main())
