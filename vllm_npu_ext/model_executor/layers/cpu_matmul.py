"""Float32 matmuls for bf16/fp16 checkpoints on CPUs without a native half-precision matmul.

On an x86 CPU without AVX512-BF16 or AMX, PyTorch's bf16 (and fp16) matmul converts its
operands on the fly and runs about ten times slower than float32 at the sizes Qwen3 layers
use (`benchmarks/bench_embed.py`'s machine, AVX2 only, torch 2.11 and 2.13: a [2600, 128] x
[128, 512] bf16 linear 41-55 ms, float32 4-5 ms). There the platform path keeps the q/k/v, o,
gate/up and down weights of our layers in float32 (the checkpoint's bf16 values, exactly) and
multiplies in float32; each projection's output is rounded back to the model's dtype, so
everything between the projections (norms, rotary, attention, SwiGLU, the residual stream)
is unchanged. Weights of those layers take twice the memory.

`VLLM_NPU_EXT_CPU_FLOAT32_MATMUL`: `auto` (default) on the CPU platform for bf16/fp16
models when the CPU is x86 without native support for that dtype; `1` on the CPU platform
whatever the CPU; `0` never. The NPU path (an Ascend NPU or the emulator) never uses it.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod

from vllm_npu_ext import envs

SWITCH = "VLLM_NPU_EXT_CPU_FLOAT32_MATMUL"
CHOICES = ("auto", "1", "0")
HALF_DTYPES = (torch.bfloat16, torch.float16)


def native_half_matmul(dtype: torch.dtype) -> bool:
    """Whether this x86 CPU multiplies `dtype` natively (AVX512-BF16 or AMX for bf16, AMX-FP16
    for fp16), as PyTorch's CPU capability checks report it."""
    if dtype == torch.bfloat16:
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.cpu._is_amx_fp16_supported()


def choose(dtype: torch.dtype, cpu_platform_path: bool) -> tuple[bool, str]:
    """(on, why) for a model of `dtype` whose projections run the platform path on the CPU
    (`cpu_platform_path`) or not. ValueError for a value of the switch it does not know."""
    value = envs.get(SWITCH).strip().lower()
    if value not in CHOICES:
        raise ValueError(f"{SWITCH} must be one of {CHOICES}, got {value!r}")
    if not cpu_platform_path:
        return False, "not the CPU platform path"
    if dtype not in HALF_DTYPES:
        return False, f"{dtype} multiplies as it is"
    if value == "0":
        return False, f"{SWITCH}=0"
    if value == "1":
        return True, f"{SWITCH}=1"
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, f"auto: {machine} CPU (only x86 is checked for native {dtype} matmul)"
    if native_half_matmul(dtype):
        return False, f"auto: this CPU multiplies {dtype} natively"
    return True, f"auto: this x86 CPU has no native {dtype} matmul (AVX512-BF16/AMX)"


class Float32MatmulLinearMethod(UnquantizedLinearMethod):
    """vLLM's unquantized linear method, with the loaded weight (and bias) kept in float32 and
    the input multiplied in float32; the output in the input's dtype. Tensor parallelism and
    weight loading are the parent's (the weight is converted only after loading)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.weight = nn.Parameter(layer.weight.detach().float(), requires_grad=False)
        bias = getattr(layer, "bias", None)
        if isinstance(bias, torch.Tensor):
            layer.bias = nn.Parameter(bias.detach().float(), requires_grad=False)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return F.linear(x.float(), layer.weight, bias).to(x.dtype)


def use_float32_matmul(layers: Iterable[LinearBase]) -> int:
    """Give each plain (unquantized) layer of `layers` the float32 method; returns how many."""
    count = 0
    for layer in layers:
        if type(layer.quant_method) is UnquantizedLinearMethod:
            layer.quant_method = Float32MatmulLinearMethod()
            count += 1
    return count
