"""Count device operators per Qwen3 decoder layer on the NPU path, under the torch_npu emulator.

    python benchmarks/count_ops.py [--model DIR] [--tokens 37,5,120]

Loads the model into an in-process vLLM engine (with the emulator installed, so the model is
built for the NPU path; eager, so this script does its own tracing), then:

Eager: runs one decoder layer on a packed batch for: all fusions on, all off, and each fusion
off in turn. Counted, as a dispatch mode sees them: every torch_npu operator (each emulated
operator is one opaque `npu::` torch operator, as on a real NPU), plus every ATen operator that
launches work on activations (views, aliases and bare allocations excluded). The rotary-table
gather happens once per forward and is reported separately.

Compiled (the JSON's "compiled" object): the model's forward (all fusions on) as vLLM compiles it.
TorchDynamo captures it (fullgraph off, so a graph break is counted rather than raised:
`graph_breaks`); each captured graph is then split with vLLM's own `split_graph`
(`vllm/compilation/backends.py`) at the splitting ops vLLM would use on Ascend
(`CompilationConfig.set_splitting_ops_for_v1` under VLLM_COMPILE, which now includes our
`vllm_npu_ext::cache_free_attention`) plus vllm-ascend's additions (`vllm::mla_forward`,
`vllm::dsa_forward`, vllm-ascend 0.23.0.post1 `NPUPlatform.check_and_update_config`). That is the
piecewise structure vllm-ascend captures in ACL graphs; on the CPU vLLM traces without splitting, so
this script applies the split itself. The split graph then runs on a packed batch under the same
counter, with every operator attributed to the piece that issued it: `ops_outside_graphs_per_layer`
is the operators that ran in the splitting pieces (eagerly, between graphs), per layer: our
attention op; `device_ops_outside_graphs_per_layer` what that op issues (the fused attention and the
copy of its result into the buffer the graph before it allocated, the pattern vLLM's own attention
op follows); `ops_per_layer` is the operators of one piece between two attention ops (one layer's
work but attention) plus one splitting piece. Views and bare allocations never count; in-place
operators (copies) do. Last line: one JSON object with the counts.

Under vllm-ascend (`--vllm-ascend SITE`, SITE = where vllm-ascend is installed, e.g.
`.venv-ascend/vllm-ascend`; run with that stack's python): one engine process per run
(`VLLM_ASCEND_RUNS`) for us and for stock vllm-ascend (our model plugin left out of
VLLM_PLUGINS) on vllm-ascend's NPUWorker and NPUModelRunner under the torch_npu stand-in
(`_vllm_ascend_engine.py`): eager, piecewise ACL graphs (stock's default; ours with
VLLM_NPU_EXT_FULL_GRAPH=0) and our one graph per forward, captured and replayed on the
stand-in's NPUGraph. Per decoder layer, the launches the host ran between graph replays, those
recorded in the graphs (of one capture size), graph replays per forward and the KV cache
bytes, counted by the same counter (`op_counter.py`: launches inside custom ops counted), on
one tiny bf16 checkpoint with head_dim 128 (stock's attention takes no other:
`STOCK_CHECKPOINT` in `_vllm_ascend_engine.py`) unless `--model` names one. An entry that
could not run says where it stopped. Stock's graph mode runs on the stand-ins of vllm-ascend's
operator library (`emulator/operators/vllm_ascend_library.py`) and of its Triton QK-norm +
RoPE operator (`emulator/operators/vllm_ascend_triton.py`), which it needs to start.
`--bytes`: eager only, one decoder layer at the Qwen3-Embedding-0.6B shapes, the bytes each
launch reads and writes with 512 and 8192 tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from op_counter import OpCounter  # noqa: E402

# Added to vLLM's default splitting ops by vllm-ascend 0.23 in PIECEWISE mode.
VLLM_ASCEND_SPLITTING_OPS = ("vllm::mla_forward", "vllm::dsa_forward")


def count_layer_ops(model, fusions, tokens: list[int]) -> dict:
    """Eager: device ops of one decoder layer (and of the per-forward rotary gather)."""
    from vllm_npu_ext.ops.packed import PackedSeqs

    inner = model.model
    seqs = PackedSeqs.from_seq_lens(tokens)
    positions = torch.cat([torch.arange(n) for n in tokens])
    dtype = inner.embed_tokens.weight.dtype
    hidden = torch.randn(seqs.num_tokens, inner.config.hidden_size, dtype=dtype)
    residual = torch.randn_like(hidden)
    layer = inner.layers[inner.start_layer]
    npu = sys.modules["torch_npu"]

    with torch.no_grad():  # once first: one-time work (the compressed causal mask) is not counted
        layer(positions, hidden, residual, inner.npu_step(npu, positions, dtype, seqs, fusions))
    per_forward = OpCounter()
    with torch.no_grad(), per_forward:
        step = inner.npu_step(npu, positions, dtype, seqs, fusions)
    per_layer = OpCounter()
    with torch.no_grad(), per_layer:
        layer(positions, hidden, residual, step)
    ops = dict(sorted(per_layer.launches.items()))
    per_forward_ops = sum(per_forward.launches.values())
    return {"per_layer": sum(ops.values()), "ops": ops, "per_forward": per_forward_ops}


def splitting_ops() -> list[str]:
    """The ops vLLM (VLLM_COMPILE, default splitting) and vllm-ascend split piecewise graphs at."""
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode

    from vllm_npu_ext import patches
    from vllm_npu_ext.model_executor.layers.cache_free.op import SPLITTING_OP

    patches.apply("vllm_splitting_ops", SPLITTING_OP)  # as the plugin's config hook does
    config = CompilationConfig(mode=CompilationMode.VLLM_COMPILE)
    config.set_splitting_ops_for_v1(all2all_backend="naive")
    return [*config.splitting_ops, *VLLM_ASCEND_SPLITTING_OPS]


def count_compiled(model, tokens: list[int], vllm_config) -> dict:
    """Compiled: graph breaks, and ops inside/outside vLLM's piecewise graphs (see docstring).

    Runs inside a vLLM forward context whose metadata gives every attention layer the
    boundaries of `tokens` (our attention reads them there and refuses a forward without one).
    """
    import torch._dynamo.utils as dynamo_utils
    from vllm.compilation.backends import split_graph

    inner = model.model
    captured, ops = [], splitting_ops()

    def backend(graph, example_inputs):  # dynamo passes the real inputs of this call
        split_module, items = split_graph(graph, ops)
        captured.append((split_module, items, list(example_inputs)))
        return split_module

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    input_ids = torch.randint(inner.config.vocab_size, (sum(tokens),))
    positions = torch.cat([torch.arange(n) for n in tokens])
    with torch.no_grad(), _packed_forward(model, tokens, vllm_config):
        torch.compile(inner.forward, backend=backend, fullgraph=False)(input_ids, positions)
    graph_breaks = sum(dynamo_utils.counters["graph_break"].values())
    torch._dynamo.reset()
    counter, pieces = OpCounter(), []
    for split_module, items, inputs in captured:  # rerun each graph's pieces, counted
        for item in items:
            submodule = getattr(split_module, item.submod_name)
            label = f"{len(pieces)}:{'outside' if item.is_splitting_graph else 'graph'}"
            submodule.forward = _attributed(counter, label, submodule.forward)
            pieces.append(label)
        with torch.no_grad(), counter, _packed_forward(model, tokens, vllm_config):
            split_module(*inputs)
    layers = inner.end_layer - inner.start_layer
    counted = {p: sum(counter.by_piece.get(p, Counter()).values()) for p in pieces}
    outside = [p for p in pieces if p.endswith("outside")]
    device = {p: sum(counter.device_ops.get(p, Counter()).values()) for p in outside}
    # pieces: graph, attention, graph (layer i after attention + layer i+1 before it), ...
    between = pieces[2] if len(pieces) > 3 else None
    return {
        "graph_breaks": graph_breaks,
        "graphs": len(pieces) - len(outside),
        "ops_outside_graphs_per_layer": sum(counted[p] for p in outside) / layers,
        "device_ops_outside_graphs_per_layer": sum(device.values()) / layers,
        "ops_per_layer": counted[between] + counted[outside[0]] if between else None,
        "outside_ops": _merged(counter.by_piece, outside),
        "outside_device_ops": _merged(counter.device_ops, outside),
    }


def _packed_forward(model, tokens: list[int], vllm_config):
    """vLLM's forward context for one packed batch of `tokens`: each attention layer's metadata
    carries the boundaries, as our cache-free builder leaves them
    (`forward_context.PACKED_SEQS_ATTR`)."""
    from types import SimpleNamespace

    from vllm.forward_context import set_forward_context

    from vllm_npu_ext.model_executor import forward_context
    from vllm_npu_ext.ops.packed import PackedSeqs

    seqs = PackedSeqs.from_seq_lens(tokens)
    metadata = SimpleNamespace(**{forward_context.PACKED_SEQS_ATTR: seqs})
    names = {getattr(m, "layer_name", None) for m in model.modules()} - {None}
    return set_forward_context(dict.fromkeys(names, metadata), vllm_config, num_tokens=sum(tokens))


def _merged(counts: dict[str, Counter[str]], pieces: list[str]) -> dict[str, int]:
    return dict(sum((counts.get(p, Counter()) for p in pieces), Counter()))


def _attributed(counter: OpCounter, label: str, forward):
    def run(*args, **kwargs):
        previous, counter.piece = counter.piece, label
        try:
            return forward(*args, **kwargs)
        finally:
            counter.piece = previous

    return run


# (entry, engine flags, extra environment) of `--vllm-ascend`: ours and stock vllm-ascend in
# each mode they serve in: eager; piecewise ACL graphs (stock's default for pooling; ours where
# FIA does not take the model, forced here with VLLM_NPU_EXT_FULL_GRAPH=0); one graph per
# forward (ours by default for bf16 head_dim 128; vLLM 0.23 serves stock pooling in PIECEWISE
# only: vLLM 0.23.0 `VllmConfig.__post_init__`, "Pooling models do not support full cudagraphs").
GRAPH_ARGS = {"enforce_eager": False}
VLLM_ASCEND_RUNS = (
    ("ours eager", (), {}),
    ("stock eager", ("--stock",), {}),
    ("ours piecewise", (), {"VLLM_NPU_EXT_FULL_GRAPH": "0", "graph": True}),
    ("stock piecewise", ("--stock",), {"graph": True}),
    ("ours full graph", (), {"graph": True}),
)
# The Qwen3-Embedding-0.6B shapes (one decoder layer) and the batches whose bytes per launch
# `--bytes` reports: 512 tokens (one prompt), 8192 tokens (16 prompts of 512).
BYTES_BATCHES = [[512], [512] * 16]
BYTES_ENGINE_ARGS = {"max_model_len": 512, "max_num_batched_tokens": 8192,
                     "kv_cache_memory_bytes": 64 << 20}  # fmt: skip


# `--shared-prefix` with `--vllm-ascend`: one step of texts behind Qwen3-Embedding's instruction
# (and one unrelated), counted whole (`_vllm_ascend_engine.py --count-all-texts`).
SHARED_PREFIX_TEXTS = [
    "Instruct: Given a web search query, retrieve relevant passages that answer the query\n"
    f"Query: {query}" for query in ("what is the capital of france", "how tall is everest",
                                    "which river flows through paris", "x")
] + ["an unrelated text about the weather"]  # fmt: skip


def count_under_vllm_ascend(site: str, model_dir: str | None, measure_bytes: bool,
                            shared_prefix: bool = False) -> dict:  # fmt: skip
    """Ours and stock vllm-ascend, each in its own engine process per mode (see the docstring
    and `VLLM_ASCEND_RUNS`), on `model_dir` or a tiny checkpoint of the shapes stock's attention
    takes, in bf16. `measure_bytes`: eager only, at the Qwen3-Embedding-0.6B shapes."""
    import subprocess

    script = Path(__file__).resolve().parent / "_vllm_ascend_engine.py"
    from _vllm_ascend_engine import STOCK_CHECKPOINT, STOCK_ENGINE_ARGS, entry

    from vllm_npu_ext.tiny_model import make_tiny_model

    path = os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])
    base_env = {**os.environ, "VLLM_NPU_EXT_EMULATE": "1", "PYTHONPATH": path}
    entries = {}
    with tempfile.TemporaryDirectory(prefix="count_ops_") as scratch:
        shape = {"preset": "0.6b", "num_hidden_layers": 1} if measure_bytes else STOCK_CHECKPOINT
        model_dir = model_dir or str(make_tiny_model(Path(scratch, "model"), **shape))
        for name, flags, extra in VLLM_ASCEND_RUNS:
            extra = dict(extra)
            graph = extra.pop("graph", False)
            if measure_bytes and graph:
                continue
            engine_args = {**STOCK_ENGINE_ARGS, **(GRAPH_ARGS if graph else {}),
                           **(BYTES_ENGINE_ARGS if measure_bytes else {})}  # fmt: skip
            out = Path(scratch, "out.json")
            out.unlink(missing_ok=True)
            texts = SHARED_PREFIX_TEXTS if shared_prefix else [
                "the quick brown fox jumps over the lazy dog"]  # fmt: skip
            command = [sys.executable, str(script), "--model", model_dir, "--out", str(out),
                       "--texts", json.dumps(texts), "--engine-args", json.dumps(engine_args),
                       *flags, *(["--count-all-texts"] if shared_prefix else [])]  # fmt: skip
            if measure_bytes:
                command += ["--token-batches", json.dumps(BYTES_BATCHES)]
            completed = subprocess.run(command, env={**base_env, **extra}, capture_output=True,
                                       text=True, check=False)  # fmt: skip
            results = json.loads(out.read_text()) if out.exists() else None
            entries[name] = entry(completed.returncode, results,
                                  completed.stdout + completed.stderr)  # fmt: skip
            if shared_prefix and results is not None:
                entries[name]["shared_prefixes"] = results["shared_prefixes"]
            if measure_bytes and results is not None:
                entries[name]["token_batches"] = results["token_batches"]
    return entries


def _print_launch_table(entries: dict) -> None:
    print("| under vllm-ascend (per decoder layer) | launches | in graphs | between replays "
          "| replays per forward | outside replays per forward | KV cache bytes |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for name, entry in entries.items():
        if "blocked" in entry:
            print(f"| {name} | blocked: {entry['blocked']} | | | | | |")
            continue
        in_graphs = sum(entry.get("launches_in_graphs_per_layer", {}).values())
        between = entry["launches_between_replays_per_layer"]
        print(f"| {name} | {entry['launches_per_layer']:g} | {in_graphs:g} | "
              f"{sum(between.values()):g} ({', '.join(f'{k} {v:g}' for k, v in between.items())})"
              f" | {entry.get('graph_replays_per_forward', 0)} | "
              f"{entry['launches_outside_replays_per_forward']} | "
              f"{entry['kv_cache_tensor_bytes']} |")  # fmt: skip


def _print_bytes_table(entries: dict) -> None:
    for name, entry in entries.items():
        for batch in entry.get("token_batches", []):
            print(f"\n{name}, {batch['tokens']} tokens: launch: MiB read / written")
            total = [0, 0]
            for op, (read, written) in batch["bytes"].items():
                count = batch["launches"].get(op, 1)
                print(f"  {op} x{count}: {read / 2**20:.1f} / {written / 2**20:.1f}")
                total = [total[0] + read, total[1] + written]
            print(f"  total: {total[0] / 2**20:.1f} / {total[1] / 2**20:.1f} MiB")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint dir (default: a fresh tiny checkpoint)")
    parser.add_argument("--tokens", default="37,5,120", help="sequence lengths of the batch")
    parser.add_argument("--vllm-ascend", metavar="SITE",
                        help="count under vllm-ascend (installed at SITE), for us and for stock")
    parser.add_argument("--bytes", action="store_true",
                        help="with --vllm-ascend: bytes each launch of a decoder layer moves, at "
                        "the Qwen3-Embedding-0.6B shapes with 512 and 8192 tokens (eager)")
    parser.add_argument("--shared-prefix", action="store_true",
                        help="the NPU options for shared-prefix attention, launches and bytes "
                        "(_shared_prefix_ops.py); with --vllm-ascend: a batch that shares a "
                        "prefix instead of one text")  # fmt: skip
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]

    from vllm_npu_ext import emulator

    if args.shared_prefix and not args.vllm_ascend:
        from _shared_prefix_ops import count_options, print_table

        with emulator.emulated() as npu:
            options = count_options(npu)
        print_table(options)
        print(json.dumps({"shared_prefix_options": options}))
        return 0
    from vllm_npu_ext.envs import FUSIONS
    from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
    from vllm_npu_ext.tiny_model import make_tiny_model

    if args.vllm_ascend:
        site = str(Path(args.vllm_ascend).resolve())
        entries = count_under_vllm_ascend(site, args.model, args.bytes, args.shared_prefix)
        _print_launch_table(entries)
        _print_bytes_table(entries)
        from _vllm_ascend_engine import against_stock

        entries["against_stock"] = against_stock(entries)
        print(json.dumps(entries))
        return 0
    model_dir = args.model or str(make_tiny_model(tempfile.mkdtemp(prefix="count_ops_")))
    emulator.install()
    from vllm import LLM

    llm = LLM(model=model_dir, runner="pooling", convert="embed", dtype="bfloat16",
              max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True)  # fmt: skip

    def run(model):
        # The model's own fusions: its attention operator is the one its shapes allow.
        base = model.model.plan.fusions
        configs = {"all_on": base, "all_off": FusionConfig.all_off()}
        configs.update({f"no_{name}": base.without(name) for name in FUSIONS})
        return {name: count_layer_ops(model, c, tokens) for name, c in configs.items()}

    results = llm.apply_model(run)[0]
    vllm_config = llm.llm_engine.vllm_config
    compiled = llm.apply_model(lambda model: count_compiled(model, tokens, vllm_config))[0]
    _print_table(results, compiled)
    summary = {name: r["per_layer"] for name, r in results.items()}
    summary["per_forward_all_on"] = results["all_on"]["per_forward"]
    summary["compiled"] = {key: compiled[key] for key in COMPILED_KEYS}
    print(json.dumps(summary))
    return 0


COMPILED_KEYS = (
    "graph_breaks", "ops_outside_graphs_per_layer", "device_ops_outside_graphs_per_layer",
    "ops_per_layer",
)


def _print_table(results: dict, compiled: dict) -> None:
    print("| configuration | ops per decoder layer | per forward (rotary tables) |")
    print("|---|---:|---:|")
    for name, result in results.items():
        print(f"| {name} | {result['per_layer']} | {result['per_forward']} |")
    for name in ("all_on", "all_off"):
        print(f"\n{name}: " + ", ".join(f"{op} x{n}" for op, n in results[name]["ops"].items()))
    print(
        f"\ncompiled (all_on): {compiled['graph_breaks']} graph breaks, {compiled['graphs']} "
        f"piecewise graphs, {compiled['ops_per_layer']} ops per layer of which "
        f"{compiled['ops_outside_graphs_per_layer']} outside the graphs: "
        + ", ".join(f"{op} x{n}" for op, n in compiled["outside_ops"].items())
        + "; they issue "
        + ", ".join(f"{op} x{n}" for op, n in compiled["outside_device_ops"].items())
    )


if __name__ == "__main__":
    sys.exit(main())
