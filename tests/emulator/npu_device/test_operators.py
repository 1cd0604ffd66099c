"""The emulated torch_npu operators take `npu` tensors: one operator of each kind, called with
npu tensors, returns npu tensors bit-identical to the same call with CPU tensors (the CPU kernel
runs on host views of the npu memory). Mixing the devices is refused, as on an NPU."""

from __future__ import annotations

import pytest
import torch
from support.npu_inputs import MASK, rand

from vllm_npu_ext import emulator
from vllm_npu_ext.cann_ops import binding
from vllm_npu_ext.emulator.device import host_npu
from vllm_npu_ext.emulator.operators import npu_ext_cann as emulated_cann_ops


def on(device, value):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(on(device, item) for item in value)
    if isinstance(value, dict):
        return {key: on(device, item) for key, item in value.items()}
    return value


# kind -> (operator, positional tensors/values, keyword arguments), CPU tensors
CALLS = {
    "norm: npu_rms_norm": (emulator.npu_rms_norm, (rand(5, 64), rand(64)), {"epsilon": 1e-6}),
    "fused norm: npu_add_rms_norm": (emulator.npu_add_rms_norm,
                                     (rand(5, 64), rand(5, 64), rand(64)), {}),
    "rotary: npu_rotary_mul": (emulator.npu_rotary_mul,
                               (rand(1, 5, 2, 8), rand(1, 5, 1, 8).clamp(-1, 1),
                                rand(1, 5, 1, 8).clamp(-1, 1)), {}),
    "activation: npu_swiglu": (emulator.npu_swiglu, (rand(5, 32),), {}),
    "matmul: npu_linear": (emulator.npu_linear, (rand(5, 16), rand(8, 16), rand(8)), {}),
    "grouped matmul: npu_grouped_matmul": (emulator.npu_grouped_matmul,
                                           ([rand(3, 8), rand(2, 8)], [rand(8, 5), rand(8, 6)]),
                                           {"group_type": -1}),
    "attention: npu_fused_infer_attention_score": (
        emulator.npu_fused_infer_attention_score,
        (rand(7, 4, 128), rand(7, 2, 128), rand(7, 2, 128)),
        dict(atten_mask=MASK, actual_seq_lengths=[3, 7], actual_seq_lengths_kv=[3, 7],
             num_heads=4, num_key_value_heads=2, scale=0.25, input_layout="TND",
             sparse_mode=3)),
    "training attention: npu_fusion_attention": (
        emulator.npu_fusion_attention, (rand(7, 4, 16), rand(7, 2, 16), rand(7, 2, 16), 4, "TND"),
        dict(atten_mask=MASK, scale=0.25, actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7],
             sparse_mode=3)),
    "merge: npu_attention_update": (emulator.npu_attention_update,
                                    ([torch.randn(6), torch.randn(6)], [rand(6, 16), rand(6, 16)],
                                     1), {}),
    "format: npu_format_cast": (emulator.npu_format_cast, (rand(32, 16), 29), {}),
}


def flat(result):
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for item in result for t in flat(item)] if isinstance(result, (list, tuple)) else []


@pytest.mark.parametrize("kind", CALLS)
def test_an_operator_of_each_kind_runs_on_npu_tensors(kind):
    operator, args, kwargs = CALLS[kind]
    emulator.reset_counts()
    on_cpu = flat(operator(*args, **kwargs))
    falls_before = host_npu.memory_figures().fallback_calls
    on_npu = flat(operator(*on("npu", args), **on("npu", kwargs)))
    assert emulator.calls[operator.__name__] == 2
    assert host_npu.memory_figures().fallback_calls > falls_before  # its kernel on host views
    assert on_cpu and len(on_npu) == len(on_cpu)
    for npu_tensor, cpu_tensor in zip(on_npu, on_cpu, strict=True):
        assert npu_tensor.device.type == "npu", kind
        # bit-identical (NaN where the operator documents an unwritten output)
        torch.testing.assert_close(npu_tensor.cpu(), cpu_tensor, rtol=0, atol=0, equal_nan=True)


def test_our_cann_operator_runs_on_npu_tensors():
    """npu_ext_attention_update: the AscendC kernel's host build, fed npu tensors' memory."""
    lse, go = torch.randn(2, 40), torch.randn(2, 40, 128)
    with emulated_cann_ops.emulated():
        ours_cpu = binding._run(lse, go, 1)
        ours_npu = binding._run(lse.npu(), go.npu(), 1)
    for npu_tensor, cpu_tensor in zip(ours_npu, ours_cpu, strict=True):
        assert npu_tensor.device.type == "npu"
        assert torch.equal(npu_tensor.cpu(), cpu_tensor)


def test_mixing_cpu_and_npu_tensors_is_refused():
    with pytest.raises(ValueError, match="'gamma' is on cpu but 'input' is on npu"):
        emulator.npu_rms_norm(rand(5, 64).npu(), rand(64))
