"""The model never calls an NPU operator outside its documented domain.

`ops.attention.choose_operator` and `ops.linear.grouped_linear_supports` decide, from the
torch-npu 2.10.0.post4 documentation and vllm-ascend 0.23's own calls, which fused operator a
shape gets; the model follows them (`npu_plan.plan_for`, with a log line) and the emulator, which
encodes the same limits on its own, must accept every call they allow and reject the rest.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from vllm_npu_ext import emulator
from vllm_npu_ext.model_executor.layers import npu_plan
from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
from vllm_npu_ext.ops import attention, linear
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.selfcheck.parity_cases import randn

FIA, FA = attention.FUSED_INFER, attention.FUSION
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
# (dtype, head_dim, q heads, kv heads) -> the operator the default request gets.
CHOICES = [
    ((BF16, 128, 16, 8), FIA),  # Qwen3-Embedding-0.6B: what vllm-ascend runs through FIA
    ((BF16, 128, 32, 8), FIA),  # 4B / 8B
    ((BF16, 128, 8, 2), FIA),  # 4B at tensor parallel 4
    ((BF16, 192, 4, 2), FIA),
    ((BF16, 64, 8, 2), FA),  # the test suite's small models
    ((BF16, 32, 4, 2), FA),
    ((FP16, 128, 16, 8), FA),  # FIA takes bfloat16 only in TND
    ((FP32, 128, 16, 8), FA),
    ((FP32, 32, 4, 2), FA),
    ((BF16, 1024, 4, 2), None),  # neither: head_dim above FA's 768
]


@pytest.mark.parametrize(("shape", "operator"), CHOICES, ids=str)
def test_fia_is_chosen_only_inside_its_documented_tnd_domain(shape, operator):
    choice = attention.choose_operator(FIA, *shape)
    assert choice.operator == operator
    assert (choice.reason == "") == (operator == FIA)


def test_the_fusion_attention_switch_is_kept_where_it_applies():
    assert attention.choose_operator(FA, BF16, 128, 16, 8) == attention.OperatorChoice(FA)
    with pytest.raises(ValueError, match="operator must be one of"):
        attention.choose_operator("flash", BF16, 128, 16, 8)


def _fused_call(operator, dtype, head_dim, heads, kv_heads, seq_lens=(5, 1, 3)):
    seqs = PackedSeqs.from_seq_lens(seq_lens)
    q = randn(seqs.num_tokens, heads, head_dim, dtype=dtype)
    k, v = (randn(seqs.num_tokens, kv_heads, head_dim, dtype=dtype, seed=s) for s in (1, 2))
    return lambda: attention.varlen_attention(
        q, k, v, seqs, head_dim**-0.5, npu=emulator, operator=operator
    )


SHAPES = list(itertools.product((BF16, FP16, FP32), (32, 64, 128, 192), [(4, 2)]))


@pytest.mark.parametrize(("dtype", "head_dim", "heads"), SHAPES, ids=str)
@pytest.mark.parametrize("operator", attention.OPERATORS)
def test_the_emulator_accepts_exactly_the_calls_the_model_may_make(operator, dtype, head_dim,
                                                                    heads):  # fmt: skip
    """Where the choice allows the operator, the emulated operator runs; elsewhere both the
    ops function (ValueError) and the emulator itself (the documented limit) refuse."""
    reason = attention.unsupported_reason(operator, dtype, head_dim, *heads)
    call = _fused_call(operator, dtype, head_dim, *heads)
    emulator.reset_counts()
    if reason is None:
        assert call().shape == (9, heads[0], head_dim)
        return
    with pytest.raises(ValueError, match=f"operator: npu_{operator}"):
        call()
    assert not emulator.calls  # refused before reaching the operator
    with pytest.MonkeyPatch.context() as patch:  # the operator's own check, reached directly
        patch.setattr(attention, "unsupported_reason", lambda *args: None)
        with pytest.raises((TypeError, ValueError), match="TND|dtype"):
            call()


@pytest.mark.parametrize(
    ("operator", "dtype", "head_dim", "batch", "limit", "calls"),
    [
        (FA, FP32, 32, 1030, None, 2),  # FA's real limit: 1024 sequences
        (FA, BF16, 64, 300, None, 1),
        (FIA, BF16, 128, 10, 4, 3),  # FIA's 4096, scaled down (the emulator's own check of
    ],  # 4096 is in tests/emulator/test_contracts.py)
)
def test_batches_beyond_an_operators_sequence_limit_run_in_chunks(
    monkeypatch, operator, dtype, head_dim, batch, limit, calls
):
    if limit is not None:
        monkeypatch.setitem(attention.MAX_SEQS, operator, limit)
    seq_lens = [1 + i % 3 for i in range(batch)]
    seqs = PackedSeqs.from_seq_lens(seq_lens)
    q = randn(seqs.num_tokens, 2, head_dim, dtype=dtype)
    k, v = (randn(seqs.num_tokens, 1, head_dim, dtype=dtype, seed=s) for s in (1, 2))
    emulator.reset_counts()
    fused = attention.varlen_attention(q, k, v, seqs, head_dim**-0.5, npu=emulator,
                                       operator=operator)  # fmt: skip
    assert emulator.calls[f"npu_{operator}"] == calls
    reference = attention.varlen_attention_native(q, k, v, seqs, head_dim**-0.5)
    torch.testing.assert_close(fused.float(), reference.float(), rtol=2e-2, atol=2e-2)


def test_grouped_matmul_takes_float32_only_as_one_tensor():
    assert linear.grouped_linear_supports(BF16) and linear.grouped_linear_supports(FP16)
    assert not linear.grouped_linear_supports(FP32)
    assert linear.grouped_linear_supports(FP32, groups=1)
    x, weights = randn(3, 8, dtype=FP32), [randn(8, n, dtype=FP32) for n in (4, 2, 2)]
    with pytest.raises(ValueError, match="x: npu_grouped_matmul takes torch.float32 only"):
        linear.grouped_linear(x, weights, npu=emulator)
    assert [y.shape[-1] for y in linear.grouped_linear(x, weights)] == [4, 2, 2]  # reference


@pytest.fixture
def env(monkeypatch):
    for name in ("VLLM_NPU_EXT_FUSED", "VLLM_NPU_EXT_ATTENTION_OP", "VLLM_NPU_EXT_FUSE_ATTENTION",
                 "VLLM_NPU_EXT_FUSE_GROUPED_QKV"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def _layer(head_dim, heads, kv_heads):
    """What `npu_plan.plan_for` reads of a Qwen3Attention: shapes, rotary style and table width."""
    rotary_emb = SimpleNamespace(cos_sin_cache=torch.empty(64, head_dim))
    return SimpleNamespace(head_dim=head_dim, num_heads=heads, num_kv_heads=kv_heads,
                           neox=True, rotary_emb=rotary_emb)  # fmt: skip


# Where vllm-ascend's NPU worker has not registered its Triton QK-norm + RoPE operator (every
# process here but its worker), the model says so once and rotates with npu_mrope.
NOT_REGISTERED = "vllm.qkv_rmsnorm_rope is not registered"


def test_qwen3_embedding_in_bfloat16_keeps_every_fusion_and_says_nothing(env, monkeypatch):
    monkeypatch.setattr(npu_plan.qk_norm_rope, "registered", lambda: True)
    assert npu_plan.fusions_for(BF16, _layer(128, 16, 8)) == (FusionConfig(), [])
    monkeypatch.setattr(npu_plan.qk_norm_rope, "registered", lambda: False)
    fusions, notes = npu_plan.fusions_for(BF16, _layer(128, 16, 8))
    assert fusions == FusionConfig() and len(notes) == 1 and notes[0].startswith(NOT_REGISTERED)
    assert npu_plan.qk_path_for(fusions, BF16, _layer(128, 16, 8))[0] == npu_plan.QK_MROPE


def test_a_float32_model_uses_merged_qkv_and_fusion_attention_and_says_so(env):
    fusions, notes = npu_plan.fusions_for(FP32, _layer(32, 4, 2))
    assert not fusions.grouped_qkv and fusions.attention_op == FA and fusions.attention
    assert "npu_grouped_matmul takes torch.float32 only" in notes[0]
    assert "takes bfloat16 only" in notes[1] and "separate operators" in notes[1]
    assert "fused attention uses npu_fusion_attention" in notes[2]


@pytest.mark.parametrize(("head_dim", "operator"), [(64, FA), (32, FA), (192, FIA)])
def test_a_bfloat16_model_outside_fias_head_dims_uses_fusion_attention(env, head_dim, operator):
    fusions, notes = npu_plan.fusions_for(BF16, _layer(head_dim, 8, 2))
    assert fusions.attention_op == operator and fusions.grouped_qkv
    # Outside head_dim 128 the QK-norm + RoPE operator says why it is not used, first.
    assert "head_dim 128 only" in notes[0] and "separate operators" in notes[0]
    notes = notes[1:]
    assert bool(notes) == (operator == FA)
    if notes:
        assert f"head_dim {head_dim}" in notes[0] and "TND" in notes[0]


def test_a_shape_no_fused_operator_takes_runs_attention_unfused(env):
    fusions, notes = npu_plan.fusions_for(BF16, _layer(1024, 4, 2))
    assert not fusions.attention and fusions.rms_norm
    assert notes[-1].endswith("attention runs unfused")


def _attention_cases():
    from vllm_npu_ext.selfcheck.parity_tables import UNIT_CASES, qwen3_cases

    return [c for c in UNIT_CASES + qwen3_cases() if c.op == "attention"]


def test_parity_cases_cover_both_sides_of_the_fia_boundary_and_stay_inside_the_docs():
    """selfcheck and the NPU tier: FIA at Qwen3-Embedding's own shape (bf16, head_dim 128,
    16 q / 8 kv heads), FA at the small head dims and the dtypes FIA lacks; no case calls an
    operator outside its documented domain."""
    seen = set()
    for case in _attention_cases():
        params = case.kwargs
        shape = (params.get("head_dim", 64), params["q_heads"], params["kv_heads"])
        operator = params["operator"]
        assert attention.unsupported_reason(operator, case.dtype, *shape) is None, str(case)
        seen.add((operator, case.dtype, shape))
    assert (FIA, BF16, (128, 16, 8)) in seen
    assert {(FA, BF16, (32, 4, 4)), (FA, BF16, (64, 8, 2)), (FA, FP16, (128, 16, 8)),
            (FA, FP32, (128, 16, 8))} <= seen  # fmt: skip


def test_every_strided_attention_update_case_has_a_contiguous_twin():
    """The same sizes with lists of contiguous tensors: on hardware, the strided form failing
    alone means aclnnAttentionUpdate needs VLLM_NPU_EXT_ATTENTION_UPDATE_CONTIGUOUS=1."""
    from vllm_npu_ext.selfcheck.parity_tables import UNIT_CASES, qwen3_cases

    for cases in (UNIT_CASES, qwen3_cases()):
        strided = {(c.dtype, c.params) for c in cases if c.op == "attention_update_strided"}
        contiguous = {(c.dtype, c.params) for c in cases if c.op == "attention_update"}
        assert strided and strided <= contiguous


def test_selfchecks_full_plan_runs_the_model_through_both_attention_operators():
    from vllm_npu_ext.selfcheck.plan import FULL, TINY_MODELS
    from vllm_npu_ext.tiny_model import PRESETS

    operators = set()
    for name, dtype in FULL.tiny_runs:
        config = {**PRESETS["tiny"], **TINY_MODELS[name]}
        shape = (config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"])
        operators.add(attention.choose_operator(FIA, getattr(torch, dtype), *shape).operator)
    assert operators == {FIA, FA}
