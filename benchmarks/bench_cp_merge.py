#!/usr/bin/env python
"""Context-parallel decode merge: tensor path vs vllm-ascend 0.23's TensorList path (CPU).

For sp in {2, 4, 8} DCP shards, decode batches of bs sequences x H = 8 local heads
(N = bs * H rows), D = 128, fp32 buffers as vllm-ascend exchanges them:

- tensor path (ours): pack `[bs, sp*H, D]` + lse into `[sp, bs, H, D+1]` (`pack_out_lse`),
  and after the exchange merge strided views of that buffer with one
  `vllm_npu_ext::attention_update` call (`merge_cp_buffer`);
- list path (vllm-ascend's algorithm, written here from its behaviour): cat out and lse,
  permute + copy to `[sp*H, D+1, bs]` for the all_to_all; after it, view as
  `[pcp, bs, dcp, H, D+1]`, permute + copy, split, flatten, unbind into per-shard lists
  and call a TensorList operator.

Both operators run the same per-shard CPU arithmetic (`merge_shards`) and are opaque to the
op counter, as a device kernel would be, so the timings differ only by what the layouts
force the caller to do. The collective itself is not run (same bytes on both paths).
Copies and views are counted with a TorchDispatchMode. Last line: one JSON object.

These are CPU timings (one thread by default: the least disturbed by other load); they
show what the layouts cost in memory traffic, not the NPU kernels' time.

`--decode-step`: one layer's whole merge pair per decode step, as each side runs it, at pcp x dcp of
2x1, 1x2 and 2x2 and batches of 1 to 64 (bf16 FIA output, H local heads, D 128): the device
operators it launches (copies and casts, collectives, the merge operator) and the bytes its copies
write, ours (`pack_out_lse`, all_to_all, all-gather, `attention_update` on views) against
vllm-ascend 0.23's pair (0.23.0.post1 `common_cp.py`, `_process_attn_out_lse` and
`_npu_attention_update`: fp32 casts, cat, permute + copy before the all_to_all, a copy before the
PCP all-gather, permute + copy, split, unbind, TensorList AttentionUpdate). The collectives are
stood in for by one opaque operator each that writes what the real one would (the same bytes on both
sides), so no process group is needed; their bytes are reported apart.

`--decode-step --full-graph`: the same pairs as vllm-ascend's full decode graph holds them:
each captured in one graph on the torch_npu stand-in's `npu` device (installed in this
process; our operator's kernel is its host build, vllm-ascend's is torch_npu's TensorList
`npu_attention_update`), new inputs copied into the captured buffers, the graph replayed.
Per side: the graph's tasks (what each replay launches), the task updates a replay needs (the
host work between replays), and the replay against the same pair run eagerly.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_npu_ext.ops.attention_update import merge_shards
from vllm_npu_ext.ops.cp_merge import merge_cp_buffer, pack_out_lse

COPY_OPS = {"copy_", "clone", "_to_copy", "stack", "cat", "index_select", "contiguous"}
PER_SHARD_VIEW_OPS = {"unbind", "select"}
VIEW_OPS = {
    "view",
    "_unsafe_view",
    "permute",
    "transpose",
    "slice",
    "split",
    "split_with_sizes",
    "unsqueeze",
    "squeeze",
    "expand",
    "as_strided",
    "narrow",
    "alias",
    "unflatten",
    "flatten",
} | PER_SHARD_VIEW_OPS
HEADS, HEAD_DIM = 8, 128

_bench_lib = torch.library.Library("bench_cp", "FRAGMENT")
_bench_lib.define(
    "attention_update_list(Tensor[] lse, Tensor[] local_out, int update_type) -> (Tensor, Tensor)"
)


def _attention_update_list(lse, local_out, update_type):
    merged, lse_out = merge_shards(lse, local_out)
    return merged.to(local_out[0].dtype), lse_out


_bench_lib.impl("attention_update_list", _attention_update_list, "CPU")


def _dim_argument(args, kwargs) -> int:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0) if kwargs else args[1]
    return dim if dim >= 0 else dim + args[0].dim()


class OpCounter(TorchDispatchMode):
    """Counts aten ops issued by the caller: copies (and their bytes), views, per-shard views
    (unbind outputs and selects along dim 0, the shard dimension).

    Ops inside a custom operator's kernel are not seen (the mode is off while it runs).
    """

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.copy_bytes = 0
        self.collective_bytes = 0  # written by the stand-in collectives (`--decode-step`)
        self.per_shard_views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if name in COPY_OPS:
            outputs = result if isinstance(result, (list, tuple)) else [result]
            self.copy_bytes += sum(t.numel() * t.element_size() for t in outputs)
        if name == "collective":
            self.collective_bytes += args[0].numel() * args[0].element_size()
        if name == "unbind" or (name == "select" and _dim_argument(args, kwargs) == 0):
            self.per_shard_views += len(result) if isinstance(result, (list, tuple)) else 1
        return result

    def _count(self, names: set[str]) -> int:
        return sum(n for op, n in self.ops.items() if op in names)

    def summary(self) -> dict[str, int]:
        return {
            "copies": self._count(COPY_OPS),
            "copy_bytes": self.copy_bytes,
            "views": self._count(VIEW_OPS),
            "per_shard_views": self.per_shard_views,
            "ops": sum(self.ops.values()),
        }


def count_ops(fn: Callable[[], object]) -> dict[str, int]:
    """What `fn` issues, as OpCounter.summary()."""
    with OpCounter() as counter:
        fn()
    return counter.summary()


def vllm_ascend_pack(out: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """vllm-ascend's send buffer: `[bs, dcp*H, D]` + `[bs, dcp*H, 1]` -> `[dcp*H, D+1, bs]`."""
    return torch.cat([out.float(), lse.float()], dim=-1).permute(1, 2, 0).contiguous()


def vllm_ascend_merge(buffer: torch.Tensor, head_dim: int, dcp: int, pcp: int = 1,
                      update_list=None):  # fmt: skip
    """vllm-ascend's merge of its `[pcp*bs, dcp*H, D+1]` buffer through per-shard lists
    (`update_list`: the TensorList operator, by default this script's CPU one)."""
    rows, total_heads, width = buffer.shape
    bs, heads = rows // pcp, total_heads // dcp
    shards = buffer.view(pcp, bs, dcp, heads, width).permute(0, 2, 1, 3, 4).contiguous()
    out, lse = shards.view(-1, bs, heads, width).split([head_dim, 1], dim=-1)
    out_list, lse_list = out.flatten(1, 2).unbind(0), lse.flatten(1, -1).unbind(0)
    update_list = update_list or torch.ops.bench_cp.attention_update_list
    merged, _ = update_list(list(lse_list), list(out_list), 0)
    return merged.view(-1, heads, head_dim)


def make_case(sp: int, bs: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Local partials and both exchanged buffers for one (sp, bs) case (pcp = 1)."""
    partial = torch.randn(sp, bs, HEADS, HEAD_DIM, generator=generator)
    lse = torch.randn(sp, bs, HEADS, generator=generator) * 3
    ours = torch.cat([partial, lse.unsqueeze(-1)], dim=-1).contiguous()  # [sp, bs, H, D+1]
    theirs = ours.permute(0, 2, 3, 1).reshape(sp * HEADS, HEAD_DIM + 1, bs)  # after all_to_all
    local = torch.randn(bs, sp * HEADS, HEAD_DIM, generator=generator)
    local_lse = torch.randn(bs, sp * HEADS, 1, generator=generator)
    return {
        "partial": partial,
        "lse": lse,
        "ours": ours,
        "theirs": theirs.permute(2, 0, 1),
        "local": local,
        "local_lse": local_lse,
    }


def reference(case: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64 merge of the case's partials: `[bs, H, D]`."""
    lse = case["lse"].double()
    weights = torch.softmax(lse, dim=0).unsqueeze(-1)
    return (weights * case["partial"].double()).sum(dim=0)


def median_ms(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median wall time per fn, the fns interleaved so that drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def run_case(sp: int, bs: int, repeats: int, generator: torch.Generator) -> dict:
    case = make_case(sp, bs, generator)
    fns = {
        "tensor_merge": lambda: merge_cp_buffer(case["ours"]),
        "list_merge": lambda: vllm_ascend_merge(case["theirs"], HEAD_DIM, dcp=sp),
        "tensor_pack": lambda: pack_out_lse(case["local"], case["local_lse"], sp),
        "list_pack": lambda: vllm_ascend_pack(case["local"], case["local_lse"]),
    }
    for fn in fns.values():  # warm-up
        fn()
    ms = median_ms(fns, repeats)
    expected = reference(case)
    error = {
        name: (fns[f"{name}_merge"]().double() - expected).abs().max().item()
        for name in ("tensor", "list")
    }
    return {
        "sp": sp,
        "bs": bs,
        "N": bs * HEADS,
        "D": HEAD_DIM,
        "ms": {name: round(value, 4) for name, value in ms.items()},
        "merge_ratio": round(ms["list_merge"] / ms["tensor_merge"], 3),
        "pack_merge_ratio": round(
            (ms["list_merge"] + ms["list_pack"]) / (ms["tensor_merge"] + ms["tensor_pack"]), 3
        ),
        "max_error": error,
        "counts": {name: count_ops(fn) for name, fn in fns.items()},
    }


_bench_lib.define("collective(Tensor(a!) received, Tensor sent) -> ()")


def _collective(received, sent):
    """A stand-in collective: fills `received` (all_to_all: same size; all-gather: world
    copies) from `sent`, as the NPU's collective would write it."""
    received.view(-1, sent.numel()).copy_(sent.reshape(1, -1))


_bench_lib.impl("collective", _collective, "CPU")
COLLECTIVE = torch.ops.bench_cp.collective
STEP_CONFIGS = ((2, 1), (1, 2), (2, 2))  # (pcp, dcp)
STEP_BATCHES = (1, 4, 16, 64)
KERNEL_OPS = COPY_OPS | {"attention_update", "attention_update_list", "collective"}


def _gather(buffer: torch.Tensor, pcp: int) -> torch.Tensor:
    gathered = buffer.new_empty((pcp * buffer.shape[0], *buffer.shape[1:]))
    COLLECTIVE(gathered, buffer)
    return gathered


def ours_step(out: torch.Tensor, lse: torch.Tensor, pcp: int, dcp: int) -> torch.Tensor:
    """Our pair per layer: pack, all_to_all (DCP), all-gather (PCP), merge strided views."""
    buffer = pack_out_lse(out, lse, dcp)
    if dcp > 1:
        received = torch.empty_like(buffer)
        COLLECTIVE(received, buffer)
        buffer = received
    if pcp > 1:
        buffer = _gather(buffer, pcp)
    return merge_cp_buffer(buffer)


def vllm_ascend_step(out: torch.Tensor, lse: torch.Tensor, pcp: int, dcp: int,
                     update_list=None) -> torch.Tensor:  # fmt: skip
    """vllm-ascend 0.23's pair per layer, as `_process_attn_out_lse` and `_npu_attention_update`
    (0.23.0.post1 `common_cp.py`) run it."""
    lse, out = lse.to(torch.float32), out.to(torch.float32)
    buffer = torch.cat([out, lse], dim=-1)
    if dcp > 1:
        buffer = buffer.permute([1, 2, 0]).contiguous()
        received = torch.empty_like(buffer)
        COLLECTIVE(received, buffer)
        buffer = received.permute([2, 0, 1])
    if pcp > 1:
        buffer = _gather(buffer.contiguous(), pcp)
    return vllm_ascend_merge(buffer, out.shape[-1], dcp=dcp, pcp=pcp, update_list=update_list)


def step_counts(fn: Callable[[], object]) -> dict[str, int]:
    """Device operators (copies and casts, collectives, merge operators; allocations and
    views launch nothing), the bytes copies write and the bytes the collectives write."""
    with OpCounter() as counter:
        fn()
    return {
        "device_ops": counter._count(KERNEL_OPS), "copies": counter._count(COPY_OPS),
        "copy_bytes": counter.copy_bytes, "collectives": counter.ops["collective"],
        "collective_bytes": counter.collective_bytes,
        "per_shard_views": counter.per_shard_views, "views": counter._count(VIEW_OPS),
    }  # fmt: skip


def decode_step_case(pcp: int, dcp: int, bs: int, generator: torch.Generator) -> dict:
    """One layer's merge per decode step on both sides: what each launches and copies, and
    whether their results agree."""
    out = torch.randn(bs, dcp * HEADS, HEAD_DIM, generator=generator).bfloat16()
    lse = torch.randn(bs, dcp * HEADS, 1, generator=generator) * 3
    fns = {"ours": lambda: ours_step(out, lse, pcp, dcp),
           "vllm_ascend": lambda: vllm_ascend_step(out, lse, pcp, dcp)}  # fmt: skip
    for fn in fns.values():
        fn()
    difference = (fns["ours"]() - fns["vllm_ascend"]()).abs().max().item()
    return {"pcp": pcp, "dcp": dcp, "bs": bs, "max_difference": difference,
            "counts": {name: step_counts(fn) for name, fn in fns.items()}}  # fmt: skip


def decode_step_table(batches=STEP_BATCHES, configs=STEP_CONFIGS) -> list[dict]:
    """`--decode-step`: the table (module docstring), printed as Markdown rows."""
    generator = torch.Generator().manual_seed(0)
    rows = [decode_step_case(pcp, dcp, bs, generator) for pcp, dcp in configs for bs in batches]
    print("| pcp x dcp | bs | device ops: ours / vllm-ascend | copies | bytes copied "
          "| per-shard views | bytes the collectives write |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ours, theirs = r["counts"]["ours"], r["counts"]["vllm_ascend"]
        print(f"| {r['pcp']}x{r['dcp']} | {r['bs']} | {ours['device_ops']} / "
              f"{theirs['device_ops']} | {ours['copies']} / {theirs['copies']} | "
              f"{ours['copy_bytes']} / {theirs['copy_bytes']} | {ours['per_shard_views']} / "
              f"{theirs['per_shard_views']} | {ours['collective_bytes']} / "
              f"{theirs['collective_bytes']} |")  # fmt: skip
    return rows


def full_graph_case(pcp: int, dcp: int, bs: int, generator: torch.Generator) -> dict:
    """`--full-graph`: each side's pair captured in one graph on the stand-in's `npu` device,
    as vllm-ascend's full decode graph holds it; then new inputs copied into the captured
    buffers and the graph replayed. Per side: the graph's tasks (what a replay launches), the
    host work a replay needs (task updates; the per-shard TensorList is built at capture
    only), and the replayed result against the same pair run eagerly on the new inputs."""
    import torch_npu

    from vllm_npu_ext.emulator.device import graphs

    shape = (bs, dcp * HEADS, HEAD_DIM)
    out = torch.randn(*shape, generator=generator).bfloat16().to("npu")
    lse = (torch.randn(*shape[:2], 1, generator=generator) * 3).to("npu")
    sides = {"ours": lambda: ours_step(out, lse, pcp, dcp),
             "vllm_ascend": lambda: vllm_ascend_step(out, lse, pcp, dcp,
                                                     torch_npu.npu_attention_update)}  # fmt: skip
    row, captured, captured_graphs = {"pcp": pcp, "dcp": dcp, "bs": bs, "graphs": {}}, {}, {}
    for name, fn in sides.items():
        captured_graphs[name] = torch.npu.NPUGraph()
        with torch.npu.graph(captured_graphs[name]):
            captured[name] = fn()
    out.copy_(torch.randn(*shape, generator=generator).bfloat16())
    lse.copy_(torch.randn(*shape[:2], 1, generator=generator) * 3)
    for name, fn in sides.items():
        graph, updates = captured_graphs[name], graphs.stats["task_updates"]
        graph.replay()
        kinds = collections.Counter(
            "copies" if op.split(".")[1] in COPY_OPS else
            "collectives" if op.startswith("bench_cp.collective") else "merge"
            for op in graph.operators
        )  # fmt: skip
        row["graphs"][name] = {
            "tasks": len(graph.operators), **kinds,
            "task_updates_per_replay": graphs.stats["task_updates"] - updates,
            "replay_vs_eager": (captured[name].cpu() - fn().cpu()).abs().max().item(),
        }  # fmt: skip
    difference = captured["ours"].cpu() - captured["vllm_ascend"].cpu()
    row["max_difference"] = difference.abs().max().item()
    for graph in captured_graphs.values():
        graph.reset()
    return row


def full_graph_table(batches=STEP_BATCHES, configs=STEP_CONFIGS) -> list[dict]:
    """`--decode-step --full-graph` (see `full_graph_case`): installs the torch_npu stand-in
    and its `npu` device in this process, with our operator's host build as its kernel."""
    from vllm_npu_ext import emulator
    from vllm_npu_ext.emulator.operators import npu_ext_cann

    emulator.install_stand_in()
    npu_ext_cann.install_on_npu()
    torch.npu.set_device(0)
    generator = torch.Generator().manual_seed(0)
    rows = [full_graph_case(pcp, dcp, bs, generator) for pcp, dcp in configs for bs in batches]
    replayed = max(side["replay_vs_eager"] for r in rows for side in r["graphs"].values())
    print(f"replayed graphs vs the same pairs run eagerly: max difference {replayed}")
    print("| pcp x dcp | bs | graph tasks: ours / vllm-ascend | copies | collectives | merge "
          "| task updates per replay |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ours, theirs = r["graphs"]["ours"], r["graphs"]["vllm_ascend"]
        cells = [f"{ours.get(k, 0)} / {theirs.get(k, 0)}" for k in
                 ("tasks", "copies", "collectives", "merge", "task_updates_per_replay")]
        print(f"| {r['pcp']}x{r['dcp']} | {r['bs']} | " + " | ".join(cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sp", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--bs", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: least disturbed by other load)"
    )
    parser.add_argument(
        "--decode-step", action="store_true",
        help="one layer's merge pair per decode step, ours vs vllm-ascend's (module docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--full-graph", action="store_true",
        help="with --decode-step: each pair captured in an NPU graph on the torch_npu stand-in "
        "and replayed (`full_graph_case`)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.full_graph and not args.decode_step:
        parser.error("--full-graph goes with --decode-step")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        if args.decode_step:
            rows = full_graph_table() if args.full_graph else decode_step_table()
            summary = {"decode_step": rows}
            print(json.dumps({"max_difference": max(r["max_difference"] for r in rows)}))
            return summary
        generator = torch.Generator().manual_seed(0)
        results = [run_case(sp, bs, args.repeats, generator) for sp in args.sp for bs in args.bs]
    finally:
        torch.set_num_threads(threads_before)
    for r in results:
        print(
            f"sp={r['sp']} N={r['N']:5d}: merge tensor {r['ms']['tensor_merge']:.3f} ms, "
            f"list {r['ms']['list_merge']:.3f} ms (x{r['merge_ratio']}); pack+merge "
            f"x{r['pack_merge_ratio']}; copies tensor/list "
            f"{r['counts']['tensor_merge']['copies']}/{r['counts']['list_merge']['copies']}, "
            f"per-shard views {r['counts']['tensor_merge']['per_shard_views']}/"
            f"{r['counts']['list_merge']['per_shard_views']}"
        )
    summary = {
        "merge_ratios": {f"sp{r['sp']}_N{r['N']}": r["merge_ratio"] for r in results},
        "pack_merge_ratios": {f"sp{r['sp']}_N{r['N']}": r["pack_merge_ratio"] for r in results},
        "min_merge_ratio": min(r["merge_ratio"] for r in results),
        "max_error": max(max(r["max_error"].values()) for r in results),
        "tensor_merge_copies": max(r["counts"]["tensor_merge"]["copies"] for r in results),
        "tensor_merge_per_shard_views": max(
            r["counts"]["tensor_merge"]["per_shard_views"] for r in results
        ),
        "list_merge_copies": max(r["counts"]["list_merge"]["copies"] for r in results),
        "list_merge_per_shard_views": max(
            r["counts"]["list_merge"]["per_shard_views"] for r in results
        ),
        "copy_bytes_largest_case": {
            name: results[-1]["counts"][name]["copy_bytes"] for name in results[-1]["counts"]
        },
        "repeats": args.repeats,
        "threads": args.threads,
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
