"""Qwen3 self-attention: fused QKV, per-head q/k RMSNorm, rotary, causal GQA attention.

On the platform path this is vLLM's Qwen3 attention (its modules and kernels). On the NPU
path every step maps to one device operator: where vllm-ascend registers its
`vllm.qkv_rmsnorm_rope` (bf16, head_dim 128), one merged q/k/v matmul and that operator
(split, q/k norms and RoPE); otherwise q/k/v from one grouped matmul on pre-transposed
weights (or one merged matmul), `npu_rms_norm` per q and k, and `npu_mrope` for both (or
`npu_rotary_mul` per tensor); then `npu_fused_infer_attention_score` on the packed batch
(TND, native GQA). Without a KV cache, attention is the op
`vllm_npu_ext::cache_free_attention` (`layers/cache_free/op.py`), which reads the batch's
sequence boundaries itself and at which vLLM splits its compiled graphs.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import QKVParallelLinear, RowParallelLinear
from vllm.model_executor.layers.rotary_embedding import get_rope

from vllm_npu_ext.model_executor.layers import fused
from vllm_npu_ext.model_executor.layers.cache_free import op as cache_free_op
from vllm_npu_ext.model_executor.layers.cache_free.backend import CacheFreeCausalAttention
from vllm_npu_ext.model_executor.layers.npu_plan import QK_FUSED, QK_MROPE
from vllm_npu_ext.model_executor.layers.npu_step import NpuStep
from vllm_npu_ext.ops import attention, linear, qk_norm_rope, rotary


def head_dim_of(config) -> int:
    """Qwen3's head size: `head_dim` where the config sets it, else hidden_size / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_embedding(config) -> nn.Module:
    """vLLM's rotary embedding for a Qwen3 config (`get_rope`): one per model, passed to every
    attention layer."""
    return get_rope(
        head_dim_of(config),
        max_position=config.max_position_embeddings,
        rope_parameters=getattr(config, "rope_parameters", None),
    )


class Qwen3Attention(nn.Module):
    """`rotary_emb`: the model's one vLLM rotary embedding (`get_rope`), shared by its layers."""

    def __init__(
        self, config, cache_config, quant_config, prefix: str, cache_free: bool, rotary_emb
    ):
        super().__init__()
        tp_size = get_tensor_model_parallel_world_size()
        total_heads, total_kv_heads = config.num_attention_heads, config.num_key_value_heads
        if total_heads % tp_size or (total_kv_heads % tp_size and tp_size % total_kv_heads):
            raise ValueError(
                f"tensor parallel size {tp_size} must divide num_attention_heads ({total_heads}) "
                f"and divide or be a multiple of num_key_value_heads ({total_kv_heads})"
            )
        self.num_heads = total_heads // tp_size
        self.num_kv_heads = max(1, total_kv_heads // tp_size)
        self.head_dim = head_dim_of(config)
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scaling = self.head_dim**-0.5

        # Hugging Face's Qwen3 gives q, k, v and o a bias when `attention_bias` is set. vLLM's
        # own Qwen3 (0.32) builds o_proj without one, and its AutoWeightsLoader ignores
        # unexpected ".bias" weights, so it silently serves such a checkpoint without o's.
        bias = getattr(config, "attention_bias", False)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, self.head_dim, total_heads, total_kv_heads, bias=bias,
            quant_config=quant_config, prefix=f"{prefix}.qkv_proj",
        )  # fmt: skip
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim, config.hidden_size, bias=bias,
            quant_config=quant_config, prefix=f"{prefix}.o_proj",
        )  # fmt: skip
        self.rotary_emb = rotary_emb
        self.cache_free = cache_free
        attn_cls = CacheFreeCausalAttention if cache_free else Attention
        self.attn = attn_cls(
            self.num_heads, self.head_dim, self.scaling, num_kv_heads=self.num_kv_heads,
            cache_config=cache_config, quant_config=quant_config, prefix=f"{prefix}.attn",
        )  # fmt: skip
        self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        # [Wq^T, Wk^T, Wv^T], each [K, N], for npu_grouped_matmul; see prepare_npu_weights.
        self.qkv_weights_kn: list[torch.Tensor] | None = None

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, step: NpuStep | None
    ) -> torch.Tensor:
        if step is None:
            return self._forward_platform(positions, hidden_states)
        return self._forward_npu(positions, hidden_states, step)

    @property
    def neox(self) -> bool:
        return getattr(self.rotary_emb, "is_neox_style", True)

    def _forward_platform(self, positions: torch.Tensor, hidden_states: torch.Tensor):
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.q_norm(q.view(*q.shape[:-1], -1, self.head_dim)).view(q.shape)
        k = self.k_norm(k.view(*k.shape[:-1], -1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        output, _ = self.o_proj(self.attn(q, k, v))
        return output

    def _forward_npu(self, positions, hidden_states: torch.Tensor, step: NpuStep) -> torch.Tensor:
        tokens = hidden_states.shape[0]
        q, k, v = self._qkv_normed_and_rotated(positions, hidden_states, step)
        if step.seqs is not None:  # explicit boundaries (forward_packed)
            out = attention.varlen_attention(
                q, k, v, step.seqs, self.scaling,
                npu=step.ops("attention"), operator=step.fusions.attention_op,
            ).view(tokens, -1)  # fmt: skip
        elif self.cache_free:  # the op reads the batch's boundaries; graphs split around it
            out = cache_free_op.cache_free_attention(
                q, k, v, self.attn.layer_name, self.scaling,
                step.fusions.attention, step.fusions.attention_op,
                in_graph=getattr(self.attn, "full_graph", None) is not None,
            ).view(tokens, -1)  # fmt: skip
        else:  # KV cache present: vLLM's attention layer owns it
            out = self.attn(q.view(tokens, -1), k.view(tokens, -1), v.view(tokens, -1))
        return fused.project(self.o_proj, out, step)

    def _qkv_normed_and_rotated(self, positions, hidden_states: torch.Tensor, step: NpuStep):
        """q `[T, Nq, D]`, k and v `[T, Nkv, D]`, q and k normed and rotated (`step.qk_path`)."""
        tokens = hidden_states.shape[0]
        if step.qk_path == QK_FUSED:
            qkv = fused.project(self.qkv_proj, hidden_states, step)
            sizes = (self.q_size, self.kv_size, self.head_dim)
            return qk_norm_rope.qkv_norm_rope(
                qkv, positions, step.cos_sin_cache, (self.q_norm, self.k_norm), sizes,
                fused=True,
            )  # fmt: skip
        q, k, v = self._project_qkv(hidden_states, step)
        q = fused.rms_norm(self.q_norm, q.view(tokens, self.num_heads, self.head_dim), step)
        k = fused.rms_norm(self.k_norm, k.view(tokens, self.num_kv_heads, self.head_dim), step)
        if step.qk_path == QK_MROPE:
            q, k = rotary.apply_rotary_qk(q, k, positions, step.cos_sin_cache, npu=step.npu)
        else:  # npu_rotary_mul per tensor (None: the reference) on the gathered tables
            q = rotary.apply_rotary(q, step.cos, step.sin, npu=step.ops("rotary"))
            k = rotary.apply_rotary(k, step.cos, step.sin, npu=step.ops("rotary"))
        return q, k, v.view(tokens, self.num_kv_heads, self.head_dim)

    def _project_qkv(self, hidden_states: torch.Tensor, step: NpuStep):
        if step.fusions.grouped_qkv and self.qkv_weights_kn is not None:
            q, k, v = linear.grouped_linear(hidden_states, self.qkv_weights_kn, npu=step.npu)
            return q, k, v
        qkv = fused.project(self.qkv_proj, hidden_states, step)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        # q and k come back contiguous from their norms; fused attention needs v contiguous.
        return q, k, v.contiguous()

    def prepare_npu_weights(self) -> None:
        """Pre-transpose q/k/v weights to [K, N] once, for the grouped matmul.

        Runs after loading and before the platform post-processes weights (vllm-ascend may
        convert them to its NZ layout), so the copies are plain row-major tensors.
        """
        if not fused.supports_npu_linear(self.qkv_proj) or self.qkv_proj.bias is not None:
            return
        weight = fused.npu_weight(self.qkv_proj)
        q, k, v = weight.split([self.q_size, self.kv_size, self.kv_size], dim=0)
        self.qkv_weights_kn = [w.t().contiguous() for w in (q, k, v)]
