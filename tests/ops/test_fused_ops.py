"""Each fused NPU operator path (run under the torch_npu emulator) against its PyTorch reference.

Dtypes x odd sizes x GQA ratios: the cases of `vllm_npu_ext.selfcheck.parity_tables.UNIT_CASES`,
which the NPU tier (tests/selfcheck/test_npu_tier.py) runs on a real device, compared by
`vllm_npu_ext.selfcheck.parity_cases` under the shared tolerances of
`vllm_npu_ext.selfcheck.tolerances`.
Every test also checks that the fused operator really ran (the emulator counts calls), so a
silent fall-back to the reference cannot pass.
"""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops
from vllm_npu_ext.ops import activation, attention, rotary
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.selfcheck.parity_cases import randn
from vllm_npu_ext.selfcheck.parity_tables import unit_cases


@pytest.fixture
def npu():
    with emulator.emulated() as module:
        emulator.reset_counts()
        yield module


def _assert_called(operator: str, times: int = 1) -> None:
    assert emulator.calls[operator] == times, dict(emulator.calls)


def _check(npu, case) -> list:
    """Run the case's fused path, prove the fused operator ran once, assert every output."""
    results = case.run(npu)
    _assert_called(case.operator)
    for parity in results:
        parity.assert_close()
    return results


@pytest.mark.parametrize("case", unit_cases("rms_norm"), ids=str)
def test_rms_norm_matches_reference(npu, case):
    _check(npu, case)


@pytest.mark.parametrize("case", unit_cases("rms_norm_strided"), ids=str)
def test_rms_norm_on_strided_rows(npu, case):
    """Rows of a view into a wider buffer (row stride 160, 96 columns)."""
    _check(npu, case)


@pytest.mark.parametrize("case", unit_cases("add_rms_norm"), ids=str)
def test_add_rms_norm_returns_norm_and_sum(npu, case):
    assert [p.output for p in _check(npu, case)] == ["y", "x_sum"]


@pytest.mark.parametrize("case", unit_cases("rotary"), ids=str)
def test_rotary_matches_reference(npu, case):
    _check(npu, case)


@pytest.mark.parametrize("case", unit_cases("rotary_qk"), ids=str)
def test_rotary_of_q_and_k_in_one_launch_matches_reference(npu, case):
    """npu_mrope, full and partial rotary_dim: one call for q and k together."""
    assert [p.output for p in _check(npu, case)] == ["q", "k"]


def test_rotary_rejects_mismatched_tables():
    x = torch.zeros(5, 2, 32)
    with pytest.raises(ValueError, match="cos and sin must be"):
        rotary.apply_rotary(x, torch.zeros(5, 16), torch.zeros(5, 16))


@pytest.mark.parametrize("case", unit_cases("swiglu"), ids=str)
def test_swiglu_matches_reference(npu, case):
    _check(npu, case)


def test_swiglu_rejects_odd_width():
    with pytest.raises(ValueError, match="must be even"):
        activation.swiglu(torch.zeros(3, 5))


@pytest.mark.parametrize("case", unit_cases("linear"), ids=str)
def test_linear_matches_reference(npu, case):
    _check(npu, case)


@pytest.mark.parametrize("case", unit_cases("grouped_qkv"), ids=str)
def test_grouped_qkv_matches_separate_projections(npu, case):
    outputs = [p.actual for p in _check(npu, case)]
    size = case.kwargs
    head_dim = size.get("head_dim", 32)
    heads = [size["q_heads"], size["kv_heads"], size["kv_heads"]]
    assert [o.shape[-1] for o in outputs] == [n * head_dim for n in heads]
    assert all(o.is_contiguous() for o in outputs)


@pytest.mark.parametrize("case", unit_cases("attention", operator="fused_infer_attention_score"),
                         ids=str)  # fmt: skip
def test_fused_infer_attention_matches_reference(npu, case):
    _check(npu, case)


@pytest.mark.parametrize("case", unit_cases("attention", operator="fusion_attention"), ids=str)
def test_fusion_attention_matches_reference(npu, case):
    _check(npu, case)


@pytest.mark.parametrize(
    "case", unit_cases("attention_update") + unit_cases("attention_update_strided"), ids=str
)
def test_attention_update_kernels_match_reference(npu, case):
    """torch_npu's TensorList op, and our custom op (its emulated CPU kernel) on tensors."""
    emulated_cann_ops.calls.clear()
    with emulated_cann_ops.emulated():
        results = case.run(npu)
    custom = case.kwargs["kernel"] == "custom"
    assert emulated_cann_ops.calls[emulated_cann_ops.OP_NAME] == int(custom)
    assert emulator.calls["npu_attention_update"] == int(not custom), dict(emulator.calls)
    for parity in results:
        parity.assert_close()


def test_reference_attention_is_causal_and_per_sequence():
    """The reference itself: changing a later token or another sequence changes nothing."""
    seqs = PackedSeqs.from_seq_lens([4, 3])
    q, k, v = (randn(7, 2, 32, dtype=torch.float32, seed=s) for s in range(3))
    base = attention.varlen_attention_native(q, k, v, seqs, 32**-0.5)
    k2, v2 = k.clone(), v.clone()
    k2[3], v2[3] = 10.0, 10.0  # last token of sequence 0
    changed = attention.varlen_attention_native(q, k2, v2, seqs, 32**-0.5)
    torch.testing.assert_close(changed[:3], base[:3])  # earlier tokens of sequence 0
    torch.testing.assert_close(changed[4:], base[4:])  # sequence 1
    assert not torch.allclose(changed[3], base[3])


def test_causal_mask_is_built_once_per_device():
    first = attention.compressed_causal_mask(torch.device("cpu"))
    assert first is attention.compressed_causal_mask(torch.device("cpu"))
    assert first.shape == (2048, 2048) and first.dtype == torch.bool
    assert torch.equal(first, torch.ones(2048, 2048, dtype=torch.bool).triu(1))


def test_attention_rejects_bad_shapes():
    seqs = PackedSeqs.from_seq_lens([3])
    q, k = torch.zeros(3, 3, 32), torch.zeros(3, 2, 32)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention.varlen_attention(q, k, k, seqs, 0.1)
    with pytest.raises(ValueError, match="cover 3 tokens"):
        attention.varlen_attention(torch.zeros(4, 2, 32), torch.zeros(4, 2, 32),
                                   torch.zeros(4, 2, 32), seqs, 0.1)  # fmt: skip
    with pytest.raises(ValueError, match="operator must be one of"):
        attention.varlen_attention(k, k, k, seqs, 0.1, npu=emulator, operator="flash")
