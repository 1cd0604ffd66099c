"""Qwen3 decoder layer: pre-norm attention and MLP around one residual stream."""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.layers.layernorm import RMSNorm

from vllm_npu_ext.model_executor.layers import fused
from vllm_npu_ext.model_executor.layers.attention import Qwen3Attention
from vllm_npu_ext.model_executor.layers.mlp import Qwen3MLP
from vllm_npu_ext.model_executor.layers.npu_step import NpuStep


class Qwen3DecoderLayer(nn.Module):
    """`rotary_emb`: the model's one vLLM rotary embedding, shared by every layer."""

    def __init__(self, config, vllm_config, prefix: str, cache_free: bool, rotary_emb):
        super().__init__()
        cache_config, quant_config = vllm_config.cache_config, vllm_config.quant_config
        self.self_attn = Qwen3Attention(
            config, cache_config, quant_config, f"{prefix}.self_attn", cache_free, rotary_emb
        )
        self.mlp = Qwen3MLP(config, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        residual: torch.Tensor | None,
        step: NpuStep | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions `[T]`, hidden_states `[T, H]`, residual `[T, H]` (None in the first layer)
        -> (hidden_states, residual) for the next layer."""
        if residual is None:
            residual = hidden_states
            hidden_states = fused.rms_norm(self.input_layernorm, hidden_states, step)
        else:
            hidden_states, residual = fused.add_rms_norm(
                self.input_layernorm, hidden_states, residual, step
            )
        hidden_states = self.self_attn(positions, hidden_states, step)
        hidden_states, residual = fused.add_rms_norm(
            self.post_attention_layernorm, hidden_states, residual, step
        )
        return self.mlp(hidden_states, step), residual

    def projections(self) -> tuple[nn.Module, ...]:
        """The layer's linear projections: q/k/v, o, gate/up, down."""
        attn, mlp = self.self_attn, self.mlp
        return attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj
