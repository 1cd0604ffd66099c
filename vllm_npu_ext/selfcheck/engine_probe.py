"""One vLLM embedding engine with the plugin, in its own process; saves what selfcheck compares.

    python -m vllm_npu_ext.selfcheck.engine_probe --model DIR --dtype auto --out FILE \\
        --texts '["a", "b"]' [--emulate] [--compiled]

A fresh process per checkpoint keeps each engine's global state (distributed groups,
device memory) apart. The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`)
so `LLM.apply_model` reaches the model object. With --emulate the torch_npu emulator is
installed before vLLM is imported, so the model is built for the NPU path on the CPU.

Saved (torch.save, a dict): `model_classes` (the model's MRO), `npu_path` (whether the NPU
path is active, its fusions, device and dtype), `batch` and `single` (embeddings of all texts
in one call and of each text alone, float32 CPU `[B, H]`), `variants` (forward_packed
last-token embeddings per fusion configuration: all_on, all_off, no_<fusion>; on an
exception `variants_error` says why),
`fused_calls` (calls of each fused torch_npu operator during the batch embed), `kv_cache`
(`kv_cache_figures` summed over the workers) and `graph` (`graph_figures`: the model's graph
mode and, in one graph per forward, the replays updated for the batch and in all).

The engine runs eagerly (`--enforce-eager`) so that the fused-call counts see every call a
Python forward makes. `--compiled` instead runs vLLM's default graph mode (on Ascend:
piecewise ACL graphs, or one graph per forward with attention inside) and saves `batch`,
`single`, `graph` and what torch.compile did (`compile`: graph breaks and their reasons,
graphs compiled).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
from collections.abc import Sequence

import torch

MAX_MODEL_LEN = 512
EMULATED_MEMORY_UTILIZATION = 0.3  # CPU: vLLM checks this fraction of host memory is free
# Fusion -> the torch_npu operator it calls (attention: npu_<attention_op>; rotary and the q/k
# norms: by the model's q/k path, QK_PATH_OPERATORS).
FUSED_OPERATORS = {
    "rms_norm": "npu_rms_norm",
    "add_rms_norm": "npu_add_rms_norm",
    "swiglu": "npu_swiglu",
    "grouped_qkv": "npu_grouped_matmul",
    "linear": "npu_linear",
}
# The model's q/k path (`NpuPlan.qk_path`) -> the torch_npu operator it adds; vllm-ascend's
# `vllm.qkv_rmsnorm_rope` is not a torch_npu operator and is not counted here.
QK_PATH_OPERATORS = {"mrope": "npu_mrope", "rotary_mul": "npu_rotary_mul"}
ATTENTION_OPERATORS = ("npu_fused_infer_attention_score", "npu_fusion_attention")


class CallCounter:
    """Counts calls of a module's operators by wrapping them (this throwaway process only):
    evidence that the engine's forward really reached each fused operator."""

    def __init__(self, module, names) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        for name in names:
            function = getattr(module, name, None)
            if function is not None:
                setattr(module, name, self._counting(name, function))

    def _counting(self, name, function):
        @functools.wraps(function)
        def counted(*args, **kwargs):
            self.counts[name] += 1
            return function(*args, **kwargs)

        # Calls of a named overload (`npu_fused_infer_attention_score.out`) count too.
        for overload in ("default", "out"):
            target = getattr(function, overload, None)
            if callable(target):
                setattr(counted, overload, self._counting(name, target))
        return counted


def class_names(model) -> list[str]:
    return [f"{cls.__module__}.{cls.__name__}" for cls in type(model).__mro__]


def kv_cache_figures(worker) -> dict[str, int]:
    """One worker's KV cache (`LLM.collective_rpc(kv_cache_figures)`).

    `planned_bytes` and `num_blocks` are vLLM's own plan (`model_runner.kv_cache_config`);
    `allocated_bytes` counts the tensors the runner holds (storage shared between layers
    counted once). A cache-free pooling engine plans and allocates 0 bytes (vLLM 0.32 still
    reports one nominal block, backed by no tensor).
    """
    runner = worker.model_runner
    config = getattr(runner, "kv_cache_config", None)
    storages = {}
    for tensor in _tensors(getattr(runner, "kv_caches", ())):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return {
        "planned_bytes": sum(t.size for t in config.kv_cache_tensors) if config else 0,
        "num_blocks": config.num_blocks if config else 0,
        "allocated_bytes": sum(storages.values()),
    }


def _tensors(value):
    if hasattr(value, "untyped_storage"):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def npu_path_info(model) -> dict:
    inner = getattr(model, "model", None)
    parameter = next(model.parameters())
    plan = getattr(inner, "plan", None)  # `layers.npu_plan.NpuPlan`; vLLM's Qwen3 has none
    return {
        "active": bool(getattr(inner, "npu_possible", False)),
        "forward_packed": hasattr(inner, "forward_packed"),
        "fusions": plan.fusions.active() if plan is not None else [],
        "attention_op": plan.fusions.attention_op if plan is not None else None,
        "qk_path": plan.qk_path if plan is not None else None,
        "device": str(parameter.device),
        "dtype": str(parameter.dtype).removeprefix("torch."),
    }


def full_graph_state(model) -> dict:
    """The model's graph mode (`Qwen3ForCausalLM.graph_mode`: none, piecewise or full) and, in
    one graph per forward, what `layers/cache_free/full_graph.py` counted so far."""
    state = getattr(getattr(model, "model", None), "full_graph", None)
    figures = {"mode": getattr(model, "graph_mode", "none"), "captured_sizes": [],
               "updates": 0, "update_calls": 0, "widest_update": []}  # fmt: skip
    if state is not None:
        figures.update(captured_sizes=sorted(state.captured), updates=state.updates,
                       update_calls=state.update_calls, widest_update=list(state.widest_update))
    return figures


def graph_figures(llm, texts: Sequence[str]) -> tuple[torch.Tensor, dict]:
    """The batch embedding of `texts` (one forward where it fits a capture size) and
    `full_graph_state` after it, with `batch_updates`: the replays updated for that forward
    (one per replay in one graph per forward; a replay not updated would never finish on the
    device)."""
    before = llm.apply_model(full_graph_state)[0]
    batch = embed(llm, texts)
    after = llm.apply_model(full_graph_state)[0]
    return batch, {**after, "batch_updates": after["updates"] - before["updates"]}


def embed(llm, texts: Sequence[str]) -> torch.Tensor:
    outputs = llm.embed(list(texts), use_tqdm=False)
    return torch.tensor([o.outputs.embedding for o in outputs], dtype=torch.float32)


def fusion_variants(llm, texts: Sequence[str]) -> dict[str, torch.Tensor]:
    """forward_packed on the loaded model: all fusions, all off, each one off in turn."""
    from vllm_npu_ext.envs import FUSIONS
    from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
    from vllm_npu_ext.ops.packed import PackedSeqs
    from vllm_npu_ext.ops.pooling import last_token_pool

    tokenizer = llm.get_tokenizer()
    token_ids = [tokenizer(text)["input_ids"] for text in texts]
    seqs = PackedSeqs.from_seq_lens([len(ids) for ids in token_ids])

    def run(model) -> dict[str, torch.Tensor]:
        inner = model.model
        device = inner.embed_tokens.weight.device
        input_ids = torch.tensor([i for ids in token_ids for i in ids], device=device)
        positions = torch.cat([torch.arange(len(ids)) for ids in token_ids]).to(device)
        fusions = inner.plan.fusions
        configs = {"all_on": fusions, "all_off": FusionConfig.all_off()}
        configs.update({f"no_{name}": fusions.without(name) for name in FUSIONS})
        cu_seqlens = seqs.cu_seqlens_tensor(device)
        with torch.no_grad():
            return {
                name: last_token_pool(
                    inner.forward_packed(input_ids, positions, seqs, config), cu_seqlens
                )
                .float()
                .cpu()
                for name, config in configs.items()
            }

    return llm.apply_model(run)[0]


def fused_call_counter(module) -> CallCounter:
    """Counts the calls of every fused operator (and both attention operators) of `module`
    (torch_npu or its emulator; None counts nothing) from now on."""
    names = [*FUSED_OPERATORS.values(), *QK_PATH_OPERATORS.values(), *ATTENTION_OPERATORS]
    return CallCounter(module, names)


def _count_fused_calls(emulate: bool) -> CallCounter:
    from vllm_npu_ext.ops import dispatch

    # Not torch.device("npu"): without torch_npu (a CPU host) no such device type exists.
    module = dispatch.emulator() if emulate else dispatch.real_torch_npu()
    return fused_call_counter(module)


def build_llm(model: str, dtype: str, emulate: bool, compiled: bool = False, **engine_args):
    """An in-process pooling engine; emulated: the emulator goes in before vLLM is imported.

    Eager by default (`enforce_eager`): `CallCounter` sees only the calls a Python forward
    makes, and the tests switch one engine between paths. `compiled`: vLLM's default graph
    mode, traced in this process (compile cache off), so `compile_counters()` describes it.
    `engine_args` override the defaults given to `vllm.LLM`."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if compiled:
        os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    if emulate:
        from vllm_npu_ext import emulator

        emulator.install()
    from vllm import LLM

    args = dict(
        model=model, runner="pooling", convert="embed", dtype=dtype,
        max_model_len=MAX_MODEL_LEN, seed=0, enforce_eager=not compiled,
    )  # fmt: skip
    if emulate:
        args["gpu_memory_utilization"] = EMULATED_MEMORY_UTILIZATION
    return LLM(**{**args, **engine_args})


def probe(llm, texts: Sequence[str], emulate: bool, variants: bool = True) -> dict:
    """Everything the module docstring lists, for `texts` on the loaded engine
    (`variants` False: no forward_packed runs)."""
    npu_path = llm.apply_model(npu_path_info)[0]
    counter = _count_fused_calls(emulate)
    batch, graph = graph_figures(llm, texts)
    results = {
        "model_classes": llm.apply_model(class_names)[0],
        "npu_path": npu_path,
        "fused_calls": dict(counter.counts),  # during the batch embed only
        "batch": batch,
        "single": torch.cat([embed(llm, [text]) for text in texts]),
        "variants": {},
        "variants_error": None,
        "kv_cache": _summed(llm.collective_rpc(kv_cache_figures)),
        "graph": graph,
    }
    if variants and npu_path["active"] and npu_path["forward_packed"]:
        try:
            results["variants"] = fusion_variants(llm, texts)
        except Exception as error:  # keep the engine's results; report this one apart
            results["variants_error"] = f"{type(error).__name__}: {error}"[:500]
    return results


def compile_counters() -> dict:
    """What torch.compile did in this process (the engine core runs here): graph breaks with
    their reasons, graphs compiled (a recompilation adds one), operator calls captured."""
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "break_reasons": sorted(counters["graph_break"]),
        "unique_graphs": counters["stats"]["unique_graphs"],
        "calls_captured": counters["stats"]["calls_captured"],
    }


def probe_compiled(llm, texts: Sequence[str]) -> dict:
    """Compiled engine: `batch` and `single` embeddings (one batch shape per text, plus the
    batch), `graph_figures` and `compile_counters()` after all of them."""
    batch, graph = graph_figures(llm, texts)
    single = torch.cat([embed(llm, [text]) for text in texts])
    graph["updates"] = llm.apply_model(full_graph_state)[0]["updates"]
    return {"batch": batch, "single": single, "graph": graph, "compile": compile_counters()}


def _summed(per_worker: list[dict[str, int]]) -> dict[str, int]:
    return {key: sum(figures[key] for figures in per_worker) for key in per_worker[0]}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_npu_ext.selfcheck.engine_probe")
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", required=True)
    parser.add_argument("--texts", required=True, help="JSON list of texts")
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--compiled", action="store_true", help="vLLM's default graph mode")
    args = parser.parse_args(argv)
    llm = build_llm(args.model, args.dtype, args.emulate, compiled=args.compiled)
    texts = json.loads(args.texts)
    results = probe_compiled(llm, texts) if args.compiled else probe(llm, texts, args.emulate)
    torch.save(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
