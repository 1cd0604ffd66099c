"""The stand-in's versions of vllm-ascend's own operators, which stock vllm-ascend needs where
its compiled library and triton-ascend are absent: `_C_ascend::npu_add_rms_norm_bias`
(emulator/operators/vllm_ascend_library.py, vllm-ascend's `csrc/moe/add_rms_norm_bias` kernel) and
`vllm::qkv_rmsnorm_rope` (emulator/operators/vllm_ascend_triton.py, its Triton kernel
`split_qkv_rmsnorm_rope_kernel`), each against its formula written out token by token, with
the kernel's rounding steps, and their refusals."""

from __future__ import annotations

import pytest
import torch
from support.npu_inputs import BF16
from support.npu_inputs import seeded_rand as rand

from vllm_npu_ext.emulator.operators import vllm_ascend_library as c_ascend
from vllm_npu_ext.emulator.operators import vllm_ascend_triton as ascend_triton
from vllm_npu_ext.emulator.runtime import registry as _runtime


@pytest.fixture(scope="module")
def ops():
    c_ascend.register()
    return torch.ops._C_ascend


def add_rms_norm_bias_reference(x1, x2, gamma, beta, eps):
    """Row by row, as add_rms_norm_bias_single_n.h: the sum rounded to the dtype (x), rstd in
    float32 from it; bf16: x * rstd rounded to bf16, then * gamma + beta in float32."""
    dtype, rows = x1.dtype, []
    x = (x1.float() + x2.float()).to(dtype)
    for row in x.reshape(-1, x.shape[-1]):
        r32 = row.float()
        rstd = 1.0 / torch.sqrt((r32 * r32).sum() / r32.numel() + eps)
        normed = r32 * rstd
        if dtype == BF16:
            y = normed.to(BF16).float() * gamma.float() + (beta.float() if beta is not None else 0)
            rows.append(y.to(BF16))
        elif dtype == torch.float16:
            y = normed.to(dtype) * gamma
            rows.append(y + beta if beta is not None else y)
        else:
            rows.append(normed * gamma + (beta if beta is not None else 0))
    return torch.stack(rows).reshape(x.shape), x


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("beta", [False, True])
def test_add_rms_norm_bias_follows_the_kernel(ops, dtype, beta):
    x1, x2, gamma = rand(3, 5, 64, dtype=dtype), rand(3, 5, 64, dtype=dtype, seed=1), \
        rand(64, dtype=dtype, seed=2)
    b = rand(64, dtype=dtype, seed=3) if beta else None
    _runtime.calls.clear()
    y, rstd, x = ops.npu_add_rms_norm_bias(x1, x2, gamma, b, 1e-6)
    want_y, want_x = add_rms_norm_bias_reference(x1, x2, gamma, b, 1e-6)
    assert torch.equal(x, want_x)
    assert rstd.dtype == torch.float32 and rstd.shape == (3, 5, 1)
    tol = {BF16: 8e-3, torch.float16: 1e-3, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(y.float(), want_y.float(), rtol=tol, atol=tol)
    assert y.dtype == dtype and _runtime.calls["_C_ascend.npu_add_rms_norm_bias"] == 1


def test_add_rms_norm_bias_without_beta_is_torch_npus_add_rms_norm_in_float32(ops):
    from vllm_npu_ext import emulator

    x1, x2, gamma = (rand(4, 32, dtype=torch.float32, seed=s) for s in range(3))
    y, rstd, x = ops.npu_add_rms_norm_bias(x1, x2, gamma, None, 1e-6)
    want = emulator.npu_add_rms_norm(x1, x2, gamma, 1e-6)
    torch.testing.assert_close((y, rstd, x), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("args", "kind", "match"),
    [((rand(2, 8), rand(2, 8, dtype=torch.float16), rand(8)), TypeError, "x2"),
     ((rand(2, 8), rand(3, 8), rand(8)), ValueError, "one shape"),
     ((rand(2, 8), rand(2, 8), rand(4)), ValueError, "gamma"),
     ((rand(2, 8).int(), rand(2, 8).int(), rand(8).int()), TypeError, "x1")],
)  # fmt: skip
def test_add_rms_norm_bias_refuses_calls_outside_its_contract(ops, args, kind, match):
    with pytest.raises(kind, match=match):
        ops.npu_add_rms_norm_bias(*args)


def test_add_rms_norm_bias_fake_matches_the_kernel(ops):
    args = (rand(3, 8), rand(3, 8, seed=1), rand(8, seed=2), rand(8, seed=3), 1e-6)
    torch.library.opcheck(ops.npu_add_rms_norm_bias.default, args,
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_the_other_defined_operators_are_not_emulated(ops):
    """Defined (vllm-ascend's meta_registration.py registers Meta kernels for them), not
    emulated: a call names the operator; anything else in the namespace does not exist."""
    with pytest.raises(NotImplementedError, match="get_masked_input_and_mask"):
        ops.get_masked_input_and_mask(torch.zeros(3, dtype=torch.int64), 0, 4, 0, 4, 4)
    with pytest.raises(AttributeError, match="npu_gemma_rms_norm"):
        ops.npu_gemma_rms_norm  # noqa: B018


def qkv_reference(qkv, cos_sin_cache, positions, q_weight, k_weight, q_size, kv_size, head_dim,
                  eps, q_bias=None, k_bias=None):  # fmt: skip
    """Head by head: RMS norm in float32, * weight (+ bias), rounded to bf16; neox RoPE on the
    first rope_dim dimensions in bf16 arithmetic; v copied."""
    rope = cos_sin_cache.shape[-1]
    half = rope // 2
    q_out, k_out = torch.empty(qkv.shape[0], q_size, dtype=BF16), \
        torch.empty(qkv.shape[0], kv_size, dtype=BF16)
    for t in range(qkv.shape[0]):
        cos, sin = cos_sin_cache[positions[t], :half], cos_sin_cache[positions[t], half:]
        parts = ((0, q_size, q_weight, q_bias, q_out), (q_size, kv_size, k_weight, k_bias, k_out))
        for base, size, weight, bias, out in parts:
            for h in range(size // head_dim):
                x = qkv[t, base + h * head_dim: base + (h + 1) * head_dim].float()
                n = x / torch.sqrt((x * x).sum() / head_dim + eps) * weight.float()
                n = (n + bias.float() if bias is not None else n).to(BF16)
                x1, x2 = n[:half], n[half:rope]
                out[t, h * head_dim: (h + 1) * head_dim] = torch.cat(
                    (x1 * cos - x2 * sin, x2 * cos + x1 * sin, n[rope:]))
    return q_out, k_out, qkv[:, q_size + kv_size:]


@pytest.mark.parametrize("rope_dim", [128, 64])  # full and partial rotary
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_rmsnorm_rope_follows_the_triton_kernel(rope_dim, bias):
    head_dim, q_size, kv_size, tokens = 128, 4 * 128, 2 * 128, 6
    qkv = rand(tokens, q_size + 2 * kv_size)
    cache = rand(64, rope_dim, seed=1)
    positions = torch.tensor([0, 5, 9, 1, 63, 7])
    weights = rand(head_dim, seed=2), rand(head_dim, seed=3)
    biases = (rand(head_dim, seed=4), rand(head_dim, seed=5)) if bias else (None, None)
    _runtime.calls.clear()
    got = ascend_triton.qkv_rmsnorm_rope(qkv, cache, positions, *weights, q_size, kv_size,
                                         head_dim, 1e-6, *biases)  # fmt: skip
    want = qkv_reference(qkv, cache, positions, *weights, q_size, kv_size, head_dim, 1e-6,
                         *biases)  # fmt: skip
    for g, w in zip(got, want, strict=True):
        assert g.dtype == BF16 and g.shape == w.shape
        torch.testing.assert_close(g.float(), w.float(), rtol=8e-3, atol=8e-3)
    assert torch.equal(got[2], want[2])
    if rope_dim < head_dim:  # the unrotated tail is the normalised value itself
        tail = [q.view(tokens, 4, 128)[..., rope_dim:].float() for q in (got[0], want[0])]
        torch.testing.assert_close(*tail)
    assert _runtime.calls["vllm.qkv_rmsnorm_rope"] == 1


@pytest.mark.parametrize(
    ("change", "kind", "match"),
    [({"input": rand(3, 5)}, ValueError, "input"),
     ({"q_weight": rand(64)}, ValueError, "q_weight"),
     ({"input": rand(3, 1024, dtype=torch.float16)}, TypeError, "bfloat16"),
     ({"q_bias": rand(128)}, ValueError, "together"),
     ({"cos_sin_cache": rand(64, 130)}, ValueError, "cos_sin_cache"),
     ({"positions": torch.zeros(2, dtype=torch.int64)}, ValueError, "positions")],
)  # fmt: skip
def test_qkv_rmsnorm_rope_refuses_calls_outside_its_contract(change, kind, match):
    args = {"input": rand(3, 1024), "cos_sin_cache": rand(16, 128), "positions": torch.arange(3),
            "q_weight": rand(128), "k_weight": rand(128), "q_hidden_size": 512,
            "kv_hidden_size": 256, "head_dim": 128, "eps": 1e-6}  # fmt: skip
    with pytest.raises(kind, match=match):
        ascend_triton.qkv_rmsnorm_rope(**{**args, **change})
