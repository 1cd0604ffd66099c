"""Run a function in several gloo processes on loopback, with context-parallel groups."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from support.server import free_port

TIMEOUT_S = 60


def _rank_entry(rank, world, port, worker, args, result_dir, timeout_s=TIMEOUT_S,
                backend="gloo"):  # fmt: skip
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "hccl":  # the torch_npu stand-in's: gloo carrying host and npu tensors
        from vllm_npu_ext import emulator

        emulator.install_stand_in()
    dist.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
    )
    try:
        result = worker(rank, world, *args)
        Path(result_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run_ranks(
    worker, world: int, args: tuple, result_dir: Path, timeout_s: int = TIMEOUT_S,
    backend: str = "gloo",
) -> list:
    """Run `worker(rank, world, *args)` in `world` spawned gloo processes; their results.

    backend "hccl" installs the torch_npu stand-in in each rank first (its `hccl` group).
    worker must be a module-level function returning something JSON-serialisable. Each
    collective may wait `timeout_s`; the whole run, twice that.
    """
    context = mp.start_processes(
        _rank_entry,
        args=(world, free_port(), worker, args, str(result_dir), timeout_s, backend),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + 2 * timeout_s
    # join() returns False while some rank still runs, raises if one failed.
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.terminate()
            pytest.fail(f"ranks did not finish within {2 * timeout_s} s")
    return [json.loads(Path(result_dir, f"rank{r}.json").read_text()) for r in range(world)]


def cp_groups(rank: int, dcp: int, pcp: int):
    """This rank's (DCP group, PCP group); rank = pcp_rank * dcp + dcp_rank."""
    mine = []
    for pcp_rank in range(pcp):
        ranks = [pcp_rank * dcp + d for d in range(dcp)]
        group = dist.new_group(ranks)
        mine += [group] if rank in ranks else []
    for dcp_rank in range(dcp):
        ranks = [p * dcp + dcp_rank for p in range(pcp)]
        group = dist.new_group(ranks)
        mine += [group] if rank in ranks else []
    return tuple(mine)
