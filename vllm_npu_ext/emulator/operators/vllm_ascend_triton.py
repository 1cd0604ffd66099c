"""vllm-ascend's Triton operators that stock vllm-ascend's graph mode needs, where there is no
triton-ascend: `torch.ops.vllm.qkv_rmsnorm_rope`.

vllm-ascend 0.23.0.post1 registers its Triton operators only where Triton imports (module
`vllm_ascend.ops`, `if HAS_TRITON`), and their launchers need triton-ascend's device properties and
CANN extension ops (`vllm_ascend/ops/triton/triton_utils.py`, `init_device_properties_triton`,
`get_vectorcore_num`). Its QK-norm + RoPE fusion pass does not ask: for a bfloat16 model whose
attention has head_dim 128 (stock Qwen3) it registers a replacement that calls
`torch.ops.vllm.qkv_rmsnorm_rope` (`QKNormRopeFusionPass.__init__`,
`QKNormRopeFusionPattern.get_replacement`, `BaseDeviceAdaptor.split_qkv_rmsnorm_rope`), so without
that operator stock's graph mode does not start (`'_OpNamespace' 'vllm' object has no attribute
'qkv_rmsnorm_rope'`). On Ascend, triton-ascend provides it.

The stand-in registers the operator as vllm-ascend does
(`vllm_ascend/ops/triton/linearnorm/split_qkv_rmsnorm_rope.py`, its module-level
`direct_register_custom_op(op_name="qkv_rmsnorm_rope", ...)`: no mutated arguments, the PrivateUse1
key, the same fake), and computes the kernel's arithmetic (`split_qkv_rmsnorm_rope_kernel`) in
PyTorch as one operator, the one launch it is on the device. Counted in `runtime.registry.calls` as
`vllm.qkv_rmsnorm_rope`. From the kernel:

- input `[T, q_hidden + 2 * kv_hidden]` bfloat16 (q, k, v side by side); each q and k head of
  `head_dim` is RMS-normalised in float32 (`rstd = 1 / sqrt(sum(x^2) / head_dim + eps)`), times its
  weight (+ bias) in float32, then rounded to bfloat16 (`normalized_values`, then
  `normalized_values_tmp` for q and `normalized_values_tmp1` for k, each `.to(tl.bfloat16)`);
- RoPE, neox style, on the first `rope_dim = cos_sin_cache.shape[-1]` dimensions of each head with
  `cos, sin = cos_sin_cache[position]` halves (the `cos`/`sin` slices of `values_tmp3`), in bfloat16
  arithmetic (`x1 * cos - x2 * sin`, `x2 * cos + x1 * sin`, the `# q rope` and `# k rope` blocks);
  the rest of a partially rotated head keeps its normalised values (the `IS_PARTIAL_ROPE` branches);
- v is copied (the kernel's last loop, over `v_iter_num_per_vec`). Outputs `[T, q_hidden]`,
  `[T, kv_hidden]`, `[T, kv_hidden]`.

The kernel holds its tiles in bfloat16 (`tl.zeros(..., dtype=tl.bfloat16)` for `values_tmp3`,
`values_tmp` and `values_tmp2`), and the fusion pass registers it for bfloat16 models only; other
dtypes are a TypeError here.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from ..device import graphs
from ..runtime.registry import calls

OP = "qkv_rmsnorm_rope"


def _check(input, cos_sin_cache, positions, q_weight, k_weight, q_hidden_size, kv_hidden_size,
           head_dim, q_bias, k_bias) -> None:  # fmt: skip
    name = f"vllm.{OP}"
    if input.dim() != 2 or input.shape[1] != q_hidden_size + 2 * kv_hidden_size:
        width = q_hidden_size + 2 * kv_hidden_size
        raise ValueError(f"{name}: input must be [T, q_hidden_size + 2 * kv_hidden_size] = "
                         f"[T, {width}], got {tuple(input.shape)}")  # fmt: skip
    if head_dim <= 0 or q_hidden_size % head_dim or kv_hidden_size % head_dim:
        raise ValueError(f"{name}: head_dim {head_dim} must divide q_hidden_size "
                         f"{q_hidden_size} and kv_hidden_size {kv_hidden_size}")  # fmt: skip
    tensors = {"input": input, "q_weight": q_weight, "k_weight": k_weight,
               "cos_sin_cache": cos_sin_cache, "q_bias": q_bias, "k_bias": k_bias}  # fmt: skip
    for arg, tensor in tensors.items():
        if tensor is not None and tensor.dtype != torch.bfloat16:
            raise TypeError(f"{name}: {arg} must be bfloat16 (the kernel's tiles are), got "
                            f"{tensor.dtype}")  # fmt: skip
    for arg in ("q_weight", "k_weight", "q_bias", "k_bias"):
        tensor = tensors[arg]
        if tensor is not None and tuple(tensor.shape) != (head_dim,):
            raise ValueError(f"{name}: {arg} must be [{head_dim}], got {tuple(tensor.shape)}")
    if (q_bias is None) != (k_bias is None):
        raise ValueError(f"{name}: q_bias and k_bias come together (the kernel's BIAS flag)")
    rope_dim = cos_sin_cache.shape[-1] if cos_sin_cache.dim() == 2 else -1
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > head_dim:
        raise ValueError(f"{name}: cos_sin_cache must be [max_position, rope_dim] with an "
                         f"even rope_dim <= head_dim {head_dim}, got "
                         f"{tuple(cos_sin_cache.shape)}")  # fmt: skip
    if positions.dim() != 1 or positions.shape[0] != input.shape[0] or (
            positions.dtype not in (torch.int32, torch.int64)):  # fmt: skip
        raise ValueError(f"{name}: positions must be 1-D int32/int64 of input's {input.shape[0]} "
                         f"tokens, got {tuple(positions.shape)} {positions.dtype}")  # fmt: skip
    if len({t.device for t in tensors.values() if t is not None} | {positions.device}) != 1:
        raise ValueError(f"{name}: every tensor must be on one device")


def _norm_rope(x, weight, bias, eps, cos, sin, rope_dim):
    """x `[T, H, D]` bfloat16 -> RMS norm * weight (+ bias) rounded to bf16, RoPE'd in bf16."""
    x32 = x.float()
    rstd = 1.0 / torch.sqrt((x32 * x32).sum(dim=-1, keepdim=True) / x.shape[-1] + eps)
    normed = x32 * rstd * weight.float()
    if bias is not None:
        normed = normed + bias.float()
    normed = normed.to(torch.bfloat16)
    half = rope_dim // 2
    x1, x2 = normed[..., :half], normed[..., half:rope_dim]
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rotated, normed[..., rope_dim:]), dim=-1)


def qkv_rmsnorm_rope(
    input: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor,
    q_weight: torch.Tensor, k_weight: torch.Tensor, q_hidden_size: int, kv_hidden_size: int,
    head_dim: int, eps: float, q_bias: torch.Tensor | None = None,
    k_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(q, k, v) as the kernel computes them; see the module docstring."""
    calls[f"vllm.{OP}"] += 1
    _check(input, cos_sin_cache, positions, q_weight, k_weight, q_hidden_size, kv_hidden_size,
           head_dim, q_bias, k_bias)  # fmt: skip
    tokens, rope_dim = input.shape[0], cos_sin_cache.shape[-1]
    q, k, v = input.split([q_hidden_size, kv_hidden_size, kv_hidden_size], dim=-1)
    cos_sin = cos_sin_cache.index_select(0, positions.long()).unsqueeze(1)  # [T, 1, rope_dim]
    cos, sin = cos_sin[..., : rope_dim // 2], cos_sin[..., rope_dim // 2:]
    q_out = _norm_rope(q.reshape(tokens, -1, head_dim), q_weight, q_bias, eps, cos, sin, rope_dim)
    k_out = _norm_rope(k.reshape(tokens, -1, head_dim), k_weight, k_bias, eps, cos, sin, rope_dim)
    return (q_out.reshape(tokens, q_hidden_size), k_out.reshape(tokens, kv_hidden_size),
            v.contiguous())  # fmt: skip


def _fake(input, cos_sin_cache, positions, q_weight, k_weight, q_hidden_size, kv_hidden_size,
          head_dim, eps, q_bias=None, k_bias=None):  # fmt: skip
    """vllm-ascend's own fake (0.23.0.post1 `split_qkv_rmsnorm_rope_impl_fake`)."""
    tokens = input.shape[0]
    kv = int(kv_hidden_size)
    return (input.new_empty(tokens, int(q_hidden_size)), input.new_empty(tokens, kv),
            input.new_empty(tokens, kv))  # fmt: skip


@functools.cache
def register() -> None:
    """Register `vllm::qkv_rmsnorm_rope` as vllm-ascend does where Triton imports; once."""
    from vllm.utils.torch_utils import direct_register_custom_op

    direct_register_custom_op(op_name=OP, op_func=qkv_rmsnorm_rope, fake_impl=_fake,
                              mutates_args=[], dispatch_key="PrivateUse1")  # fmt: skip
    graphs.DEVICE_KERNELS.add(f"vllm::{OP}")  # one Triton launch in a captured graph


def install() -> None:
    """Where vllm-ascend is installed and vLLM has no Triton backend (so vllm-ascend registers
    none of its Triton operators), register the ones this module stands in for."""
    if importlib.util.find_spec("vllm_ascend") is None:
        return
    from vllm.triton_utils import HAS_TRITON

    if not HAS_TRITON:
        register()
