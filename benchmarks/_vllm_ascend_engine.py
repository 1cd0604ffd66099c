"""One in-process vLLM engine on vllm-ascend's NPUPlatform, NPUWorker and NPUModelRunner under
the torch_npu stand-in (host-backed `npu` device); writes what the tests check as JSON.

    VLLM_NPU_EXT_EMULATE=1 PYTHONPATH=<vllm-ascend site>:tests \\
        python benchmarks/_vllm_ascend_engine.py --model DIR --out FILE --texts JSON [--stock] \\
        [--engine-args JSON] [--rerank QUERY] [--token-batches JSON] [--stale-update]

`--stock` is stock vllm-ascend: our general plugin (the model) left out of VLLM_PLUGINS, our
platform plugin kept (it only installs the stand-in here). Results: the worker's, runner's and
model's classes, the device of the model's parameters, the KV cache as the runner allocated it
(bytes of `runner.kv_caches` tensors, and the device allocator's bytes), the embeddings, and the
device operators the first decoder layer ran for one text (op_counter.py's counter), with the
torch_npu stand-in's operator calls of that forward; the texts embedded again one per step
(other sequence boundaries and padded sizes); and, in graph mode (`--engine-args
'{"enforce_eager": false}'`), the NPU graphs vllm-ascend's ACLGraphWrapper captured and replayed
on the stand-in's `NPUGraph`, the operators they recorded, and the operators the host ran
between replays. In one graph per forward: the model's update figures (`full_graph`), and with
`--stale-update` the texts embedded again by an update that gives each captured attention the
boundaries of its capture instead of the step's (a broken update: what the tests' batched
parity check must catch).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
OUR_PLUGIN = "vllm_npu_ext"
# Stock vllm-ascend's attention takes half-precision KV only: ATB ReshapeAndCache writes
# float16/bfloat16/int8 caches (CANN ATB API reference, ReshapeAndCacheOperation; vllm-ascend
# 0.23.0.post1 `AscendAttentionBackendImpl.reshape_and_cache`), and its prefill FIA call in TND
# layout takes bfloat16 with head_dim 128 (torch-npu 2.10.0.post4 docs,
# emulator/operators/attention.py). The side-by-side runs use a tiny checkpoint of those shapes,
# served in bfloat16, for both sides.
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


def _layer_counts(model, run) -> dict:
    """The launches of the first decoder layer's forward during `run()` (op_counter.py: those
    inside host-code custom ops counted, attributed to them), with the bytes each moved."""
    sys.path.insert(0, str(BENCHMARKS))
    from op_counter import OpCounter

    counter = OpCounter(measure_bytes=True)
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
    return _counts(counter)


def _forward_counts(run) -> dict:
    """Launches the host dispatched during `run()` (op_counter.py's counter) and the NPU
    graphs replayed meanwhile: in graph mode, the launches between replays (a replay is one
    launch; its operators are not the host's)."""
    sys.path.insert(0, str(BENCHMARKS))
    from op_counter import OpCounter

    from vllm_npu_ext.emulator.device import graphs

    replays = graphs.stats["replays"]
    with OpCounter() as counter, _attributed(counter, RUNNER_MODULE, "update_cos_sin"):
        run()
    return {**_counts(counter), "graph_replays": graphs.stats["replays"] - replays,
            "runner_update_cos_sin": dict(sorted(counter.by_piece.get("update_cos_sin", {})
                                                 .items()))}  # fmt: skip


RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"


@contextlib.contextmanager
def _attributed(counter, module_name: str, function: str):
    """Launches of `module_name.function` (a runner helper called by name) counted under
    `function` in `counter.by_piece`, while the block runs."""
    module = sys.modules.get(module_name)
    original = getattr(module, function, None)
    if original is None:
        yield
        return

    def counted(*args, **kwargs):
        counter.piece = function
        try:
            return original(*args, **kwargs)
        finally:
            counter.piece = None

    setattr(module, function, counted)
    try:
        yield
    finally:
        setattr(module, function, original)


def _counts(counter) -> dict:
    return {
        "launches": dict(sorted(counter.launches.items())),
        "inside": {op: dict(sorted(n.items())) for op, n in sorted(counter.inside.items())},
        "bytes": {op: list(rw) for op, rw in sorted(counter.bytes.items())},
    }


def _per_layer(counts: dict[str, int], layers: int) -> dict[str, int]:
    """A middle layer's share: the totals divided by `layers`, rounded down (`graph_entry`)."""
    return {name: count // layers for name, count in sorted(counts.items()) if count >= layers}


def graph_entry(results: dict) -> dict:
    """A model under vllm-ascend's ACL graphs, per decoder layer: the launches recorded in the
    graphs of one capture size, and those the host issues between replays inside the layers'
    custom ops (attention). Per layer means a middle layer: totals divided by the layer count,
    rounded down, which leaves out what runs once per forward (the embedding, the first
    layer's plain input norm, the final norm); that and the runner's own launches (input
    preparation, the slot mapping, pooling) are `launches_per_forward_besides`. The stand-in
    enters host-code custom ops at capture (the graphs hold what they launch; at TP=1
    `maybe_chunk_residual` launches nothing, vllm-ascend 0.23.0.post1
    `_maybe_pad_and_reduce_impl` in `vllm_ascend/ops/register_custom_ops.py`);
    one of op_counter.HOST_CODE_OPS recorded whole would be listed apart, not counted."""
    sys.path.insert(0, str(BENCHMARKS))
    from op_counter import HOST_CODE_OPS

    layers, graphs, forward = results["layers"], results["graphs"], results["forward"]
    sizes = len(results["capture_sizes"])
    in_graphs: dict[str, int] = {}
    host_code: dict[str, int] = {}
    for name, count in results["captured_operators"].items():  # "npu.npu_rms_norm.default"
        namespace, op = name.split(".")[:2]
        target = host_code if f"{namespace}::{op}" in HOST_CODE_OPS else in_graphs
        # op_counter.py's names: aten's with their overload, the others without
        label = name if namespace == "aten" else {"npu": "torch_npu"}.get(namespace, namespace) \
            + "." + op  # fmt: skip
        target[label] = target.get(label, 0) + count // sizes
    between: dict[str, int] = {}
    for issued in forward["inside"].values():
        for name, count in issued.items():
            between[name] = between.get(name, 0) + count
    per_forward = {name: count - between.get(name, 0)
                   for name, count in forward["launches"].items()
                   if count > between.get(name, 0)}  # fmt: skip
    in_graphs_per_layer = _per_layer(in_graphs, layers)
    between_per_layer = _per_layer(between, layers)
    return {
        "mode": results["graph_mode"], "capture_sizes": sizes, "captures": graphs["captures"],
        "graph_replays_per_forward": forward["graph_replays"],
        "launches_in_graphs_per_layer": in_graphs_per_layer,
        "launches_between_replays_per_layer": between_per_layer,
        "launches_per_layer": sum(in_graphs_per_layer.values())
        + sum(between_per_layer.values()),
        "host_code_ops_in_graphs_per_capture": host_code,
        "launches_per_forward_besides": per_forward,
        "launches_outside_replays_per_forward": sum(forward["launches"].values()),
        "kv_cache_tensor_bytes": results["kv_cache_tensor_bytes"],
        "startup_seconds": results["startup_seconds"],
        "graph_capture": results["graph_capture_log"],
    }  # fmt: skip


def eager_entry(results: dict) -> dict:
    """A model run eagerly: every launch of a decoder layer is the host's."""
    launches = results["layer"]["launches"]
    return {"mode": "eager", "launches_per_layer": sum(launches.values()),
            "launches_between_replays_per_layer": launches,
            "inside": results["layer"]["inside"], "bytes": results["layer"]["bytes"],
            "launches_outside_replays_per_forward": sum(results["forward"]["launches"].values()),
            "model": results["model"], "kv_cache_tensor_bytes": results["kv_cache_tensor_bytes"],
            "startup_seconds": results["startup_seconds"]}  # fmt: skip


# `count_ops.py --vllm-ascend`: each of our modes against stock in the mode stock serves it
# in (stock pooling has no one graph per forward: its default, piecewise, is the one to beat).
AGAINST_STOCK = {"ours eager": "stock eager", "ours piecewise": "stock piecewise",
                 "ours full graph": "stock piecewise"}  # fmt: skip


def against_stock(entries: dict) -> dict:
    """Ours against stock as measured in this run (`AGAINST_STOCK`): launches per decoder layer
    and launches outside the replays per forward (the runner's included), and whether ours are
    fewer; None where either side did not run."""
    keys = ("launches_per_layer", "launches_outside_replays_per_forward")
    compared = {}
    for ours, stock in AGAINST_STOCK.items():
        a, b = entries.get(ours, {}), entries.get(stock, {})
        if not all(key in a and key in b for key in keys):
            compared[ours] = None
            continue
        compared[ours] = {"stock": stock, **{key: [a[key], b[key]] for key in keys},
                          "fewer": all(a[key] < b[key] for key in keys)}  # fmt: skip
    return compared


def entry(returncode: int, results: dict | None, log: str) -> dict:
    """One side's entry from this script: its launches per decoder layer, or where it stopped
    (the last exception line of its log)."""
    if returncode == 0 and results is not None and results["graphs"].get("captures"):
        return graph_entry(results)
    if returncode == 0 and results is not None:
        return eager_entry(results)
    errors = [line for line in log.splitlines() if "Error:" in line]
    return {"blocked": errors[-1].strip() if errors else f"exit code {returncode}"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--texts", required=True)
    parser.add_argument("--stock", action="store_true")
    parser.add_argument("--engine-args", default="{}")
    parser.add_argument("--token-batches", default="[]", help="JSON list of batches, each a "
                        "list of prompt lengths: the first decoder layer's launches and bytes "
                        "for each batch of random token ids (eager runs)")  # fmt: skip
    parser.add_argument("--stale-update", action="store_true", help="in one graph per forward, "
                        "embed the texts again with the update keeping the captured "
                        "boundaries (a broken update)")  # fmt: skip
    parser.add_argument("--rerank", metavar="QUERY", help="serve MODEL as Qwen3-Reranker (our "
                        "overrides and template) and score QUERY against the texts")  # fmt: skip
    parser.add_argument("--count-all-texts", action="store_true", help="count the launches of "
                        "a forward of all the texts (one step: their shared prefixes computed "
                        "once), not of the first text alone")  # fmt: skip
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.stock:
        os.environ["VLLM_PLUGINS"] = STOCK_PLUGINS
    texts = json.loads(args.texts)

    import torch
    from vllm import LLM

    logging.getLogger("vllm").addHandler(_Remember())

    from vllm_npu_ext.emulator.device import graphs, host_npu
    from vllm_npu_ext.emulator.runtime import registry as _runtime

    engine_args = dict(runner="pooling", convert="embed", dtype="float32", max_model_len=128,
                       enforce_eager=True, kv_cache_memory_bytes=16 << 20)  # fmt: skip
    if args.rerank is not None:
        from vllm_npu_ext import reranker

        del engine_args["convert"]  # vLLM picks classify from the architecture name
        engine_args.update(hf_overrides=reranker.HF_OVERRIDES, max_model_len=512)
    engine_args.update(json.loads(args.engine_args))
    started = time.perf_counter()
    llm = LLM(args.model, **engine_args)
    startup_seconds = time.perf_counter() - started
    worker = llm.llm_engine.model_executor.driver_worker.worker
    runner = worker.model_runner
    model = runner.get_model()
    parameters = {str(p.device) for p in model.parameters()}
    if args.rerank is None:
        def outputs(items):
            return [o.outputs.embedding for o in llm.embed(items, use_tqdm=False)]
    else:
        template = reranker.template_text()

        def outputs(items):
            return [o.outputs.score for o in llm.score(args.rerank, items, use_tqdm=False,
                                                       chat_template=template)]  # fmt: skip
    replays = graphs.stats["replays"]
    embeddings = outputs(texts)
    batch_replays = graphs.stats["replays"] - replays
    sharing = _sharing_figures(model)
    # The same texts one request per step: other sequence boundaries, other padded sizes.
    one_by_one = [outputs([text])[0] for text in texts]
    full_graph = _full_graph_figures(model)
    stale = _with_stale_update(lambda: outputs(texts)) if args.stale_update else None

    layers = llm.llm_engine.vllm_config.model_config.hf_config.num_hidden_layers
    _runtime.reset_counts()
    # Eager: a decoder layer's forward hooks see its operators. Compiled (graph mode), the
    # layers are not Python modules that run: the whole forward is counted instead.
    counted = texts if args.count_all_texts else texts[:1]
    layer = _layer_counts(model, lambda: outputs(counted))
    forward = _forward_counts(lambda: outputs(counted))
    config = llm.llm_engine.vllm_config
    generator = torch.Generator().manual_seed(0)
    vocab = config.model_config.get_vocab_size()
    batches = [[{"prompt_token_ids": torch.randint(vocab, (n,), generator=generator).tolist()}
                for n in lengths] for lengths in json.loads(args.token_batches)]  # fmt: skip
    token_batches = [{"tokens": sum(len(p["prompt_token_ids"]) for p in batch),
                      **_layer_counts(model, lambda b=batch: outputs(b))}
                     for batch in batches]  # fmt: skip
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
        "embeddings": embeddings, "embeddings_one_by_one": one_by_one,  # scores: --rerank
        "embeddings_stale_update": stale, "full_graph": full_graph,
        "batch_graph_replays": batch_replays, "shared_prefixes": sharing,
        "layer": layer, "forward": forward, "token_batches": token_batches,
        "graphs": dict(graphs.stats),
        "graph_mode": _graph_mode(model, config), "startup_seconds": round(startup_seconds, 1),
        "capture_sizes": list(config.compilation_config.cudagraph_capture_sizes or []),
        "graph_capture_log": _capture_log(),
        "captured_operators": dict(sorted(graphs.captured_operators.items())),
        "cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode),
        "emulated_calls": dict(_runtime.calls), "layers": layers,
        "dtype": str(next(model.parameters()).dtype), "torch_npu_is_stand_in":
        getattr(__import__("torch_npu"), "__vllm_npu_ext_emulator__", False),
        "npu_tensors": torch.npu.memory_allocated() > 0,
    }  # fmt: skip
    with open(args.out, "w", encoding="utf-8") as file:
        json.dump(results, file)


def _full_graph_figures(model) -> dict | None:
    """One graph per forward's update figures after the batched and one-by-one runs
    (`layers/cache_free/full_graph.py`), or None in other modes."""
    state = getattr(getattr(model, "model", None), "full_graph", None)
    if state is None:
        return None
    return {"updates": state.updates, "update_calls": state.update_calls,
            "widest_update": list(state.widest_update), "max_num_seqs": state.max_num_seqs,
            "captured_sizes": sorted(state.captured),
            "layers_per_capture": sorted({len(t) for t in state.captured.values()})}  # fmt: skip


def _sharing_figures(model) -> dict | None:
    """What shared prefixes did so far (`model_executor/shared_prefix.py`), None where off."""
    sharing = getattr(model, "shared_prefixes", None)
    return None if sharing is None else dict(vars(sharing.stats))


def _with_stale_update(run):
    """`run()` while each update gives the captured attention its capture's boundaries."""
    from vllm_npu_ext.model_executor.layers.cache_free.full_graph import FullGraphAttention

    step_seqs = FullGraphAttention.step_seqs
    FullGraphAttention.step_seqs = lambda self, layer_name, num_tokens, task: task.captured_seqs
    try:
        return run()
    finally:
        FullGraphAttention.step_seqs = step_seqs


def _graph_mode(model, config) -> str:
    """eager, piecewise (attention between graphs) or full (one graph per forward)."""
    if config.model_config.enforce_eager:
        return "eager"
    return getattr(model, "graph_mode", "piecewise")


def _capture_log() -> str:
    """vLLM's line on graph capture (time, memory), from this process's log records."""
    return next((line for line in reversed(_LOG_LINES) if "Graph capturing finished" in line),
                "")  # fmt: skip


_LOG_LINES: list[str] = []


class _Remember(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _LOG_LINES.append(record.getMessage())


if __name__ == "__main__":
    main()
