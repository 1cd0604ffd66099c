"""The emulated quantisation operators (emulator/operators/quant.py) against the documented formulas
written out in float64 (torch-npu 2.10.0.post4 `_op_plugin_docs.py`, each operator's docstring:
npu_dynamic_quant, scale = rowMax(|x * smooth|) / 127, y = round(x * smooth / scale);
npu_quantize, y = input * scales + zero_points, or input / scales + zero_points in div_mode;
npu_add_rms_norm_quant), and their documented refusals."""

from __future__ import annotations

import pytest
import torch
from support.npu_inputs import BF16
from support.npu_inputs import seeded_rand as rand

from vllm_npu_ext import emulator


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
    y, scale = emulator.npu_dynamic_quant(x)
    assert y.shape == x.shape and scale.shape == x.shape[:-1]
    assert_quantized(y, scale, *documented(x))
    assert y.abs().amax(-1).eq(127).all()  # each row's largest value maps to 127


def test_dynamic_quant_with_smooth_scales_and_a_zero_row():
    x, smooth = rand(3, 32), rand(32, seed=1).abs() + 0.5
    x[1] = 0
    y, scale = emulator.npu_dynamic_quant(x, smooth_scales=smooth)
    want_y, want_scale = documented(x[[0, 2]], smooth)
    assert_quantized(y[[0, 2]], scale[[0, 2]], want_y, want_scale)
    assert scale[1] == 0 and y[1].eq(0).all()


@pytest.mark.parametrize("beta", [False, True])
def test_add_rms_norm_dynamic_quant_is_add_norm_then_quantise(beta):
    x1, x2, gamma = rand(6, 64), rand(6, 64, seed=1), rand(64, seed=2)
    b = rand(64, seed=3) if beta else None
    y1, y2, x_out, scale1, scale2 = emulator.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, beta=b, epsilon=1e-6, output_mask=[True, False])
    assert torch.equal(x_out, (x1.float() + x2.float()).to(BF16))
    assert_quantized(y1, scale1, *documented(rms_normed(x1, x2, gamma, 1e-6, b)))
    assert y2.shape == (0,)  # no second output asked for: the wheel's meta shape


def test_add_rms_norm_dynamic_quant_two_smoothed_outputs():
    x1, x2, gamma = rand(5, 32), rand(5, 32, seed=1), rand(32, seed=2)
    s1, s2 = rand(32, seed=3).abs() + 0.5, rand(32, seed=4).abs() + 0.5
    y1, y2, _, scale1, scale2 = emulator.npu_add_rms_norm_dynamic_quant(
        x1, x2, gamma, smooth_scale1=s1, smooth_scale2=s2, output_mask=[True, True])
    normed = rms_normed(x1, x2, gamma, 1e-6)
    assert_quantized(y1, scale1, *documented(normed, s1))
    assert_quantized(y2, scale2, *documented(normed, s2))


@pytest.mark.parametrize(
    ("call", "kind", "match"),
    [(lambda: emulator.npu_dynamic_quant(rand(4, 8, dtype=torch.float32)), TypeError, "input"),
     (lambda: emulator.npu_dynamic_quant(rand(8)), ValueError, "input"),
     (lambda: emulator.npu_dynamic_quant(rand(2, 8), smooth_scales=rand(4)), ValueError,
      "smooth_scales"),
     (lambda: emulator.npu_dynamic_quant(rand(2, 8), dst_type=3), NotImplementedError, "int8"),
     (lambda: emulator.npu_dynamic_quant(rand(2, 8), group_index=torch.zeros(1, dtype=torch.int32)),
      NotImplementedError, "group_index"),
     (lambda: emulator.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(8),
                                                      output_mask=[False, False]),
      ValueError, "output_mask"),
     (lambda: emulator.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(8),
                                                      smooth_scale1=rand(8),
                                                      output_mask=[False, True]),
      ValueError, "smooth_scale"),
     (lambda: emulator.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(8),
                                                      smooth_scale2=rand(8)),
      ValueError, "smooth_scale1"),
     (lambda: emulator.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(3, 8), rand(8)), ValueError,
      "x2"),
     (lambda: emulator.npu_add_rms_norm_dynamic_quant(rand(2, 8), rand(2, 8), rand(4)), ValueError,
      "gamma")],
)  # fmt: skip
def test_quant_calls_outside_the_contract_are_refused(call, kind, match):
    with pytest.raises(kind, match=match):
        call()


def static_codes(y64: torch.Tensor, scales, zero_points, div_mode: bool) -> torch.Tensor:
    q = y64 / scales.double() if div_mode else y64 * scales.double()
    if zero_points is not None:
        q = q + zero_points.double()
    return torch.round(q).clamp(-128, 127)


def assert_codes(y, want):
    """int8 codes equal the float64 formula's, off by one only at float32/float64 ties."""
    assert y.dtype == torch.int8
    off = (y.double() - want).abs()
    assert off.max() <= 1 and (off > 0).float().mean() < 0.01


@pytest.mark.parametrize("div_mode", [False, True])
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_quantize_is_the_documented_static_formula(dtype, div_mode):
    x = rand(4, 6, 32, dtype=dtype) * 40  # saturates some codes
    scales = (rand(32, dtype=torch.float32, seed=1).abs() + 0.5)
    zero_points = None if div_mode else rand(32, dtype=torch.float32, seed=2).round()
    y = emulator.npu_quantize(x, scales, zero_points, torch.qint8, -1, div_mode)
    assert y.shape == x.shape
    assert_codes(y, static_codes(x.double(), scales, zero_points, div_mode))
    assert y.eq(127).any() and y.eq(-128).any()  # saturated, not wrapped


def test_quantize_takes_the_dtype_as_torch_passes_it():
    """vllm-ascend passes `torch.qint8` for the schema's `int dtype` (vllm-ascend 0.23.0.post1
    `_quantize_impl`);
    torch binds it as 12, the dtype's ScalarType value, and so does the stand-in's binder."""
    x, scales = rand(2, 8), rand(8).abs() + 0.5
    by_dtype = emulator.npu_quantize(x, scales, None, torch.qint8, -1, False)
    by_value = emulator.npu_quantize(x, scales, None, 12, -1, False)
    assert torch.equal(by_dtype, by_value)


@pytest.mark.parametrize("beta", [False, True])
def test_add_rms_norm_quant_is_add_norm_then_static_quantise(beta):
    x1, x2, gamma = rand(6, 64), rand(6, 64, seed=1), rand(64, seed=2)
    b = rand(64, seed=3) if beta else None
    scales, zero_points = rand(64, seed=4).abs() * 0.05 + 0.01, rand(64, seed=5).round()
    y1, y2, x_out = emulator.npu_add_rms_norm_quant(x1, x2, gamma, scales, zero_points, b,
                                                    epsilon=1e-6)  # fmt: skip
    assert torch.equal(x_out, (x1.float() + x2.float()).to(BF16))
    normed = rms_normed(x1, x2, gamma, 1e-6, b)
    assert_codes(y1, static_codes(normed, scales, zero_points, div_mode=True))
    assert y2.shape == x1.shape and y2.eq(0).all()  # no scales2: the meta kernel's shape


def test_add_rms_norm_quant_second_output_and_multiplying_mode():
    x1, x2, gamma = rand(5, 32), rand(5, 32, seed=1), rand(32, seed=2)
    s1, s2 = rand(32, seed=3, dtype=torch.float32).abs() + 2, rand(32, seed=4).abs() + 2
    y1, y2, _ = emulator.npu_add_rms_norm_quant(x1, x2, gamma, s1, None, None, s2.float(), None,
                                                epsilon=1e-6, div_mode=False)  # fmt: skip
    normed = rms_normed(x1, x2, gamma, 1e-6)
    assert_codes(y1, static_codes(normed, s1, None, div_mode=False))
    assert_codes(y2, static_codes(normed, s2.float(), None, div_mode=False))


@pytest.mark.parametrize(
    ("call", "kind", "match"),
    [(lambda: emulator.npu_quantize(rand(2, 8), rand(8), None, torch.quint8, -1, False),
      NotImplementedError, "int8"),
     (lambda: emulator.npu_quantize(rand(2, 8), rand(8), None, torch.qint8, -2, False),
      NotImplementedError, "last axis"),
     (lambda: emulator.npu_quantize(rand(2, 8), rand(4), None, torch.qint8, -1, False),
      ValueError, "scales"),
     (lambda: emulator.npu_quantize(rand(2, 8), rand(8), rand(8, dtype=torch.float32), torch.qint8,
                                    -1, False), ValueError, "zero_points"),
     (lambda: emulator.npu_quantize(rand(2, 8).to(torch.int32), rand(8), None, torch.qint8, -1,
                                    False),
      TypeError, "input"),
     (lambda: emulator.npu_add_rms_norm_quant(rand(2, 8), rand(2, 8), rand(8),
                                              rand(8, dtype=torch.float16), None),
      ValueError, "scales1"),
     (lambda: emulator.npu_add_rms_norm_quant(rand(2, 8), rand(2, 8), rand(8), rand(8),
                                              rand(8, dtype=torch.float32)),
      ValueError, "zero_points1"),
     (lambda: emulator.npu_add_rms_norm_quant(rand(2, 8), rand(2, 8), rand(8), rand(8), None,
                                              axis=0), ValueError, "axis"),
     (lambda: emulator.npu_add_rms_norm_quant(rand(2, 8), rand(2, 8), rand(8), rand(8), None,
                                              zero_points2=rand(8)), ValueError, "scales2"),
     (lambda: emulator.npu_add_rms_norm_quant(rand(2, 8, dtype=torch.float32),
                                              rand(2, 8, dtype=torch.float32),
                                              rand(8, dtype=torch.float32), rand(8), None),
      TypeError, "x1")],
)  # fmt: skip
def test_static_quant_calls_outside_the_contract_are_refused(call, kind, match):
    with pytest.raises(kind, match=match):
        call()
