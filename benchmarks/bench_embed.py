#!/usr/bin/env python
"""Offline embedding throughput: vllm-npu-ext vs stock vLLM vs Hugging Face transformers.

    python benchmarks/bench_embed.py            # Qwen3-Embedding-0.6B shapes, bf16 (~25 min)
    python benchmarks/bench_embed.py --quick    # the tiny checkpoint (a few minutes)

Each side runs in its own process, on the same generated inputs:

- plugin: vLLM with vllm-npu-ext (default cache-free pooling: no KV cache, no prefix cache);
- stock: the same vLLM with our plugins left out of `VLLM_PLUGINS` (vLLM's own Qwen3);
- hf: transformers, length-sorted left-padded batches (the sentence-transformers way);
- plugin-kv: the plugin with `VLLM_NPU_EXT_KV_CACHE_FREE=0` (shared-prefix scenario only);
- on the CPU in bf16/fp16, where the plugin multiplies in float32 on CPUs without native
  half-precision matmuls (`VLLM_NPU_EXT_CPU_FLOAT32_MATMUL`, default auto): plugin-bf16mm, the
  plugin with `VLLM_NPU_EXT_CPU_FLOAT32_MATMUL=0` (the same half-precision matmuls as stock:
  the like-for-like ratio, reported first), and stock-fp32, stock vLLM at `--dtype float32`
  (against the plugin's float32 matmuls).

vLLM sides run in-process engines (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) with the same
`max_model_len` and memory fraction. "Batch size" is texts per call (one `LLM.embed` call,
or one padded forward). Every timed pass embeds texts no pass has seen before (vLLM's
prefix cache would otherwise answer a repeated pass from cache); the shared-prefix scenario
(one long instruction before short queries, warmed up first) is reported on its own, since
that is where a prefix cache can help. Medians over `--repeats` passes.

The sides' processes stay up together and take turns: one timed pass each per (batch size,
repeat), in rotating order, never two at once. A slow drift in what else the machine runs
then hits every side alike instead of whichever side ran during it. Phases: plugin,
plugin-bf16mm, stock and hf (mixed; plugin and stock also shared-prefix); then stock-fp32
against the plugin (mixed, new texts: `mixed-fp32`); then plugin-kv against the plugin
(shared-prefix, new texts); then, on a machine with an Ascend NPU, the plugin with all
fusions off (`VLLM_NPU_EXT_FUSED=0`) and with each one off in turn
(`VLLM_NPU_EXT_FUSE_<NAME>=0`), each against the plugin with all on.

Output: markdown tables, then, as the last line, one JSON object with
`plugin_bf16mm_vs_stock`, `plugin_vs_stock`, `plugin_vs_stock_fp32` and `plugin_vs_hf`
(geometric means over batch sizes of the paired texts/s ratios) and every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _shared_prefix_bench as shared_prefix_bench  # noqa: E402
from _common import Worker, log  # noqa: E402
from _embed_report import report  # noqa: E402

from vllm_npu_ext.envs import FUSED, FUSIONS  # noqa: E402

WORKER = Path(__file__).resolve().parent / "_embed_worker.py"
OUR_PACKAGE = "vllm_npu_ext"


@dataclasses.dataclass(frozen=True)
class Side:
    name: str
    kind: str  # "vllm" or "hf"
    env: dict[str, str]
    dtype: str | None = None  # None: --dtype
    engine_args: dict = dataclasses.field(default_factory=dict)  # more vllm.LLM arguments


def vllm_plugins(include_ours: bool) -> str:
    """A `VLLM_PLUGINS` allow-list: every installed vLLM plugin, with or without ours."""
    names = {
        ep.name
        for group in ("vllm.general_plugins", "vllm.platform_plugins")
        for ep in entry_points(group=group)
        if include_ours or not ep.value.startswith(OUR_PACKAGE)
    }
    return ",".join(sorted(names)) or "none"


def side_catalogue() -> dict[str, Side]:
    ours, stock = {"VLLM_PLUGINS": vllm_plugins(True)}, {"VLLM_PLUGINS": vllm_plugins(False)}
    return {
        "plugin": Side("plugin", "vllm", ours),
        "stock": Side("stock", "vllm", stock),
        "hf": Side("hf", "hf", {}),
        "plugin-kv": Side("plugin-kv", "vllm", {**ours, "VLLM_NPU_EXT_KV_CACHE_FREE": "0"}),
        "plugin-bf16mm": Side("plugin-bf16mm", "vllm",
                              {**ours, "VLLM_NPU_EXT_CPU_FLOAT32_MATMUL": "0"}),
        "stock-fp32": Side("stock-fp32", "vllm", stock, dtype="float32"),
    }  # fmt: skip


# Sides that measure the CPU's float32 matmuls (module docstring): only on the CPU, in half
# precision, where the plugin's default differs from stock's matmul precision.
CPU_MATMUL_SIDES = ("plugin-bf16mm", "stock-fp32")


def ablation_sides() -> list[Side]:
    """The plugin with all fusions off, then with each one off in turn."""
    ours = {"VLLM_PLUGINS": vllm_plugins(True)}
    variants = [Side("unfused", "vllm", {**ours, FUSED.name: "0"})]
    variants += [
        Side(f"no-{fusion}", "vllm", {**ours, f"VLLM_NPU_EXT_FUSE_{fusion.upper()}": "0"})
        for fusion in FUSIONS
    ]
    return variants


def scenarios(args) -> dict[str, dict]:
    mixed = {
        "name": "mixed", "batch_sizes": args.batch_sizes, "repeats": args.repeats,
        "texts_per_pass": args.texts_per_pass, "min_tokens": args.min_tokens,
        "max_tokens": args.max_tokens, "prefix_tokens": 0,
    }  # fmt: skip
    prefix = {
        **mixed, "name": "prefix", "batch_sizes": [args.prefix_batch_size],
        "texts_per_pass": args.prefix_texts, "max_tokens": 64,
        "prefix_tokens": args.prefix_tokens,
    }  # fmt: skip
    return {"mixed": mixed, "prefix": prefix, "prefix-kv": {**prefix, "name": "prefix-kv"},
            "mixed-fp32": {**mixed, "name": "mixed-fp32"}}  # fmt: skip


def default_model(quick: bool) -> Path:
    return built_model("tiny" if quick else "0.6b")


def built_model(preset: str) -> Path:
    """A random-weight checkpoint of `preset` in the cache, built on first use."""
    from vllm_npu_ext.tiny_model import cache_dir, make_tiny_model

    path = cache_dir() / f"bench-{preset}"
    if not (path / "model.safetensors").exists():
        log(f"building the {preset} checkpoint in {path}")
        make_tiny_model(path, preset=preset)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny checkpoint, fewer passes")
    parser.add_argument("--model", type=Path, help="checkpoint dir (default: built 0.6b/tiny)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch-sizes", type=positive_ints,
                        help="texts per call (default 1,8,32)")  # fmt: skip
    parser.add_argument("--texts-per-pass", type=int, help="texts in one timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per batch size")
    parser.add_argument("--min-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--prefix-tokens", type=int, default=256, help="shared instruction")
    parser.add_argument("--prefix-texts", type=int, help="queries per shared-prefix pass")
    parser.add_argument("--prefix-batch-size", type=int, default=16)
    parser.add_argument("--sides", type=lambda s: s.split(","),
                        default=["plugin", "stock", "hf", "plugin-kv", *CPU_MATMUL_SIDES],
                        help="default: all; plugin-bf16mm and stock-fp32 only on the CPU in "
                        "bf16/fp16")  # fmt: skip
    parser.add_argument("--ablation", choices=("auto", "on", "off"), default="auto",
                        help="per-fusion runs (auto: only with an Ascend NPU)")  # fmt: skip
    parser.add_argument("--shared-prefix", action="store_true",
                        help="instead: the shared-prefix workloads (a) and (c), plugin with "
                        "and without sharing against stock at block sizes 128 and 16 "
                        "(_shared_prefix_bench.py)")  # fmt: skip
    parser.add_argument("--workloads", default="a,c",
                        help="with --shared-prefix: which of (a) and (c) to run (default a,c)")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    _fill_defaults(args)
    return args


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of how the sides run, shared with bench_rerank.py."""
    parser.add_argument("--emulate", action="store_true",
                        help="run the plugin's NPU path under the torch_npu emulator "
                        "(checks the script on CPU; timings are meaningless)")  # fmt: skip
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-batched-tokens", type=int,
                        help="every vLLM side's scheduler token budget per step (default: "
                        "vLLM's)")  # fmt: skip
    parser.add_argument("--gpu-memory-utilization", type=float)
    parser.add_argument("--work-dir", type=Path, help="worker logs (default: a temp dir)")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds to wait for a start-up or a pass")  # fmt: skip
    parser.add_argument("--json-out", type=Path, help="also write the JSON result here")
    parser.add_argument("--shared-prefix-sides", type=lambda s: [n for n in s.split(",") if n],
                        help="with --shared-prefix: only these sides (plugin and "
                        "plugin-noshare always run; default: all four)")  # fmt: skip


def positive_ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need positive integers, got {text!r}")
    return values


def _fill_defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    args.batch_sizes = args.batch_sizes or ([1, 16] if quick else [1, 8, 32])
    args.texts_per_pass = args.texts_per_pass or (32 if quick else 48)
    args.prefix_texts = args.prefix_texts or (16 if quick else 32)
    if args.quick and args.repeats == 3:
        args.repeats = 2
    from vllm_npu_ext.ops.dispatch import npu_available

    args.npu = npu_available()
    args.device = "npu" if args.npu else "cpu"
    if args.gpu_memory_utilization is None:
        # Two engines share the device during a run (the plugin and one other side).
        args.gpu_memory_utilization = 0.4 if args.npu else 0.5
    if args.npu or args.emulate or args.dtype not in ("bfloat16", "float16"):
        args.sides = [side for side in args.sides if side not in CPU_MATMUL_SIDES]
    unknown = set(args.sides) - set(side_catalogue())
    if unknown:
        raise SystemExit(f"--sides: unknown {sorted(unknown)}, known {sorted(side_catalogue())}")
    args.run_ablation = args.ablation == "on" or (args.ablation == "auto" and args.npu)
    if args.run_ablation and not (args.npu or args.emulate):
        raise SystemExit("--ablation on needs an Ascend NPU (or --emulate to check the script)")


class Bench:
    """The running sides' processes and everything measured so far."""

    def __init__(self, args, model: Path, work_dir: Path, worker: Path = WORKER):
        self.args, self.model, self.work_dir, self.worker = args, model, work_dir, worker
        self.workers: dict[str, Worker] = {}
        self.results: dict[str, dict] = {}

    def start(self, side: Side) -> None:
        log(f"[{side.name}] starting ({self.work_dir / side.name}.log)")
        spec = {
            "kind": side.kind, "model": str(self.model), "dtype": side.dtype or self.args.dtype,
            "max_model_len": self.args.max_model_len, "device": self.args.device,
            "gpu_memory_utilization": self.args.gpu_memory_utilization,
            "emulate": self.args.emulate and side.kind == "vllm"
            and not side.name.startswith("stock"), "engine_args": side.engine_args,
        }  # fmt: skip
        if self.args.max_num_batched_tokens and side.kind == "vllm":
            spec["engine_args"] = {**side.engine_args,
                                   "max_num_batched_tokens": self.args.max_num_batched_tokens}
        worker = Worker([str(self.worker), json.dumps(spec)], side.env,
                        self.work_dir / f"{side.name}.log", self.args.timeout)  # fmt: skip
        self.workers[side.name] = worker
        check_side(side, worker.ready)
        self.results[side.name] = {**worker.ready, "passes": []}
        log(f"[{side.name}] ready after {worker.ready['startup_seconds']:.1f} s")

    def take_turns(self, names: list[str], scenario: dict, warmup: int) -> None:
        """Warm up, then one pass per side per (batch size, repeat), in rotating order."""
        for name in names:
            self.workers[name].call("warmup", scenario=scenario, count=warmup)
        plan = [(b, r) for b in scenario["batch_sizes"] for r in range(scenario["repeats"])]
        for turn, (batch_size, repeat) in enumerate(plan):
            shift = turn % len(names)
            for name in names[shift:] + names[:shift]:
                record = self.workers[name].call(
                    "pass", scenario=scenario, batch_size=batch_size, repeat=repeat
                )
                self.results[name]["passes"].append(record)
            log(f"  {scenario['name']} batch {batch_size} repeat {repeat}: done")

    def finish(self, name: str) -> None:
        worker = self.workers.pop(name)
        self.results[name].update(worker.call("check"))
        self.results[name].update(worker.close())

    def kill_all(self) -> None:
        for worker in self.workers.values():
            worker.kill()


def check_side(side: Side, ready: dict) -> None:
    """Refuse a comparison in which the plugin did not run where it should (or did elsewhere)."""
    ours = any(name.startswith(OUR_PACKAGE) for name in ready["model_classes"])
    if side.kind == "vllm" and ours == side.name.startswith("stock"):
        raise RuntimeError(f"side {side.name}: model classes {ready['model_classes']}")


def run(bench: Bench, chosen: list[str], catalogue: dict[str, dict]) -> None:
    args, sides = bench.args, side_catalogue()
    # vLLM on CPU wants its whole memory fraction free at start, even with no KV cache to
    # allocate: the plugin (small) starts before stock (which fills the fraction).
    first = [name for name in ("plugin", "plugin-bf16mm", "stock", "hf") if name in chosen]
    for name in first:
        bench.start(sides[name])
    mixed_warmup = max(8, min(args.texts_per_pass, max(args.batch_sizes)))
    bench.take_turns(first, catalogue["mixed"], mixed_warmup)
    prefix_sides = [name for name in ("plugin", "stock") if name in first]
    if prefix_sides:
        bench.take_turns(prefix_sides, catalogue["prefix"], args.prefix_batch_size)
    for name in ("plugin-bf16mm", "stock", "hf"):
        if name in bench.workers:
            bench.finish(name)
    with_plugin = ["plugin"] if "plugin" in bench.workers else []
    if "stock-fp32" in chosen:
        bench.start(sides["stock-fp32"])
        bench.take_turns(with_plugin + ["stock-fp32"], catalogue["mixed-fp32"], mixed_warmup)
        bench.finish("stock-fp32")
    if "plugin-kv" in chosen:
        bench.start(sides["plugin-kv"])
        bench.take_turns(with_plugin + ["plugin-kv"], catalogue["prefix-kv"],
                         args.prefix_batch_size)  # fmt: skip
        bench.finish("plugin-kv")
    if args.run_ablation:
        for variant in ablation_sides():
            bench.start(variant)
            scenario = {**catalogue["mixed"], "name": f"ablation-{variant.name}",
                        "batch_sizes": [max(args.batch_sizes)]}  # fmt: skip
            bench.take_turns(with_plugin + [variant.name], scenario, mixed_warmup)
            bench.finish(variant.name)
    for name in list(bench.workers):
        bench.finish(name)


def main(argv=None) -> int:
    args = parse_args(argv)
    model = args.model or default_model(args.quick)
    if args.shared_prefix:
        workloads = shared_prefix_bench.embed_scenarios(args.repeats, args.workloads)
        return shared_prefix_bench.execute(args, model, WORKER, Bench, workloads, scores=False,
                                           bound=MIN_COSINE_VS_HF[args.dtype])  # fmt: skip
    oracle = OracleCheck("min_cosine_vs_hf", "min cosine to hf", MIN_COSINE_VS_HF, at_least=True)
    return execute(args, model, WORKER, lambda bench: run(bench, args.sides, scenarios(args)),
                   report, oracle)  # fmt: skip


# Agreement with the oracle (the hf side) below which a side's speed is not reported: an
# engine that computes something else is not faster at the task. Float32 is the suite's
# parity bar; half precision allows its rounding (stock vLLM measures 0.99995 in bfloat16).
MIN_COSINE_VS_HF = {"float32": 0.99999, "float16": 0.999, "bfloat16": 0.999}
RATIO_FIELDS = ("plugin_bf16mm_vs_stock", "plugin_vs_stock", "plugin_vs_stock_fp32",
                "plugin_vs_hf", "prefix_plugin_vs_stock", "prefix_plugin_kv_vs_plugin")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class OracleCheck:
    """Which per-side summary figure measures agreement with the oracle, and its bound."""

    field: str  # in summary["sides"][name]
    label: str
    bound: dict[str, float]  # per dtype
    at_least: bool  # True: the figure must be >= bound; False: <= bound

    def failures(self, summary: dict) -> list[str]:
        """One line per side whose output is off the oracle (hf itself is the oracle)."""
        bound = self.bound.get(summary["dtype"], self.bound["bfloat16"])  # the loosest
        lines = []
        for name, side in summary["sides"].items():
            value = side.get(self.field)
            if name == "hf" or value is None:
                continue
            if (value < bound) if self.at_least else (value > bound):
                relation = "<" if self.at_least else ">"
                lines.append(f"side {name}: {self.label} {value:.6g} {relation} {bound:g} "
                             f"({summary['dtype']}): its output is off the oracle")  # fmt: skip
        return lines


def execute(args, model: Path, worker: Path, run_sides, make_report, oracle: OracleCheck) -> int:
    """Run the sides (`run_sides(bench)`), always stop them, print the tables and, last, the
    summary JSON line (`make_report(results, args, model)` gives both).

    A side off the oracle (`oracle.failures`) withholds every speed ratio: the tables are not
    printed, the summary's ratios are null, `parity_failures` names the sides and the exit
    status is 1."""
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix=f"{worker.stem}."))
    work_dir.mkdir(parents=True, exist_ok=True)
    bench = Bench(args, model, work_dir, worker)
    try:
        run_sides(bench)
    finally:
        bench.kill_all()
    tables, summary = make_report(bench.results, args, model)
    failures = oracle.failures(summary)
    if "hf" not in summary["sides"]:
        log("no hf side: outputs were not checked against the oracle")
    if failures:
        for field in RATIO_FIELDS:
            if field in summary:
                summary[field] = None
        summary["parity_failures"] = failures
        print("No speed ratio reported: " + "; ".join(failures), file=sys.stderr)
    else:
        print(tables)
    line = json.dumps(summary)
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
