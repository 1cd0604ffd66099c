"""The emulator's operators against independent float64 references written here."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from support.npu_inputs import MASK

from vllm_npu_ext import emulator

FLOAT16S = (torch.bfloat16, torch.float16)
ALL_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
# dtype -> (rtol, atol) for an output rounded to that dtype.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1e-2)}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def close(actual, expected, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


def cumulative(lengths):
    return list(itertools.accumulate(lengths))


def reference_attention(q, k, v, q_lens, kv_lens, scale, causal):
    """float64 per-sequence softmax(scale q k^T) v, K/V heads repeated per query group.

    Causal masking is right-down aligned: query i of a sequence sees keys j <= i + kv - q.
    Returns (out [T, N, D], lse [T, N]).
    """
    group = q.shape[1] // k.shape[1]
    outs, lses, q_start, kv_start = [], [], 0, 0
    for q_len, kv_len in zip(q_lens, kv_lens, strict=True):
        qi = q[q_start:q_start + q_len].double().transpose(0, 1)
        ki = k[kv_start:kv_start + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
        vi = v[kv_start:kv_start + kv_len].double().repeat_interleave(group, 1).transpose(0, 1)
        scores = scale * qi @ ki.transpose(1, 2)
        if causal:
            visible = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
            scores = scores.masked_fill(~visible, float("-inf"))
        lses.append(torch.logsumexp(scores, dim=-1).transpose(0, 1))
        outs.append((torch.softmax(scores, dim=-1) @ vi).transpose(0, 1))
        q_start, kv_start = q_start + q_len, kv_start + kv_len
    return torch.cat(outs), torch.cat(lses)


def fia_tnd(q, k, v, q_lens, kv_lens, causal=True, **kwargs):
    return emulator.npu_fused_infer_attention_score(
        q, k, v, atten_mask=MASK if causal else None, actual_seq_lengths=cumulative(q_lens),
        actual_seq_lengths_kv=cumulative(kv_lens), num_heads=q.shape[1],
        num_key_value_heads=k.shape[1], scale=q.shape[-1] ** -0.5, input_layout="TND",
        sparse_mode=3 if causal else 0, **kwargs,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16])  # FIA's only dtype in TND
@pytest.mark.parametrize(("q_lens", "kv_lens", "heads", "head_dim"), [
    ([3, 0, 6], [3, 0, 6], (4, 2), 128),
    ([1, 4, 2], [5, 4, 9], (6, 1), 128),
    ([5], [5], (2, 2), 192),
])
def test_fia_tnd_causal_gqa_matches_float64(dtype, q_lens, kv_lens, heads, head_dim):
    q = rand(sum(q_lens), heads[0], head_dim, dtype=dtype)
    k = rand(sum(kv_lens), heads[1], head_dim, dtype=dtype)
    v = rand(sum(kv_lens), heads[1], head_dim, dtype=dtype)
    out, lse = fia_tnd(q, k, v, q_lens, kv_lens, softmax_lse_flag=True)
    expected, expected_lse = reference_attention(q, k, v, q_lens, kv_lens, head_dim**-0.5, True)
    assert out.dtype == dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], heads[0], 1)
    close(out, expected, dtype)
    torch.testing.assert_close(lse.squeeze(-1).double(), expected_lse, rtol=1e-5, atol=1e-5)


def test_fia_without_lse_flag_returns_an_empty_float32_lse():
    """`[0]`, as the wheel's C++ and meta kernels allocate (its prose docs say `[1]`)."""
    q, k = rand(4, 2, 128, dtype=torch.bfloat16), rand(4, 2, 128, dtype=torch.bfloat16)
    _, lse = fia_tnd(q, k, k, [4], [4])
    assert lse.dtype == torch.float32 and lse.shape == (0,)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", ["BSH", "BSND", "BNSD"])
def test_fia_batched_layouts_match_tnd(layout, causal):
    batch, seq, heads, kv_heads, dim = 2, 5, 4, 2, 128
    q = rand(batch * seq, heads, dim, dtype=torch.bfloat16)
    k, v = (rand(batch * seq, kv_heads, dim, dtype=torch.bfloat16) for _ in range(2))
    tnd_out, tnd_lse = fia_tnd(q, k, v, [seq] * batch, [seq] * batch, causal, softmax_lse_flag=True)
    to_layout = {
        "BSH": lambda x: x.reshape(batch, seq, -1),
        "BSND": lambda x: x.reshape(batch, seq, *x.shape[1:]),
        "BNSD": lambda x: x.reshape(batch, seq, *x.shape[1:]).transpose(1, 2).contiguous(),
    }[layout]
    out, lse = emulator.npu_fused_infer_attention_score(
        to_layout(q), to_layout(k), to_layout(v), atten_mask=MASK if causal else None,
        num_heads=heads, num_key_value_heads=kv_heads, scale=dim**-0.5, input_layout=layout,
        sparse_mode=3 if causal else 0, softmax_lse_flag=True,
    )
    assert torch.equal(out, to_layout(tnd_out))
    assert lse.shape == (batch, heads, seq, 1)
    assert torch.equal(lse, tnd_lse.reshape(batch, seq, heads, 1).transpose(1, 2))


def test_fia_decode_rows_accept_head_dim_8_outside_tnd():
    """D % 16 binds only with more than one query token; TND's D = 128/192 rule not at all."""
    q = rand(3, 1, 4, 8, dtype=torch.float16)
    k, v = rand(3, 4, 4, 8, dtype=torch.float16), rand(3, 4, 4, 8, dtype=torch.float16)
    out, _ = emulator.npu_fused_infer_attention_score(
        q, k, v, num_heads=4, num_key_value_heads=4, scale=8**-0.5, input_layout="BSND"
    )
    expected = reference_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                   [1, 1, 1], [4, 4, 4], 8**-0.5, False)[0]
    close(out.flatten(0, 1), expected, torch.float16)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
def test_fusion_attention_tnd_matches_float64_and_returns_seven_outputs(dtype):
    q_lens, kv_lens = [2, 5], [4, 5]
    q = rand(7, 4, 16, dtype=dtype)
    k, v = rand(9, 2, 16, dtype=dtype), rand(9, 2, 16, dtype=dtype)
    common = dict(atten_mask=MASK, scale=0.25, actual_seq_qlen=cumulative(q_lens),
                  actual_seq_kvlen=cumulative(kv_lens), sparse_mode=3)
    result = emulator.npu_fusion_attention(q, k, v, 4, "TND", softmax_layout="TND", **common)
    out, row_max, row_sum, softmax_out, *ints = result
    expected, expected_lse = reference_attention(q, k, v, q_lens, kv_lens, 0.25, True)
    assert len(result) == 7 and ints == [0, 0, 0] and softmax_out.numel() == 0
    close(out, expected, dtype)
    assert row_max.shape == row_sum.shape == (7, 4, 8)
    lse = row_max[..., 0] + torch.log(row_sum[..., 0])
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-5, atol=1e-5)
    default_layout = emulator.npu_fusion_attention(q, k, v, 4, "TND", **common)
    assert torch.equal(default_layout[0], out) and default_layout[1].isnan().all()


def test_fusion_attention_bsnd_stats_are_bns8():
    q, k = rand(2, 3, 4, 16, dtype=torch.bfloat16), rand(2, 3, 4, 16, dtype=torch.bfloat16)
    out, row_max, row_sum, *_ = emulator.npu_fusion_attention(q, k, k, 4, "BSND", scale=0.25)
    expected, _ = reference_attention(q.flatten(0, 1), k.flatten(0, 1), k.flatten(0, 1),
                                      [3, 3], [3, 3], 0.25, False)
    close(out.flatten(0, 1), expected, torch.bfloat16)
    assert row_max.shape == row_sum.shape == (2, 4, 3, 8)


def reference_rms_norm(x, gamma, eps):
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.double().pow(2).mean(dim=dims, keepdim=True) + eps)
    return x.double() * rstd * gamma.double(), rstd


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize(("x_shape", "gamma_shape"), [((5, 33), (33,)), ((2, 3, 17), (3, 17))])
def test_rms_norm_matches_float64(dtype, x_shape, gamma_shape):
    x, gamma = rand(*x_shape, dtype=dtype), rand(*gamma_shape, dtype=dtype)
    y, rstd = emulator.npu_rms_norm(x, gamma, epsilon=1e-5)
    expected, expected_rstd = reference_rms_norm(x, gamma, 1e-5)
    assert y.dtype == dtype and rstd.dtype == torch.float32
    assert rstd.shape == x_shape[: len(x_shape) - len(gamma_shape)] + (1,) * len(gamma_shape)
    close(y, expected, dtype)
    torch.testing.assert_close(rstd.double(), expected_rstd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
def test_add_rms_norm_returns_norm_rstd_and_sum(dtype):
    x1, x2, gamma = rand(7, 24, dtype=dtype), rand(7, 24, dtype=dtype), rand(24, dtype=dtype)
    y, rstd, x_sum = emulator.npu_add_rms_norm(x1, x2, gamma)
    exact_sum = x1.double() + x2.double()
    expected, expected_rstd = reference_rms_norm(exact_sum, gamma, 1e-6)
    assert x_sum.dtype == y.dtype == dtype and rstd.shape == (7, 1)
    close(x_sum, exact_sum, dtype)
    close(y, expected, dtype)
    torch.testing.assert_close(rstd.double(), expected_rstd, rtol=1e-5, atol=1e-6)


def rope_tables(tokens, dim, dtype=torch.float32):
    angles = torch.arange(tokens).double()[:, None] * torch.rand(dim // 2).double()[None]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype).view(1, tokens, 1, dim), angles.sin().to(dtype).view(
        1, tokens, 1, dim)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
def test_rotary_half_matches_rotate_half(dtype):
    x = rand(1, 11, 3, 32, dtype=dtype)
    cos, sin = rope_tables(11, 32, dtype)
    x64 = x.double()
    rotated = torch.cat([-x64[..., 16:], x64[..., :16]], dim=-1)
    close(emulator.npu_rotary_mul(x, cos, sin), x64 * cos.double() + rotated * sin.double(), dtype)


def test_rotary_interleave_and_rotate_matrix_match_their_formulas():
    x, (cos, sin) = rand(2, 5, 3, 8), rope_tables(5, 8)
    x64 = x.double()
    pairs = torch.stack([-x64[..., 1::2], x64[..., ::2]], dim=-1).flatten(-2)
    expected = x64 * cos.double() + pairs * sin.double()
    close(emulator.npu_rotary_mul(x, cos, sin, "interleave"), expected, torch.float32)
    rotate = torch.zeros(8, 8)
    rotate[:4, 4:], rotate[4:, :4] = torch.eye(4), -torch.eye(4)
    half = emulator.npu_rotary_mul(x, cos, sin)
    torch.testing.assert_close(emulator.npu_rotary_mul(x, cos, sin, rotate=rotate), half)


def test_rotary_casts_float32_tables_to_the_input_dtype():
    x, (cos, sin) = rand(1, 6, 2, 16, dtype=torch.bfloat16), rope_tables(6, 16)
    mixed = emulator.npu_rotary_mul(x, cos, sin)
    same = emulator.npu_rotary_mul(x, cos.bfloat16(), sin.bfloat16())
    assert mixed.dtype == torch.bfloat16 and torch.equal(mixed, same)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize(("shape", "dim"), [((3, 10), -1), ((6, 5), 0), ((2, 4, 6), 1)])
def test_swiglu_is_silu_of_first_half_times_second(dtype, shape, dim):
    x = rand(*shape, dtype=dtype)
    gate, up = x.double().chunk(2, dim=dim)
    close(emulator.npu_swiglu(x, dim=dim), F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", FLOAT16S)  # float32 takes only one x/weight/y
def test_grouped_matmul_per_group_outputs(dtype):
    x = [rand(3, 8, dtype=dtype), rand(5, 16, dtype=dtype)]
    weight_nk = [rand(6, 8, dtype=dtype), rand(4, 16, dtype=dtype)]
    weight = [w.t() for w in weight_nk]  # [K, N] views of F.linear weights
    bias_dtype = torch.float16 if dtype == torch.float16 else torch.float32
    bias = [rand(6, dtype=bias_dtype), rand(4, dtype=bias_dtype)]
    outs = emulator.npu_grouped_matmul(x, weight, bias=bias, group_type=-1, split_item=0)
    assert [o.shape for o in outs] == [(3, 6), (5, 4)] and outs[0].dtype == dtype
    for out, x_i, w_i, b_i in zip(outs, x, weight, bias, strict=True):
        close(out, x_i.double() @ w_i.double() + b_i.double(), dtype)


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_splits_rows_by_group_list(group_list_type):
    x, weight = rand(7, 8, dtype=torch.bfloat16), rand(3, 8, 5, dtype=torch.bfloat16)
    sizes = [2, 0, 5]
    group_list = torch.tensor(sizes if group_list_type else cumulative(sizes))
    (out,) = emulator.npu_grouped_matmul([x], [weight], group_list=group_list, split_item=2,
                                         group_type=0, group_list_type=group_list_type)
    expected = torch.cat([chunk.double() @ w.double()
                          for chunk, w in zip(x.split(sizes), weight, strict=True)])
    close(out, expected, torch.bfloat16)
    (stacked,) = emulator.npu_grouped_matmul(list(x.split(sizes)), list(weight), split_item=3,
                                             group_type=0)
    assert torch.equal(stacked, out)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_is_f_linear(dtype, with_bias):
    x, weight = rand(5, 12, dtype=dtype), rand(7, 12, dtype=dtype)
    bias = rand(7, dtype=dtype) if with_bias else None
    expected = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    close(emulator.npu_linear(x, weight, bias), expected, dtype)


def reference_update(lses, outs):
    lse = torch.logsumexp(torch.stack(lses).double(), dim=0)
    weights = torch.exp(torch.stack(lses).double() - lse).unsqueeze(-1)
    return (weights * torch.stack(outs).double()).sum(dim=0), lse


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize("sp", [1, 3, 16])
def test_attention_update_matches_lse_weighted_sum(dtype, sp):
    lses = [torch.randn(10) * 3 for _ in range(sp)]
    outs = [rand(10, 24, dtype=dtype) for _ in range(sp)]
    out, lse_m = emulator.npu_attention_update(lses, outs, 1)
    expected, expected_lse = reference_update(lses, outs)
    assert out.dtype == dtype and lse_m.dtype == torch.float32
    close(out, expected, dtype)
    torch.testing.assert_close(lse_m.double(), expected_lse, rtol=1e-5, atol=1e-5)
    assert emulator.npu_attention_update(lses, outs, 0)[1] is None


def test_attention_update_minus_inf_shards():
    lses = [torch.tensor([0.5, float("-inf")]), torch.tensor([float("-inf"), float("-inf")])]
    outs = [torch.ones(2, 8), torch.full((2, 8), 7.0)]
    out, lse_m = emulator.npu_attention_update(lses, outs, 1)
    assert torch.equal(out[0], torch.ones(8)) and lse_m[0] == 0.5
    assert out[1].isnan().all() and lse_m[1].isnan()  # the formula's 0/0 when no shard has mass


def test_attention_update_combines_kv_shards_into_full_attention():
    q_lens, shard_kv = [1, 1], [[3, 2], [4, 1], [2, 5]]  # kv lengths per shard per sequence
    q = rand(2, 4, 128, dtype=torch.bfloat16)
    shards = [(rand(sum(lens), 2, 128, dtype=torch.bfloat16),
               rand(sum(lens), 2, 128, dtype=torch.bfloat16)) for lens in shard_kv]
    partial = [fia_tnd(q, k, v, q_lens, lens, causal=False, softmax_lse_flag=True)
               for (k, v), lens in zip(shards, shard_kv, strict=True)]
    out, _ = emulator.npu_attention_update([lse.flatten() for _, lse in partial],
                                           [o.float().flatten(0, 1) for o, _ in partial], 0)
    full_k = [torch.cat([k[sum(lens[:i]):sum(lens[:i + 1])] for (k, _), lens in
                         zip(shards, shard_kv, strict=True)]) for i in range(2)]
    full_v = [torch.cat([v[sum(lens[:i]):sum(lens[:i + 1])] for (_, v), lens in
                         zip(shards, shard_kv, strict=True)]) for i in range(2)]
    kv_lens = [t.shape[0] for t in full_k]
    expected, _ = reference_attention(q, torch.cat(full_k), torch.cat(full_v), q_lens, kv_lens,
                                      128**-0.5, False)
    close(out.view(2, 4, 128), expected, torch.bfloat16)
