"""attention_update (vllm_npu_ext.ops.attention_update): numerics, argument rules, dispatch."""

from __future__ import annotations

import pytest
import torch
from support.vllm_reference import lse_weighted_combine as _lse_weighted_combine
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops
from vllm_npu_ext.ops import attention_update as update_module
from vllm_npu_ext.ops.attention_update import (
    attention_update,
    attention_update_fake,
    attention_update_npu,
    attention_update_reference,
    check_attention_update_args,
)
from vllm_npu_ext.selfcheck.tolerances import op_tolerance

NEG_INF = float("-inf")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_inputs(sp, num_rows, head_dim, dtype, *, strided=False, empty_rows=(), seed=0):
    """lse fp32 [sp, N] with about a quarter of the shards empty (-inf), out [sp, N, D].

    strided: out and lse are views of one [sp, N, D+1] buffer, as the CP merge passes them.
    empty_rows: rows where every shard is empty; their out is NaN to prove it is ignored.
    """
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(sp, num_rows, head_dim + 1, generator=generator)
    buffer[..., head_dim] *= 4
    empty = torch.rand(sp, num_rows, generator=generator) < 0.25
    empty[0] = False  # shard 0 keeps its keys, so only empty_rows have none at all
    buffer[..., head_dim][empty] = NEG_INF
    for row in empty_rows:
        buffer[:, row, head_dim] = NEG_INF
        buffer[:, row, :head_dim] = float("nan")
    if strided:
        return buffer[..., head_dim], buffer[..., :head_dim].to(dtype)
    return buffer[..., head_dim].contiguous(), buffer[..., :head_dim].contiguous().to(dtype)


def float64_merge(lse, out):
    """Independent float64 oracle: logsumexp over shards, softmax weights."""
    lse64 = lse.double()
    total = torch.logsumexp(lse64, dim=0)
    weights = torch.exp(lse64 - total).nan_to_num(0.0).unsqueeze(-1)
    return (weights * out.double().nan_to_num(0.0)).sum(dim=0), total


def merge_on(path, lse, out, monkeypatch):
    """`attention_update(lse, out, 1)` on `path`: "cpu", the CPU kernel (the PyTorch
    reference), or "custom", the NPU path under the emulator through our CANN op, whose
    emulated kernel is our AscendC kernel source built for the host."""
    if path == "cpu":
        return attention_update(lse, out, update_type=1)
    monkeypatch.setenv(update_module.KERNEL_SWITCH, "custom")
    emulated_cann_ops.calls.clear()
    with emulator.emulated(), emulated_cann_ops.emulated():
        merged = attention_update(lse, out, update_type=1)
    assert emulated_cann_ops.calls[emulated_cann_ops.OP_NAME] == 1
    return merged


@pytest.mark.parametrize("path", ["cpu", "custom"])
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", [8, 64, 128, 512])
@pytest.mark.parametrize("sp", [1, 2, 4, 8, 16])
def test_matches_float64_reference(sp, head_dim, dtype, strided, path, monkeypatch):
    lse, out = make_inputs(sp, 37, head_dim, dtype, strided=strided, empty_rows=(5,))
    merged, lse_out = merge_on(path, lse, out, monkeypatch)
    expected, expected_lse = float64_merge(lse, out)
    tol = op_tolerance("npu_attention_update", dtype)
    atol, rtol = tol.atol, tol.rtol
    assert merged.dtype == dtype and merged.shape == (37, head_dim)
    torch.testing.assert_close(merged.double(), expected, atol=atol, rtol=rtol)
    torch.testing.assert_close(lse_out.double(), expected_lse, atol=1e-5, rtol=1e-6)


def test_rows_without_keys_merge_to_zero_and_minus_inf():
    lse, out = make_inputs(4, 9, 16, torch.float32, empty_rows=(0, 4, 8))
    merged, lse_out = attention_update(lse, out, update_type=1)
    assert not merged.isnan().any() and not lse_out.isnan().any()
    assert merged[[0, 4, 8]].abs().max() == 0
    assert torch.equal(lse_out[[0, 4, 8]], torch.full((3,), NEG_INF))


def test_empty_shard_outputs_are_ignored_even_when_not_finite():
    lse, out = make_inputs(3, 6, 8, torch.float32)
    lse[1] = NEG_INF
    out[1] = float("nan")
    merged, _ = attention_update(lse, out)
    torch.testing.assert_close(merged, attention_update(lse[[0, 2]], out[[0, 2]])[0])


def test_large_lse_values_do_not_overflow():
    lse = torch.tensor([[1000.0, -1000.0], [1001.0, -1001.0]])
    out = torch.stack([torch.ones(2, 8), 3 * torch.ones(2, 8)])
    merged, lse_out = attention_update(lse, out, update_type=1)
    weight = 1 / (1 + torch.exp(torch.tensor(-1.0)))  # shard 1 of row 0
    torch.testing.assert_close(merged[0], (1 + 2 * weight) * torch.ones(8))
    torch.testing.assert_close(lse_out, torch.logsumexp(lse, dim=0))


def test_single_shard_is_identity():
    lse, out = make_inputs(1, 11, 24, torch.float32)
    merged, lse_out = attention_update(lse, out, update_type=1)
    torch.testing.assert_close(merged, out[0])
    torch.testing.assert_close(lse_out, lse[0])


def test_update_type_zero_returns_no_lse():
    lse, out = make_inputs(2, 4, 8, torch.float32)
    assert attention_update(lse, out)[1] is None
    assert attention_update(lse, out, update_type=0)[1] is None


@pytest.mark.parametrize("path", ["cpu", "custom"])
@pytest.mark.parametrize("return_lse", [False, True])
def test_matches_vllm_lse_weighted_combine(return_lse, path, monkeypatch):
    sp, batch, heads, head_dim = 4, 5, 3, 32
    lse, out = make_inputs(sp, batch * heads, head_dim, torch.float32, seed=3)
    expected = _lse_weighted_combine(
        out.view(sp, batch, heads, head_dim), lse.view(sp, batch, heads), return_lse=return_lse
    )
    merged, lse_out = merge_on(path, lse, out, monkeypatch)
    if return_lse:
        expected, expected_lse = expected
        torch.testing.assert_close(lse_out.view(batch, heads), expected_lse)
    torch.testing.assert_close(merged.view(batch, heads, head_dim), expected)


BAD_ARGS = {
    "sp 0": (dict(sp=0), "lse"),
    "sp 17": (dict(sp=17), "lse"),
    "D 4": (dict(head_dim=4), "out"),
    "D 520": (dict(head_dim=520), "out"),
    "D 12": (dict(head_dim=12), "out"),
    "N mismatch": (dict(out_rows=6), "out"),
    "sp mismatch": (dict(out_sp=3), "out"),
    "lse fp16": (dict(lse_dtype=torch.float16), "lse"),
    "out int": (dict(out_dtype=torch.int32), "out"),
    "lse 1-D": (dict(lse_shape=(5,)), "lse"),
    "out 2-D": (dict(out_shape=(5, 8)), "out"),
    "update_type 2": (dict(update_type=2), "update_type"),
}


@pytest.mark.parametrize("case", list(BAD_ARGS), ids=list(BAD_ARGS))
def test_bad_arguments_raise_value_error_naming_them(case):
    spec, argument = BAD_ARGS[case]
    sp, head_dim = spec.get("sp", 2), spec.get("head_dim", 8)
    lse = torch.zeros(spec.get("lse_shape", (sp, 5)), dtype=spec.get("lse_dtype", torch.float32))
    out_shape = spec.get("out_shape", (spec.get("out_sp", sp), spec.get("out_rows", 5), head_dim))
    out = torch.zeros(out_shape, dtype=spec.get("out_dtype", torch.float32))
    update_type = spec.get("update_type", 0)
    for fn in (check_attention_update_args, attention_update, attention_update_reference):
        with pytest.raises(ValueError, match=f"^{argument}"):
            fn(lse, out, update_type)
    with pytest.raises((ValueError, RuntimeError), match=argument):
        torch.ops.vllm_npu_ext.attention_update(lse, out, update_type)


def test_more_rows_than_the_kernel_indexes_raise_value_error_naming_n():
    rows = update_module.MAX_ROWS + 1  # meta tensors: shapes without memory
    lse = torch.empty(2, rows, device="meta")
    out = torch.empty(2, rows, 8, device="meta")
    with pytest.raises(ValueError, match=r"^lse: N \(dim 1\) must be at most 2147483647"):
        check_attention_update_args(lse, out)
    check_attention_update_args(lse[:, :-1], out[:, :-1])  # the largest N passes


@pytest.mark.parametrize("update_type", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
def test_opcheck(strided, dtype, update_type):
    lse, out = make_inputs(4, 10, 16, dtype, strided=strided)
    torch.library.opcheck(torch.ops.vllm_npu_ext.attention_update.default, (lse, out, update_type))


def test_fake_kernel_shapes_and_dtypes():
    with FakeTensorMode():
        lse, out = torch.empty(8, 96), torch.empty(8, 96, 128, dtype=torch.float16)
        merged, lse_out = torch.ops.vllm_npu_ext.attention_update(lse, out, 1)
        direct = attention_update_fake(lse, out, 1)
    for result in ((merged, lse_out), direct):
        assert result[0].shape == (96, 128) and result[0].dtype == torch.float16
        assert result[1].shape == (96,) and result[1].dtype == torch.float32
    meta = torch.ops.vllm_npu_ext.attention_update(lse.to("meta"), out.to("meta"))
    assert meta[0].shape == (96, 128) and meta[0].device.type == "meta"


def test_torch_compile_traces_the_op_in_one_graph():
    lse, out = make_inputs(4, 12, 64, torch.float32, strided=True)
    compiled = torch.compile(
        lambda a, b: attention_update(a, b, update_type=1), backend="aot_eager", fullgraph=True
    )
    merged, lse_out = compiled(lse, out)
    expected, expected_lse = attention_update_reference(lse, out, 1)
    torch.testing.assert_close(merged, expected)
    torch.testing.assert_close(lse_out, expected_lse)


def test_npu_kernel_is_registered_for_privateuse1():
    assert torch._C._dispatch_has_kernel_for_dispatch_key(
        "vllm_npu_ext::attention_update", "PrivateUse1"
    )


def _run_on_emulated_npu(lse, out, update_type=1):
    emulator.reset_counts()
    emulated_cann_ops.calls.clear()
    result = attention_update(lse, out, update_type)
    return (
        result,
        emulator.calls["npu_attention_update"],
        emulated_cann_ops.calls[emulated_cann_ops.OP_NAME],
    )


@pytest.mark.parametrize(
    ("switch", "custom_loaded", "kernel"),
    [
        ("auto", False, "list"),
        ("auto", True, "custom"),
        ("list", True, "list"),
        ("custom", True, "custom"),
    ],
)
def test_npu_dispatch_follows_the_switch(monkeypatch, switch, custom_loaded, kernel):
    monkeypatch.setenv(update_module.KERNEL_SWITCH, switch)
    lse, out = make_inputs(4, 20, 64, torch.bfloat16, strided=True)
    lse[:, 3] = torch.tensor([NEG_INF, 1.0, NEG_INF, NEG_INF])  # one shard holds the keys
    with emulator.emulated():
        if custom_loaded:
            with emulated_cann_ops.emulated():
                (merged, lse_out), list_calls, custom_calls = _run_on_emulated_npu(lse, out)
        else:
            (merged, lse_out), list_calls, custom_calls = _run_on_emulated_npu(lse, out)
    assert (list_calls, custom_calls) == ((1, 0) if kernel == "list" else (0, 1))
    expected, expected_lse = attention_update_reference(lse, out, 1)
    torch.testing.assert_close(merged, expected, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse_out, expected_lse)


def test_custom_switch_without_the_operator_package_raises(monkeypatch):
    monkeypatch.setenv(update_module.KERNEL_SWITCH, "custom")
    lse, out = make_inputs(2, 4, 8, torch.float32)
    with emulator.emulated(), pytest.raises(RuntimeError, match="custom"):
        attention_update(lse, out)


def test_unknown_switch_value_raises(monkeypatch):
    monkeypatch.setenv(update_module.KERNEL_SWITCH, "tensorlist")
    lse, out = make_inputs(2, 4, 8, torch.float32)
    with (
        emulator.emulated(),
        pytest.raises(ValueError, match=update_module.KERNEL_SWITCH),
    ):
        attention_update(lse, out)


def test_privateuse1_kernel_returns_a_tensor_for_the_unused_lse(monkeypatch):
    monkeypatch.setenv(update_module.KERNEL_SWITCH, "list")
    lse, out = make_inputs(2, 4, 8, torch.float32)
    with emulator.emulated():
        assert attention_update_npu(lse, out, 0)[1] is None  # torch_npu leaves it undefined
        merged, lse_out = update_module._attention_update_privateuse1(lse, out, 0)
    assert isinstance(lse_out, torch.Tensor) and lse_out.shape == (4,)
    torch.testing.assert_close(merged, attention_update_reference(lse, out)[0])


def test_emulated_cann_kernel_enforces_the_op_api_contract():
    with emulated_cann_ops.emulated():
        with pytest.raises(ValueError, match="^lse"):
            torch.ops.npu_ext_cann.npu_ext_attention_update(
                torch.zeros(2, 4).half(), torch.zeros(2, 4, 8), 0
            )
        lse, out = make_inputs(3, 5, 8, torch.float16)
        merged, _ = torch.ops.npu_ext_cann.npu_ext_attention_update(lse, out, 0)
    torch.testing.assert_close(merged, attention_update_reference(lse, out)[0])


@pytest.mark.parametrize(("switch", "contiguous"), [("0", False), ("1", True)])
def test_list_kernel_gets_the_strided_views_unless_the_switch_asks_for_copies(
    monkeypatch, switch, contiguous
):
    """Default: the CP buffer's views as they are (aclnn makes them contiguous itself, as for
    vllm-ascend); VLLM_NPU_EXT_ATTENTION_UPDATE_CONTIGUOUS=1: contiguous copies first."""
    monkeypatch.setenv(update_module.KERNEL_SWITCH, "list")
    monkeypatch.setenv(update_module.CONTIGUOUS_SWITCH, switch)
    lse, out = make_inputs(4, 20, 64, torch.float32, strided=True)
    seen = []
    with emulator.emulated() as module:
        original = module.npu_attention_update

        def recording(lse_list, out_list, update_type):
            seen.extend(t.is_contiguous() for t in [*lse_list, *out_list])
            return original(lse_list, out_list, update_type)

        monkeypatch.setattr(module, "npu_attention_update", recording)
        merged, _ = attention_update(lse, out)
    assert len(seen) == 8 and set(seen) == {contiguous}
    torch.testing.assert_close(merged, attention_update_reference(lse, out)[0])
