"""benchmarks/op_counter.py, the counter behind count_ops.py's launches and bytes per layer:
what counts as a launch and how many bytes a launch moves, on hermetic operators."""

from __future__ import annotations

import pytest
import torch
from support.scripts import load_script

op_counter = load_script("benchmarks/op_counter.py")

_LIB = torch.library.Library("op_counter_test", "DEF")  # test-only operators
_LIB.define("rotate(Tensor positions, Tensor cos_sin_cache, Tensor x) -> Tensor")
_LIB.define("cache_write(Tensor(a!) key_cache, Tensor key, Tensor slot_mapping) -> ()")


def _rotate(positions, cos_sin_cache, x):
    return x * cos_sin_cache[positions].sum(-1, keepdim=True)


def _cache_write(key_cache, key, slot_mapping):
    key_cache.view(-1, *key_cache.shape[2:])[slot_mapping] = key


_LIB.impl("rotate", _rotate, "CPU")
_LIB.impl("cache_write", _cache_write, "CPU")


def _count(fn) -> op_counter.OpCounter:
    counter = op_counter.OpCounter(measure_bytes=True)
    with counter:
        fn()
    return counter


def test_an_operator_reads_its_inputs_and_writes_its_result():
    a, b = torch.ones(64), torch.ones(64)
    counter = _count(lambda: torch.add(a, b))
    assert counter.launches == {"aten.add.Tensor": 1}
    assert counter.bytes["aten.add.Tensor"] == [2 * 256, 256]


def test_views_and_allocations_launch_nothing():
    a = torch.ones(4, 16)
    counter = _count(lambda: (a.view(16, 4), a.t(), torch.empty(8), a[1:]))
    assert not counter.launches


def test_a_copy_onto_the_same_data_is_skipped_as_pytorch_skips_it():
    a, b = torch.ones(32), torch.zeros(32)
    counter = _count(lambda: a.copy_(a))
    assert not counter.launches
    counter = _count(lambda: a.copy_(b))  # other data: a kernel, 128 bytes each way
    assert counter.launches == {"aten.copy_.default": 1}
    assert counter.bytes["aten.copy_.default"] == [128, 128]
    counter = _count(lambda: a[:16].copy_(a[16:]))  # the same storage, other data
    assert counter.launches == {"aten.copy_.default": 1}


def test_a_table_read_by_position_counts_the_rows_read():
    table, x = torch.ones(4096, 64), torch.ones(5, 8)
    positions = torch.tensor([0, 1, 2, 3, 4])
    counter = _count(lambda: torch.ops.op_counter_test.rotate(positions, table, x))
    read, written = counter.bytes["op_counter_test.rotate"]
    assert read == positions.nbytes + 5 * 64 * 4 + x.nbytes  # 5 rows, not 4096
    assert written == x.nbytes


@pytest.mark.parametrize("tokens", [3, 7])
def test_a_cache_written_by_slot_counts_the_rows_written(tokens):
    cache = torch.zeros(16, 128, 2, 8)  # [blocks, block_size, heads, head_dim]
    key, slots = torch.ones(tokens, 2, 8), torch.arange(tokens) * 3
    counter = _count(lambda: torch.ops.op_counter_test.cache_write(cache, key, slots))
    read, written = counter.bytes["op_counter_test.cache_write"]
    assert written == tokens * 2 * 8 * 4  # the rows written, not the 64 KiB cache
    assert read == key.nbytes + slots.nbytes
