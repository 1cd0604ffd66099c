"""The emulated `npu_dynamic_quant` and `npu_add_rms_norm_dynamic_quant` (emulator/quant.py),
against the documented formula written out in float64 (torch-npu 2.10.0.post4
`_op_plugin_docs.py`:4614-4623: scale = rowMax(|x * smooth|) / 127, y = round(x * smooth /
scale)), and their documented refusals."""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext import emulator as emu

BF16 = torch.bfloat16


def rand(*shape, dtype=BF16, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def documented(x: torch.Tensor, smooth: torch.Tensor | None = None):
    """The documented per-token quantisation in float64: (y, scale)."""
    x64 = x.double() * (smooth.double() if smooth is not None else 1.0)
    scale = x64.abs().amax(dim=-1) / 127
    return torch.round(x64 / scale.unsqueeze(-1)), scale


def rms_normed(x1, x2, gamma, eps, beta=None):
    x = x1.double() + x2.double()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma.double()
    return y + beta.double() if beta is not None else y


def assert_quantized(y, scale, want_y, want_scale):
    """Scales agree to float32 rounding; each code to the documented one, off by one only where
    float32 and float64 round a tie differently (a handful of elements)."""
    assert y.dtype == torch.int8 and scale.dtype == torch.float32
    torch.testing.assert_close(scale.double(), want_scale, rtol=2e-7, atol=0)
    off = (y.double() - want_y).abs()
    assert off.max() <= 1 and (off > 0).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_dynamic_quant_is_the_documented_per_token_formula(dtype):
    x = rand(4, 5, 64, dtype=dtype)
    y, scale = emu.npu_dynamic_quant(x)
    assert y.shape == x.shape and scale.shape == x.shape[:-1]
    assert_quantized(y, scale, *documented(x))
    assert y.abs().amax(-1).eq(127).all()  # each row's largest value maps to 127


def test_dynamic_quant_with_smooth_scales_and_a_zero_row():
    x, smooth = rand(3, 32), rand(32, seed=1).abs() + 0.5
    x[1] = 0
    y, scale = emu.npu_dynamic_quant(x, smooth_scales=smooth)
    want_y, want_scale = documented(x[[0, 2]], smooth)
    assert_quantized(y[[0, 2]], scale[[0, 2]], want_y, want_scale)
    assert scale[1] == 0 and y[1].eq(0).all()


@pytest.mark.parametrize("beta", [False, True])
def test_add_rms_norm_dynamic_quant_is_add_norm_then_quantise(beta):
    x1, x2, gamma = rand(6, 64), rand(6, 64, seed=1), rand(64, seed=2)
    b = rand(64, seed=3) if beta else None
    y1, y2, x_out, scale1, scale2 = emu.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, beta=b, epsilon=1e-6, output_mask=[True, False])
    assert torch.equal(x_out, (x1.float() + x2.float()).to(BF16))
    assert_quantized(y1, scale1, *documented(rms_normed(x1, x2, gamma, 1e-6, b)))
    assert y2.shape == (0,)  # no second output asked for: the wheel's meta shape


def test_add_rms_norm_dynamic_quant_two_smoothed_outputs():
    x1, x2, gamma = rand(5, 32), rand(5, 32, seed=1), rand(32, seed=2)
    s1, s2 = rand(32, seed=3).abs() + 0.5, rand(32, seed=4).abs() + 0.5
    y1, y2, _, scale1, scale2 = emu.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, smooth_scale1=s1, smooth_scale2=s2, output_mask=[True, True])
    normed = rms_normed(x1, x2, gamma, 1e-6)
    assert_quantized(y1, scale1, *documented(normed, s1))
    assert_quantized(y2, scale2, *documented(normed, s2))


@pytest.mark.parametrize(
    ("call", "kind", "match"),
    [(lambda: emu.npu_dynamic_quant(rand(4, 8, dtype=torch.float32)), TypeError, "input"),
     (lambda: emu.npu_dynamic_quant(rand(8)), ValueError, "input"),
     (lambda: emu.npu_dynamic_quant(rand(2, 8), smooth_scales=rand(4)), ValueError,
      "smooth_scales"),
     (lambda: emu.npu_dynamic_quant(rand(2, 8), dst_type=3), NotImplementedError, "int8"),
     (lambda: emu.npu_dynamic_quant(rand(2, 8), group_index=torch.zeros(1, dtype=torch.int32)),
      NotImplementedError, "group_index"),
     (lambda: emu.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(8),
                                                 output_mask=[False, False]),
      ValueError, "output_mask"),
     (lambda: emu.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(8),
                                                 smooth_scale1=rand(8), output_mask=[False, True]),
      ValueError, "smooth_scale"),
     (lambda: emu.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(8),
                                                 smooth_scale2=rand(8)),
      ValueError, "smooth_scale1"),
     (lambda: emu.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(3, 8), rand(8)), ValueError,
      "x2"),
     (lambda: emu.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(4)), ValueError,
      "gamma")],
)  # fmt: skip
def test_quant_calls_outside_the_contract_are_refused(call, kind, match):
    with pytest.raises(kind, match=match):
        call()
