"""One in-process vLLM engine on vllm-ascend's NPUPlatform, NPUWorker and NPUModelRunner under
the torch_npu stand-in (host-backed `npu` device); writes what the tests check as JSON.

    VLLM_NPU_EXT_EMULATE=1 PYTHONPATH=<vllm-ascend site>:tests \\
        python benchmarks/_vllm_ascend_engine.py --model DIR --out FILE --texts JSON [--stock] \\
        [--engine-args JSON]

`--stock` is stock vllm-ascend: our general plugin (the model) left out of VLLM_PLUGINS, our
platform plugin kept (it only installs the stand-in here). Results: the worker's, runner's and
model's classes, the device of the model's parameters, the KV cache as the runner allocated it
(bytes of `runner.kv_caches` tensors, and the device allocator's bytes), the embeddings, and the
device operators the first decoder layer ran for one text (op_counter.py's counter), with the
torch_npu stand-in's operator calls of that forward; the texts embedded again one per step
(other sequence boundaries and padded sizes); and, in graph mode (`--engine-args
'{"enforce_eager": false}'`), the NPU graphs vllm-ascend's ACLGraphWrapper captured and replayed
on the stand-in's `NPUGraph`, the operators they recorded, and the operators the host ran
between replays.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
OUR_PLUGIN = "vllm_npu_ext"
# Stock vllm-ascend's attention takes half-precision KV only: ATB ReshapeAndCache writes
# float16/bfloat16/int8 caches (CANN ATB API reference, ReshapeAndCacheOperation;
# attention/attention_v1.py:1444), and its prefill FIA call in TND layout takes bfloat16 with
# head_dim 128 (torch-npu 2.10.0.post4 docs, emulator/operators/attention.py). The side-by-side
# runs use a tiny checkpoint of those shapes, served in bfloat16, for both sides.
STOCK_CHECKPOINT = {"head_dim": 128, "torch_dtype": "bfloat16"}
STOCK_ENGINE_ARGS = {"dtype": "bfloat16"}
# vllm-ascend 0.23.0.post1's entry points (its dist-info), and our platform plugin.
STOCK_PLUGINS = ("vllm_npu_ext_bootstrap,ascend,ascend_kv_connector,ascend_model,"
                 "ascend_model_loader,ascend_service_profiling")  # fmt: skip


def _tensor_bytes(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(item) for item in value)
    return 0


def _layer_ops(model, run) -> dict[str, int]:
    """The device operators of the first decoder layer's forward during `run()`, counted by
    benchmarks/op_counter.py's counter (views and bare allocations excluded; a torch_npu
    operator is one operator)."""
    sys.path.insert(0, str(BENCHMARKS))
    from op_counter import OpCounter

    counter = OpCounter()
    layer = model.model.layers[model.model.start_layer]

    def enter(module, args) -> None:  # a pre-hook's return value would replace the arguments
        counter.__enter__()

    def leave(module, args, output) -> None:
        counter.__exit__(None, None, None)

    entered = layer.register_forward_pre_hook(enter)
    left = layer.register_forward_hook(leave)
    try:
        run()
    finally:
        entered.remove()
        left.remove()
    return dict(sorted(counter.ops.items()))


def _forward_ops(run) -> dict:
    """Device operators the host dispatched during `run()` (op_counter.py's counter) and the
    NPU graphs replayed meanwhile: in graph mode, the eager operators between replays (a
    replay is one launch; its operators are not the host's)."""
    sys.path.insert(0, str(BENCHMARKS))
    from op_counter import OpCounter

    from vllm_npu_ext.emulator.device import graphs

    replays = graphs.stats["replays"]
    with OpCounter() as counter:
        run()
    return {"ops": dict(sorted(counter.ops.items())),
            "graph_replays": graphs.stats["replays"] - replays}  # fmt: skip


def _per_layer(counts: dict[str, int], layers: int, names) -> dict[str, float]:
    return {name: count / layers for name, count in sorted(counts.items()) if name in names}


# The operators count_ops.py counts as device operators (aten's are the host's glue): torch_npu's,
# ours, vllm-ascend's operator library's, vLLM's and vllm-ascend's custom ops (one each: stock's
# `vllm.unified_attention_with_output` holds its ReshapeAndCache and FIA launches) and the
# stand-in's Triton kernels (one launch each).
DEVICE_OPS = ("torch_npu.", "vllm_npu_ext.", "_C_ascend.", "vllm.", "triton_kernel.")


def graph_entry(results: dict) -> dict:
    """A model under vllm-ascend's ACL graphs (piecewise): per decoder layer, the device
    operators the host ran eagerly between graph replays (op_counter.py's counter), and those
    recorded in each captured graph set (one capture size: the captures' operators divided by
    the number of capture sizes). Operators that run once per forward (the final norm, the
    embedding's reduce, the slot mapping) show as 1 / layers."""
    layers, graphs = results["layers"], results["graphs"]
    pieces = results["forward"]["graph_replays"]
    sizes = graphs["captures"] // pieces
    eager = {name: count for name, count in results["forward"]["ops"].items()
             if name.startswith(DEVICE_OPS)}  # fmt: skip
    captured = {}
    for name, count in results["captured_operators"].items():  # "npu.npu_rms_norm.default"
        namespace, op = name.split(".")[:2]
        label = ("torch_npu" if namespace == "npu" else namespace) + "." + op
        if label.startswith(DEVICE_OPS):
            captured[label] = captured.get(label, 0) + count // sizes
    return {"capture_sizes": sizes, "graph_replays_per_forward": pieces,
            "eager_between_replays_per_layer": _per_layer(eager, layers, eager),
            "captured_per_layer": _per_layer(captured, layers, captured),
            "kv_cache_tensor_bytes": results["kv_cache_tensor_bytes"]}  # fmt: skip


def entry(returncode: int, results: dict | None, log: str) -> dict:
    """One side's entry from this script: its operators per decoder layer, or where
    it stopped (the last exception line of its log)."""
    if returncode == 0 and results is not None and results["graphs"].get("captures"):
        return graph_entry(results)
    if returncode == 0 and results is not None:
        ops = results["ops_per_layer"]
        return {"per_layer": sum(ops.values()), "ops": ops, "model": results["model"],
                "kv_cache_tensor_bytes": results["kv_cache_tensor_bytes"]}  # fmt: skip
    errors = [line for line in log.splitlines() if "Error:" in line]
    return {"blocked": errors[-1].strip() if errors else f"exit code {returncode}"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--texts", required=True)
    parser.add_argument("--stock", action="store_true")
    parser.add_argument("--engine-args", default="{}")
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.stock:
        os.environ["VLLM_PLUGINS"] = STOCK_PLUGINS
    texts = json.loads(args.texts)

    import torch
    from vllm import LLM

    from vllm_npu_ext.emulator.device import graphs, host_npu
    from vllm_npu_ext.emulator.runtime import registry as _runtime

    engine_args = dict(runner="pooling", convert="embed", dtype="float32", max_model_len=128,
                       enforce_eager=True, kv_cache_memory_bytes=16 << 20)  # fmt: skip
    engine_args.update(json.loads(args.engine_args))
    llm = LLM(args.model, **engine_args)
    worker = llm.llm_engine.model_executor.driver_worker.worker
    runner = worker.model_runner
    model = runner.get_model()
    parameters = {str(p.device) for p in model.parameters()}
    embeddings = [o.outputs.embedding for o in llm.embed(texts)]
    # The same texts one request per step: other sequence boundaries, other padded sizes.
    one_by_one = [llm.embed([text])[0].outputs.embedding for text in texts]

    layers = llm.llm_engine.vllm_config.model_config.hf_config.num_hidden_layers
    _runtime.reset_counts()
    # Eager: a decoder layer's forward hooks see its operators. Compiled (graph mode), the
    # layers are not Python modules that run: the whole forward is counted instead.
    per_layer = _layer_ops(model, lambda: llm.embed(texts[:1]))
    forward = _forward_ops(lambda: llm.embed(texts[:1]))
    results = {
        "worker": type(worker).__module__ + "." + type(worker).__qualname__,
        "runner": type(runner).__module__ + "." + type(runner).__qualname__,
        "model": type(model).__module__ + "." + type(model).__qualname__,
        # The class under vLLM's pooling adapter: vLLM's Qwen3 (stock) or ours.
        "model_base": next(f"{cls.__module__}.{cls.__qualname__}" for cls in type(model).__mro__
                           if not cls.__module__.endswith(".adapters")),  # fmt: skip
        "device": str(runner.device), "parameter_devices": sorted(parameters),
        "kv_cache_tensor_bytes": _tensor_bytes(getattr(runner, "kv_caches", [])),
        "kv_cache_groups": len(runner.kv_cache_config.kv_cache_groups),
        "device_allocated_bytes": host_npu.memory_figures().allocated_bytes,
        "embeddings": embeddings, "embeddings_one_by_one": one_by_one,
        "ops_per_layer": per_layer, "forward": forward, "graphs": dict(graphs.stats),
        "captured_operators": dict(sorted(graphs.captured_operators.items())),
        "cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode),
        "emulated_calls": dict(_runtime.calls), "layers": layers,
        "dtype": str(next(model.parameters()).dtype), "torch_npu_is_stand_in":
        getattr(__import__("torch_npu"), "__vllm_npu_ext_emulator__", False),
        "npu_tensors": torch.npu.memory_allocated() > 0,
    }  # fmt: skip
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(results, file)


if __name__ == "__main__":
    main()
