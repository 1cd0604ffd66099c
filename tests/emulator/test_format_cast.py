"""The emulated `npu_format_cast` (emulator/operators/format_cast.py): what vllm-ascend calls on
linear weights after loading (`maybe_trans_nz`), against the torch-npu 2.10.0.post4 contract."""

from __future__ import annotations

import pytest
import torch
from support.dispatch_record import RecordOps

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.operators.format_cast import ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_ND
from vllm_npu_ext.emulator.runtime import schema as _schema

BF16 = torch.bfloat16


def weight(*shape, dtype=BF16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32, torch.int8])
@pytest.mark.parametrize("acl_format", [ACL_FORMAT_FRACTAL_NZ, ACL_FORMAT_ND])
def test_a_cast_keeps_shape_dtype_and_values_in_a_new_tensor(acl_format, dtype):
    w = weight(48, 32, dtype=dtype)
    out = emulator.npu_format_cast(w, acl_format)
    assert out.shape == w.shape and out.dtype == w.dtype and out.is_contiguous()
    assert torch.equal(out, w)
    assert out.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()


def test_a_transposed_view_comes_back_contiguous_with_its_logical_values():
    w = weight(32, 48).t()
    out = emulator.npu_format_cast(w, ACL_FORMAT_FRACTAL_NZ)
    assert out.is_contiguous() and torch.equal(out, w)


def test_a_cast_weight_reads_the_same_in_npu_linear():
    """vllm-ascend's use: `layer.weight.data = npu_format_cast(layer.weight.data, 29)`, then the
    weight feeds npu_linear (documented for ND and FRACTAL_NZ weights)."""
    x, w = weight(5, 32), weight(48, 32)
    param = torch.nn.Parameter(w.clone(), requires_grad=False)
    param.data = emulator.npu_format_cast(param.data, ACL_FORMAT_FRACTAL_NZ)
    assert torch.equal(emulator.npu_linear(x, param), emulator.npu_linear(x, w))


def test_calls_are_counted():
    emulator.reset_counts()
    emulator.npu_format_cast(weight(4, 4), ACL_FORMAT_FRACTAL_NZ)
    emulator.npu_format_cast(weight(4, 4), ACL_FORMAT_ND)
    assert emulator.calls == {"npu_format_cast": 2}


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: emulator.npu_format_cast(weight(4, 4), 28), ValueError, "acl_format"),
    (lambda: emulator.npu_format_cast(weight(4, 4), -1), ValueError, "acl_format"),
    (lambda: emulator.npu_format_cast(weight(1, 4, 4, 16), 3), NotImplementedError, "NC1HWC0"),
    (lambda: emulator.npu_format_cast(weight(4, 4), 50), NotImplementedError, "FRACTAL_NZ_C0_16"),
    (lambda: emulator.npu_format_cast(weight(4, 4), 29, customize_dtype=1), NotImplementedError,
     "customize_dtype"),
    (lambda: emulator.npu_format_cast(weight(4, 4), 29, input_dtype=1), NotImplementedError,
     "input_dtype"),
    (lambda: emulator.npu_format_cast(weight(4, 4), weight(4, 4)), NotImplementedError,
     r"npu_format_cast\.Tensor is not emulated"),
    (lambda: emulator.npu_format_cast(weight(4, 4), 29, 1), TypeError, "positional"),
    (lambda: emulator.npu_format_cast(weight(4, 4), "FRACTAL_NZ"), TypeError, "must be int"),
    (lambda: emulator.npu_format_cast(weight(4, 4)), TypeError, "missing required argument"),
], ids=["unknown format", "UNDEFINED", "NC1HWC0", "NZ_C0_16", "customize_dtype", "input_dtype",
        "Tensor overload", "positional dtype", "format name", "no format"])  # fmt: skip
def test_calls_outside_the_emulated_contract_raise(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_unknown_names_stay_strict():
    """Only the cast is emulated: torch_npu's other format functions still raise."""
    with pytest.raises(AttributeError, match="get_npu_format is not implemented"):
        emulator.get_npu_format  # noqa: B018
    with pytest.raises(AttributeError, match="npu_format_cast_ is not implemented"):
        emulator.npu_format_cast_  # noqa: B018


def test_registered_with_the_wheels_schema_strings():
    schemas = _schema.schema_document()["operators"]["npu_format_cast"]
    assert {s["overload"] for s in schemas} == {"", "Tensor"}
    for schema in schemas:
        overload = getattr(torch.ops.npu.npu_format_cast, schema["overload"] or "default")
        assert overload._schema == torch._C.parse_schema("npu::" + schema["schema"])
    assert emulator.OPERATORS["npu_format_cast"] is emulator.npu_format_cast


def test_one_opaque_operator_whose_fake_kernel_matches_the_cpu_kernel():
    w = weight(48, 32).t()
    with RecordOps() as mode:
        emulator.npu_format_cast(w, ACL_FORMAT_FRACTAL_NZ)
    assert [func for func, _, _ in mode.seen] == [torch.ops.npu.npu_format_cast.default]
    ((func, args, kwargs),) = mode.seen
    torch.library.opcheck(func, args, kwargs, test_utils=("test_schema", "test_faketensor"))


def test_a_compiled_cast_is_one_operator_without_a_graph_break():
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    w = weight(48, 32)
    compiled = torch.compile(lambda t: emulator.npu_format_cast(t, ACL_FORMAT_FRACTAL_NZ) * 2,
                             fullgraph=True, backend="eager")  # fmt: skip
    emulator.reset_counts()
    torch.testing.assert_close(compiled(w), w * 2)
    assert emulator.calls == {"npu_format_cast": 1}
    assert not dynamo_utils.counters["graph_break"]
