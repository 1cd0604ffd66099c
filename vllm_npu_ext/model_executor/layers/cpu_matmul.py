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
The decision is `cpu_matmul_choice.choose` (no vLLM import: `vllm-npu-ext doctor` reports it).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn
from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod


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
