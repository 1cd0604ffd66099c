"""The stand-in binds an `int[]`/`SymInt[]` argument as torch's own binder does for integer
sequences, checked against a real torch operator (`aten::view`'s `SymInt[] size`), and refuses
what torch would bind although it is no integer sequence."""

from __future__ import annotations

import array

import numpy as np
import pytest
import torch

from vllm_npu_ext.emulator.runtime import schema

SYMINT_LIST = {"name": "actual_seq_lengths_kv", "type": "SymInt[]?"}
INT_LIST = {"name": "actual_seq_qlen", "type": "int[]?"}

INTEGER_SEQUENCES = {
    "list": [2, 3], "tuple": (2, 3), "range": range(2, 4),
    "numpy int64": np.array([2, 3]), "numpy int32": np.array([2, 3], dtype=np.int32),
    "numpy uint8": np.array([2, 3], dtype=np.uint8), "numpy items": [np.int64(2), np.int32(3)],
    "tensor int64": torch.tensor([2, 3]), "tensor int32": torch.tensor([2, 3], dtype=torch.int32),
    "0-d tensor items": [torch.tensor(2), torch.tensor(3)],
}  # fmt: skip
# torch binds these too, but they are no integer sequences: the stand-in refuses them.
LOOSE = {
    "numpy float32": np.array([2.0, 3.0], dtype=np.float32), "bool items": [2, True, 3],
    "dict": {2: 0, 3: 0}, "bytes": b"\x02\x03", "array module": array.array("i", [2, 3]),
    "2-D tensor, one column": torch.tensor([[2], [3]]), "iterator": iter([2, 3]),
}  # fmt: skip
# torch refuses these as well.
NOT_SEQUENCES = {
    "float items": [2.0, 3.0], "float tensor": torch.tensor([2.0, 3.0]), "int": 6,
    "0-d tensor": torch.tensor(6), "string": "23", "nested lists": [[2], [3]],
}  # fmt: skip


def torch_binds(value) -> bool:
    """Whether aten::view takes `value` as its size (6 elements fit any shape used here)."""
    try:
        torch.ops.aten.view.default(torch.zeros(6), value)
    except RuntimeError:
        return False
    return True


def stand_in_binds(param, value):
    try:
        return schema.check_type("op", param, value)
    except TypeError:
        return None


@pytest.mark.parametrize("name", INTEGER_SEQUENCES)
@pytest.mark.parametrize("param", [SYMINT_LIST, INT_LIST], ids=["SymInt[]", "int[]"])
def test_integer_sequences_torch_binds_are_bound_as_python_ints(param, name):
    value = INTEGER_SEQUENCES[name]
    assert torch.ops.aten.view.default(torch.zeros(6), value).shape == (2, 3)
    bound = stand_in_binds(param, value)
    assert bound == [2, 3] and all(type(item) is int for item in bound)


@pytest.mark.parametrize("name", [*LOOSE, *NOT_SEQUENCES])
def test_what_is_no_integer_sequence_is_refused_naming_the_argument(name):
    value = {**LOOSE, **NOT_SEQUENCES}[name]
    if name in LOOSE and name != "iterator":
        assert torch_binds(value)  # torch's looser binder takes it
    elif name in NOT_SEQUENCES:
        assert not torch_binds(value)
    with pytest.raises(TypeError, match="'actual_seq_lengths_kv'.*sequence of integers"):
        schema.check_type("op", SYMINT_LIST, value)


def test_torch_binds_an_iterator_as_an_empty_list():
    """Why the stand-in refuses iterators: torch's first pass over a `SymInt[]` argument
    consumes it and the list it binds is empty (view to shape [] fails for 6 elements)."""
    with pytest.raises(RuntimeError, match=r"shape '\[\]'"):
        torch.ops.aten.view.default(torch.zeros(6), iter([2, 3]))
