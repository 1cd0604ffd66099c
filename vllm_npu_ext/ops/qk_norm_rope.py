"""Split of the merged q/k/v projection, per-head q/k RMSNorm and RoPE in one launch: vllm-ascend's
`torch.ops.vllm.qkv_rmsnorm_rope`, and its reference.

vllm-ascend 0.23.0.post1 registers the operator (a triton-ascend kernel,
`ops/triton/linearnorm/split_qkv_rmsnorm_rope.py` `split_qkv_rmsnorm_rope_impl`) in every NPU
worker where Triton imports (its `ops/__init__.py`, on import; triton-ascend is one of its
requirements); its own graph-mode fusion pass (`QKNormRopeFusionPass`) puts it into stock
Qwen3's compiled graphs for bfloat16 models with head_dim 128. Its contract, from the kernel
(`split_qkv_rmsnorm_rope_kernel`): input `[T, q_size + 2 * kv_size]` read as contiguous
row-major, bfloat16 tiles, per-head RMSNorm in float32 then the weight (+ bias) and a bf16
rounding, neox RoPE on the first `cos_sin_cache.shape[-1]` elements of each head from vLLM's
cos_sin_cache at `positions`, v copied into its own buffer. So where it is registered, the
attention layer runs one merged projection and this one operator instead of q/k norms and
rotary, and the per-forward cos/sin gather goes too.
"""

from __future__ import annotations

import torch

from vllm_npu_ext.ops import layernorm, rotary

OP = "qkv_rmsnorm_rope"
DTYPES = (torch.bfloat16,)
HEAD_DIMS = (128,)


def registered() -> bool:
    """Whether `torch.ops.vllm.qkv_rmsnorm_rope` exists in this process (vllm-ascend's NPU
    worker registers it before the model is built)."""
    return torch._C._jit_get_schemas_for_operator(f"vllm::{OP}") != []


def unsupported_reason(dtype: torch.dtype, head_dim: int, neox: bool) -> str | None:
    """Why the operator cannot serve this attention; None when it can (registration aside)."""
    if dtype not in DTYPES:
        return f"vllm.{OP} takes bfloat16 only (its Triton tiles), got {dtype}"
    if head_dim not in HEAD_DIMS:
        return f"vllm.{OP} is used for head_dim 128 only (as vllm-ascend does), got {head_dim}"
    if not neox:
        return f"vllm.{OP} rotates neox-style only"
    return None


def qkv_norm_rope(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    norms: tuple[torch.nn.Module, torch.nn.Module],
    sizes: tuple[int, int, int],
    fused: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """qkv `[T, q_size + 2 * kv_size]` (contiguous) -> q `[T, Nq, D]`, k and v `[T, Nkv, D]`.

    `norms`: the q and k RMSNorm modules (`weight` `[D]`, `variance_epsilon`, and on vllm-ascend
    an optional loaded `bias`); `sizes`: (q_size, kv_size, head_dim); `positions` `[T]` int64,
    `cos_sin_cache` `[max_pos, rotary_dim]` in qkv's dtype. `fused`: the operator, else the
    reference (float32 statistics, the weight in the input dtype, neox RoPE).
    """
    q_size, kv_size, head_dim = sizes
    tokens = qkv.shape[0]
    (q_bias, k_bias), eps = (layernorm.norm_bias(norm) for norm in norms), norms[0].variance_epsilon
    if fused:
        q, k, v = torch.ops.vllm.qkv_rmsnorm_rope(
            qkv, cos_sin_cache, positions, norms[0].weight, norms[1].weight, q_size, kv_size,
            head_dim, eps, q_bias, k_bias,
        )  # fmt: skip
    else:
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = layernorm.rms_norm_native(q.reshape(tokens, -1, head_dim), norms[0].weight, eps, q_bias)
        k = layernorm.rms_norm_native(k.reshape(tokens, -1, head_dim), norms[1].weight, eps, k_bias)
        q, k = rotary.apply_rotary_qk(q, k, positions, cos_sin_cache)
        v = v.contiguous()
    return (q.view(tokens, -1, head_dim), k.view(tokens, -1, head_dim),
            v.view(tokens, -1, head_dim))  # fmt: skip

