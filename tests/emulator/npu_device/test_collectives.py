"""HCCL's collectives on `npu` tensors in 2 ranks: the stand-in's `hccl` group hands gloo the
host views of the npu memory, so results land in the npu tensors themselves (views included)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from support.cp_ranks import run_ranks

WORLD = 2


def rank_worker(rank: int, world: int) -> dict:
    def npu(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype, device="npu")

    out: dict = {"backend": dist.get_backend(), "group": type(dist.group.WORLD).__name__}
    x = npu([1.0, 2.0, 3.0]) + 10 * rank
    dist.all_reduce(x)
    out["all_reduce"] = (x.device.type, x.cpu().tolist())
    base = torch.zeros(3, 4, device="npu")
    row = base[1]  # a contiguous view: the result must reach the base
    row.fill_(rank + 1)
    dist.all_reduce(row, op=dist.ReduceOp.MAX)
    out["view_base"] = base.cpu().tolist()
    gathered = torch.empty(world * 2, device="npu", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(gathered, npu([rank, rank + 0.5], torch.bfloat16))
    out["all_gather_into_tensor"] = gathered.float().cpu().tolist()
    pieces = [torch.empty(2, device="npu") for _ in range(world)]
    dist.all_gather(pieces, npu([rank, -rank]))
    out["all_gather"] = [p.cpu().tolist() for p in pieces]
    scattered = torch.empty(2, device="npu")
    dist.reduce_scatter_tensor(scattered, torch.arange(4, dtype=torch.float32, device="npu") + rank)
    out["reduce_scatter_tensor"] = scattered.cpu().tolist()
    shared = npu([float(rank)] * 3)
    dist.broadcast(shared, src=1)
    out["broadcast"] = shared.cpu().tolist()
    exchanged = torch.empty(world, device="npu")
    dist.all_to_all_single(exchanged, npu([rank * 10 + 0, rank * 10 + 1]))
    out["all_to_all_single"] = exchanged.cpu().tolist()
    if rank == 0:
        dist.send(npu([7.0, 8.0]), dst=1)
    else:
        received = torch.empty(2, device="npu")
        dist.recv(received, src=0)
        out["recv"] = received.cpu().tolist()
    functional = torch.ops._c10d_functional.all_reduce(
        npu([1.0, rank]), "sum", dist.group.WORLD.group_name
    )
    functional = torch.ops._c10d_functional.wait_tensor(functional)
    out["functional_all_reduce"] = (functional.device.type, functional.cpu().tolist())
    cpu = torch.tensor([rank + 1.0])
    dist.all_reduce(cpu)
    out["cpu_all_reduce"] = cpu.tolist()
    out.update(_captured(rank, world))
    dist.barrier()
    return out


def _captured(rank: int, world: int) -> dict:
    """Collectives in an NPU graph: recorded in capture order, run again by each replay on the
    captured buffers (a new input is seen, the outputs are rewritten), functional ones too."""
    from vllm_npu_ext.emulator.device import graphs

    x = torch.full((2,), float(rank + 1), device="npu")
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        summed = x * 1
        dist.all_reduce(summed)
        exchanged = torch.empty(world, device="npu")
        dist.all_to_all_single(exchanged, x + 10 * rank)
        gathered = torch.empty(world * 2, device="npu")
        dist.all_gather_into_tensor(gathered, x)
        functional = torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(
            x * 1, "sum", dist.group.WORLD.group_name))  # fmt: skip
    x.fill_(10.0 * (rank + 1))
    graph.replay()
    return {
        "graph collectives": graph.collectives,
        "graph operators": [op for op in graph.operators if "c10d" in op],
        "replayed all_reduce": summed.cpu().tolist(),
        "replayed all_to_all_single": exchanged.cpu().tolist(),
        "replayed all_gather_into_tensor": gathered.cpu().tolist(),
        "replayed functional all_reduce": functional.cpu().tolist(),
        "collective nodes": graphs.stats["collective_nodes"],
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(rank_worker, WORLD, (), tmp_path_factory.mktemp("ranks"), backend="hccl")


def test_the_default_group_is_hccl_over_gloo(results):
    assert {(r["backend"], r["group"]) for r in results} == {("hccl", "HcclGroup")}


@pytest.mark.parametrize("rank", range(WORLD))
def test_collectives_write_the_npu_tensors(results, rank):
    r = results[rank]
    assert r["all_reduce"] == ["npu", [12.0, 14.0, 16.0]]
    assert r["view_base"] == [[0.0] * 4, [2.0] * 4, [0.0] * 4]
    assert r["all_gather_into_tensor"] == [0.0, 0.5, 1.0, 1.5]
    assert r["all_gather"] == [[0.0, 0.0], [1.0, -1.0]]
    assert r["reduce_scatter_tensor"] == [[1.0, 3.0], [5.0, 7.0]][rank]
    assert r["broadcast"] == [1.0, 1.0, 1.0]
    assert r["all_to_all_single"] == [[0.0, 10.0], [1.0, 11.0]][rank]
    assert r["functional_all_reduce"] == ["npu", [2.0, 1.0]]
    assert r["cpu_all_reduce"] == [3.0]
    if rank == 1:
        assert r["recv"] == [7.0, 8.0]


@pytest.mark.parametrize("rank", range(WORLD))
def test_a_captured_graph_runs_its_collectives_again_on_every_replay(results, rank):
    """HCCL operators are tasks of an ACL graph (`collectives`, `graphs.CollectiveNode`): each
    replay exchanges the values the replayed operators wrote into the captured buffers."""
    r = results[rank]
    assert r["graph collectives"] == [
        "hccl.allreduce", "hccl.alltoall_base", "hccl._allgather_base", "hccl.allreduce"]
    assert r["graph operators"] == []  # the functional op's kernel is host code, entered
    assert r["collective nodes"] == 4
    assert r["replayed all_reduce"] == [30.0, 30.0]
    assert r["replayed all_to_all_single"] == [10.0, 30.0]  # x + 10 * rank, one from each
    assert r["replayed all_gather_into_tensor"] == [10.0, 10.0, 20.0, 20.0]
    assert r["replayed functional all_reduce"] == [30.0, 30.0]
