"""Qwen3 MLP: merged gate/up projection, SwiGLU, down projection."""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

from vllm_npu_ext.model_executor.layers import fused
from vllm_npu_ext.model_executor.layers.npu_step import NpuStep
from vllm_npu_ext.ops import activation


class Qwen3MLP(nn.Module):
    """gate and up are one `[2I, H]` weight (merged at load time), so one matmul feeds SwiGLU."""

    def __init__(self, config, quant_config, prefix: str):
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act must be 'silu' for Qwen3, got {config.hidden_act!r}")
        self.gate_up_proj = MergedColumnParallelLinear(
            config.hidden_size, [config.intermediate_size] * 2, bias=False,
            quant_config=quant_config, prefix=f"{prefix}.gate_up_proj",
        )  # fmt: skip
        self.down_proj = RowParallelLinear(
            config.intermediate_size, config.hidden_size, bias=False,
            quant_config=quant_config, prefix=f"{prefix}.down_proj",
        )  # fmt: skip
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor, step: NpuStep | None) -> torch.Tensor:
        if step is None:
            gate_up, _ = self.gate_up_proj(x)
            out, _ = self.down_proj(self.act_fn(gate_up))
            return out
        gate_up = fused.project(self.gate_up_proj, x, step)
        hidden = activation.swiglu(gate_up, npu=step.ops("swiglu"))
        return fused.project(self.down_proj, hidden, step)
