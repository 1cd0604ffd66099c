"""Each fused NPU operator path (run under the torch_npu emulator) against its PyTorch reference.

Dtypes x odd sizes x GQA ratios, with the shared tolerances of `vllm_npu_ext.tolerances`.
Every test also checks that the fused operator really ran (the emulator counts calls), so a
silent fall-back to the reference cannot pass.
"""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext.ops import activation, attention, layernorm, linear, rotary
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.testing import torch_npu_emulator as emulator
from vllm_npu_ext.tolerances import op_tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
HALF_DTYPES = [torch.float16, torch.bfloat16]


@pytest.fixture
def npu():
    with emulator.emulated() as module:
        emulator.reset_counts()
        yield module


def _randn(*shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


def _assert_close(operator: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = op_tolerance(operator, actual.dtype)
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol.atol, rtol=tol.rtol)


def _assert_called(operator: str, times: int = 1) -> None:
    assert emulator.calls[operator] == times, dict(emulator.calls)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 130), (33, 4, 32)])
def test_rms_norm_matches_reference(npu, dtype, shape):
    x = _randn(*shape, dtype=dtype)
    weight = 1 + 0.1 * _randn(shape[-1], dtype=dtype, seed=1)
    fused = layernorm.rms_norm(x, weight, 1e-6, npu=npu)
    _assert_called("npu_rms_norm")
    _assert_close("npu_rms_norm", fused, layernorm.rms_norm(x, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_on_strided_rows(npu, dtype):
    wide = _randn(9, 160, dtype=dtype)
    x = wide[:, :96]  # row stride 160: a view into a wider buffer
    weight = 1 + 0.1 * _randn(96, dtype=dtype, seed=1)
    _assert_close("npu_rms_norm", layernorm.rms_norm(x, weight, 1e-6, npu=npu),
                  layernorm.rms_norm_native(x, weight, 1e-6))  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 7, 33])
def test_add_rms_norm_returns_norm_and_sum(npu, dtype, tokens):
    x, residual = _randn(tokens, 96, dtype=dtype), _randn(tokens, 96, dtype=dtype, seed=2)
    weight = 1 + 0.1 * _randn(96, dtype=dtype, seed=1)
    normed, summed = layernorm.add_rms_norm(x, residual, weight, 1e-6, npu=npu)
    ref_normed, ref_summed = layernorm.add_rms_norm(x, residual, weight, 1e-6)
    _assert_called("npu_add_rms_norm")
    _assert_close("npu_add_rms_norm", summed, ref_summed)
    _assert_close("npu_add_rms_norm", normed, ref_normed)


def _rope_tables(max_pos: int, head_dim: int, dtype: torch.dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
    return rotary.full_width_tables(cos_sin_cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "heads", "head_dim"), [(1, 1, 32), (7, 4, 64), (33, 3, 128)])
def test_rotary_matches_reference(npu, dtype, tokens, heads, head_dim):
    cos_table, sin_table = _rope_tables(512, head_dim, dtype)
    positions = torch.randint(0, 512, (tokens,), generator=torch.Generator().manual_seed(3))
    cos, sin = rotary.gather_tables(cos_table, sin_table, positions)
    x = _randn(tokens, heads, head_dim, dtype=dtype)
    fused = rotary.apply_rotary(x, cos, sin, npu=npu)
    _assert_called("npu_rotary_mul")
    _assert_close("npu_rotary_mul", fused, rotary.apply_rotary(x, cos, sin))


def test_rotary_rejects_mismatched_tables():
    x = torch.zeros(5, 2, 32)
    with pytest.raises(ValueError, match="cos and sin must be"):
        rotary.apply_rotary(x, torch.zeros(5, 16), torch.zeros(5, 16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 64), (7, 2 * 3072 // 8), (33, 18)])
def test_swiglu_matches_reference(npu, dtype, shape):
    x = _randn(*shape, dtype=dtype)
    fused = activation.swiglu(x, npu=npu)
    _assert_called("npu_swiglu")
    _assert_close("npu_swiglu", fused, activation.swiglu(x))


def test_swiglu_rejects_odd_width():
    with pytest.raises(ValueError, match="must be even"):
        activation.swiglu(torch.zeros(3, 5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "k", "n"), [(1, 64, 32), (7, 96, 160), (33, 128, 48)])
def test_linear_matches_reference(npu, dtype, tokens, k, n):
    x, weight = _randn(tokens, k, dtype=dtype), _randn(n, k, dtype=dtype, seed=1) / k**0.5
    fused = linear.linear(x, weight, npu=npu)
    _assert_called("npu_linear")
    _assert_close("npu_linear", fused, linear.linear(x, weight))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "q_heads", "kv_heads"), [(1, 4, 4), (7, 4, 2), (33, 8, 2)])
def test_grouped_qkv_matches_separate_projections(npu, dtype, tokens, q_heads, kv_heads):
    head_dim, hidden = 32, 96
    x = _randn(tokens, hidden, dtype=dtype)
    sizes = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    weights = [_randn(n, hidden, dtype=dtype, seed=i) / hidden**0.5 for i, n in enumerate(sizes)]
    weights_kn = [w.t().contiguous() for w in weights]
    outputs = linear.grouped_linear(x, weights_kn, npu=npu)
    _assert_called("npu_grouped_matmul")
    assert [o.shape[-1] for o in outputs] == sizes
    assert all(o.is_contiguous() for o in outputs)
    for out, weight in zip(outputs, weights, strict=True):
        _assert_close("npu_grouped_matmul", out, linear.linear(x, weight))


SEQ_LEN_CASES = [[1], [5, 17, 1], [64, 3, 33]]


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("seq_lens", SEQ_LEN_CASES)
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(4, 4), (4, 2), (8, 2)])
def test_fused_infer_attention_matches_reference(npu, dtype, seq_lens, q_heads, kv_heads):
    _check_attention(npu, "fused_infer_attention_score", dtype, seq_lens, q_heads, kv_heads)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq_lens", SEQ_LEN_CASES)
@pytest.mark.parametrize(("q_heads", "kv_heads"), [(4, 4), (8, 2)])
def test_fusion_attention_matches_reference(npu, dtype, seq_lens, q_heads, kv_heads):
    _check_attention(npu, "fusion_attention", dtype, seq_lens, q_heads, kv_heads)


def _check_attention(npu, operator, dtype, seq_lens, q_heads, kv_heads, head_dim=64):
    seqs = PackedSeqs.from_seq_lens(seq_lens)
    tokens = seqs.num_tokens
    q = _randn(tokens, q_heads, head_dim, dtype=dtype)
    k = _randn(tokens, kv_heads, head_dim, dtype=dtype, seed=1)
    v = _randn(tokens, kv_heads, head_dim, dtype=dtype, seed=2)
    scale = head_dim**-0.5
    fused = attention.varlen_attention(q, k, v, seqs, scale, npu=npu, operator=operator)
    _assert_called(f"npu_{operator}")
    expected = attention.varlen_attention_native(q, k, v, seqs, scale)
    _assert_close(f"npu_{operator}", fused, expected)


def test_reference_attention_is_causal_and_per_sequence():
    """The reference itself: changing a later token or another sequence changes nothing."""
    seqs = PackedSeqs.from_seq_lens([4, 3])
    q, k, v = (_randn(7, 2, 32, dtype=torch.float32, seed=s) for s in range(3))
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
