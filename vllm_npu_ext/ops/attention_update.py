"""AttentionUpdate: merge partial attention outputs computed over disjoint KV shards.

With context parallelism every rank attends to its own part of a sequence's KV cache and
returns a partial output O_i with its log-sum-exp lse_i. The merged result is

    lse = logsumexp_i(lse_i)                      (lse_max + log(sum_i exp(lse_i - lse_max)))
    O   = sum_i O_i * exp(lse_i - lse)

This module owns the tensor-input operator `torch.ops.vllm_npu_ext.attention_update`
(`lse` fp32 `[sp, N]`, `out` `[sp, N, D]`), its argument rules, its fake kernel and its
PyTorch reference. On the NPU the work goes to one of two kernels, chosen by
`VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL`:

- `custom`: a registered tensor-input kernel (`register_custom_kernel`): our renamed CANN
  operator, which `vllm_npu_ext.cann_ops.binding` registers when it is imported; it takes
  the two tensors as they are;
- `list`: `torch_npu.npu_attention_update`, which takes TensorLists, so the tensors are
  unbound into per-shard views first (the path vllm-ascend 0.23 uses);
- `auto` (default): `custom` when a registered kernel is available, else `list`.

A caller that settles the choice once (the CP patch, when it is installed) passes a
`MergeKernel`; without one each call reads the environment.

The `list` path passes strided per-shard views (the CP buffer's rows have stride D + 1), as
vllm-ascend 0.23 does (`attention/context_parallel/common_cp.py` `_npu_attention_update`).
aclnnAttentionUpdate's table marks non-contiguous lse/localOut "x", but its L2 API makes each
list item contiguous itself before the kernel (ops-transformer
`attention_update/op_host/op_api/aclnn_attention_update.cpp`), so views are the default: no
copy of our own.
`VLLM_NPU_EXT_ATTENTION_UPDATE_CONTIGUOUS=1` copies them first, for a CANN where selfcheck's
strided AttentionUpdate cases fail while the contiguous ones pass.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence

import torch

from vllm_npu_ext import envs
from vllm_npu_ext.ops import dispatch

SP_RANGE = (1, 16)
HEAD_DIM_RANGE = (8, 512)
HEAD_DIM_MULTIPLE = 8
MAX_ROWS = 2**31 - 1  # N: the kernel's int32 row index (op_host tiling, op_api)
UPDATE_TYPES = (0, 1)
OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNEL_SWITCH = envs.ATTENTION_UPDATE_KERNEL.name
CONTIGUOUS_SWITCH = envs.ATTENTION_UPDATE_CONTIGUOUS.name

OP_NAMESPACE = "vllm_npu_ext"
OP_NAME = "attention_update"
OP_SCHEMA = "attention_update(Tensor lse, Tensor out, int update_type=0) -> (Tensor, Tensor)"


def check_attention_update_args(lse: torch.Tensor, out: torch.Tensor, update_type: int = 0) -> None:
    """Raise ValueError (naming the argument) unless the inputs follow the operator contract.

    lse: fp32 `[sp, N]`, sp in SP_RANGE, N <= MAX_ROWS. out: fp32/fp16/bf16 `[sp, N, D]` on
    lse's device, D in HEAD_DIM_RANGE and a multiple of HEAD_DIM_MULTIPLE. update_type: 0 or 1.
    """
    for name, value, rank in (("lse", lse, 2), ("out", out, 3)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.dim() != rank:
            raise ValueError(
                f"{name} must be {rank}-D ({'[sp, N]' if rank == 2 else '[sp, N, D]'}), "
                f"got shape {tuple(value.shape)}"
            )
    if lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32, got {lse.dtype}")
    if out.dtype not in OUT_DTYPES:
        raise ValueError(f"out must be float32, float16 or bfloat16, got {out.dtype}")
    sp, num_rows = lse.shape
    if num_rows > MAX_ROWS:
        raise ValueError(f"lse: N (dim 1) must be at most {MAX_ROWS}, got {num_rows}")
    if not SP_RANGE[0] <= sp <= SP_RANGE[1]:
        raise ValueError(f"lse: sp (dim 0) must be in {SP_RANGE[0]}..{SP_RANGE[1]}, got {sp}")
    if out.shape[0] != sp or out.shape[1] != num_rows:
        raise ValueError(
            f"out must be [sp, N, D] = [{sp}, {num_rows}, D] to match lse, "
            f"got shape {tuple(out.shape)}"
        )
    head_dim = out.shape[2]
    if not HEAD_DIM_RANGE[0] <= head_dim <= HEAD_DIM_RANGE[1] or head_dim % HEAD_DIM_MULTIPLE:
        raise ValueError(
            f"out: D (dim 2) must be in {HEAD_DIM_RANGE[0]}..{HEAD_DIM_RANGE[1]} and a "
            f"multiple of {HEAD_DIM_MULTIPLE}, got {head_dim}"
        )
    if out.device != lse.device:
        raise ValueError(f"out must be on lse's device {lse.device}, got {out.device}")
    if update_type not in UPDATE_TYPES:
        raise ValueError(f"update_type must be 0 or 1, got {update_type!r}")


def attention_update_fake(
    lse: torch.Tensor, out: torch.Tensor, update_type: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shape/dtype-only outputs: (merged `[N, D]` in out's dtype, lse_out `[N]` fp32)."""
    check_attention_update_args(lse, out, update_type)
    num_rows, head_dim = out.shape[1], out.shape[2]
    return out.new_empty((num_rows, head_dim)), lse.new_empty((num_rows,))


def merge_shards(
    lse_shards: Sequence[torch.Tensor], out_shards: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge arithmetic, one pass per shard, fp32 accumulation.

    lse_shards: sp fp32 `[N]` tensors; out_shards: sp `[N, D]` tensors (any strides).
    Returns (merged `[N, D]` fp32, lse `[N]` fp32). A shard with lse = -inf (no keys) gets
    weight 0 and its out rows are ignored even if they are not finite; a row where every
    shard is empty merges to 0 with lse -inf.
    """
    lse_max = functools.reduce(torch.maximum, lse_shards)
    # Rows with no keys anywhere: subtract 0 instead of -inf so that exp() gives 0, not NaN.
    lse_max = torch.where(lse_max == float("-inf"), 0.0, lse_max)
    weights = [torch.exp(lse_i - lse_max) for lse_i in lse_shards]
    total = functools.reduce(torch.add, weights)
    inv_total = torch.where(total > 0, total.reciprocal(), 0.0)
    merged = torch.zeros(out_shards[0].shape, dtype=torch.float32, device=lse_max.device)
    for weight, out_i in zip(weights, out_shards, strict=True):
        scale = (weight * inv_total).unsqueeze(-1)
        merged.addcmul_(torch.where(scale > 0, out_i, 0.0), scale)
    return merged, lse_max + torch.log(total)


def attention_update_reference(
    lse: torch.Tensor, out: torch.Tensor, update_type: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure PyTorch AttentionUpdate with max subtraction and fp32 accumulation.

    lse: fp32 `[sp, N]`; out: `[sp, N, D]` (fp32/fp16/bf16, any strides).
    Returns (merged `[N, D]` in out's dtype, lse_out `[N]` fp32). lse_out is always computed
    here; callers of the public API get None for it when update_type == 0.
    """
    check_attention_update_args(lse, out, update_type)
    merged, lse_out = merge_shards(lse.unbind(0), out.unbind(0))
    return merged.to(out.dtype), lse_out


@dataclasses.dataclass(frozen=True)
class MergeKernel:
    """Which kernel runs the merge on the NPU: `kernel` auto, custom or list (module
    docstring); `contiguous`: copy the list path's strided views first."""

    kernel: str = "auto"
    contiguous: bool = False

    @classmethod
    def from_env(cls) -> MergeKernel:
        """VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL and _CONTIGUOUS (ValueError for a bad value)."""
        return cls(envs.ATTENTION_UPDATE_KERNEL(), envs.ATTENTION_UPDATE_CONTIGUOUS())


@dataclasses.dataclass(frozen=True)
class CustomKernel:
    """A tensor-input AttentionUpdate kernel that registers itself here (`register_custom_kernel`).

    `vllm_npu_ext.cann_ops.binding` registers our CANN operator when it is imported; this
    module never imports it. available(device): whether the kernel runs on that device.
    run(lse, out, update_type): same arguments and results as `attention_update_reference`.
    """

    name: str
    available: Callable[[torch.device], bool]
    run: Callable[[torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


_custom_kernel: CustomKernel | None = None


def register_custom_kernel(kernel: CustomKernel) -> None:
    """Make `kernel` the one the `custom` (and `auto`) choice uses; the last one wins."""
    global _custom_kernel
    _custom_kernel = kernel


def custom_kernel_available(device: torch.device) -> bool:
    """Whether a registered custom kernel runs on `device`."""
    return _custom_kernel is not None and bool(_custom_kernel.available(device))


def _kernel_choice(choice: str, device: torch.device) -> str:
    """'custom' or 'list', from the requested `choice` (auto, custom, list) and what is loaded."""
    if choice == "list":
        return "list"
    if custom_kernel_available(device):
        return "custom"
    if choice == "custom":
        raise RuntimeError(
            f"{KERNEL_SWITCH}=custom but no custom kernel is available for {device}: "
            "import vllm_npu_ext.cann_ops.binding (the CP patch does) after building and "
            "installing vllm_npu_ext/cann_ops, or use auto/list"
        )
    return "list"


def merge_reads_empty_out(kernel: MergeKernel | None, device: torch.device) -> bool:
    """Whether the NPU merge `kernel` (None: from the environment) on `device` reads a shard's
    out where its lse is -inf: torch_npu's TensorList kernel (the formula taken literally,
    0 * NaN) does; our CANN operator and the reference give such a shard weight 0 unread."""
    kernel = kernel or MergeKernel.from_env()
    return _kernel_choice(kernel.kernel, device) == "list"


def attention_update_npu(
    lse: torch.Tensor, out: torch.Tensor, update_type: int = 0, kernel: MergeKernel | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The NPU implementation: our CANN operator on the tensors, or torch_npu on lists.

    Same arguments as `attention_update_reference`. The tensors are passed as they are
    (strided views included); the list path makes one view per shard. Differences from the
    reference: lse_out may be None for update_type 0 (torch_npu allocates it only for 1),
    and torch_npu evaluates the formula literally, so a row where every shard is empty
    gives NaN there (the CP patch zeroes such rows after the merge: `patches/vllm_ascend_cp.py`).
    """
    check_attention_update_args(lse, out, update_type)
    kernel = kernel or MergeKernel.from_env()
    if _kernel_choice(kernel.kernel, lse.device) == "custom":
        return _custom_kernel.run(lse, out, update_type)
    torch_npu = dispatch.npu_ops(lse)
    if torch_npu is None:
        raise RuntimeError("attention_update_npu needs tensors that take the NPU path")
    if kernel.contiguous:
        lse, out = lse.contiguous(), out.contiguous()
    return torch_npu.npu_attention_update(list(lse.unbind(0)), list(out.unbind(0)), update_type)


def attention_update(
    lse: torch.Tensor, out: torch.Tensor, update_type: int = 0, kernel: MergeKernel | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Merge partial attention results over the sp KV shards.

    lse: fp32 `[sp, N]`, the partial log-sum-exps (-inf for a shard with no keys).
    out: `[sp, N, D]` fp32/fp16/bf16, the partial outputs; strided views are accepted.
    Returns (merged `[N, D]` in out's dtype, lse_out `[N]` fp32 if update_type == 1 else None).
    `kernel`: the NPU kernel, settled by the caller (None: read from the environment).
    """
    if dispatch.npu_ops(lse) is not None:
        merged, lse_out = attention_update_npu(lse, out, update_type, kernel)
    else:
        merged, lse_out = torch.ops.vllm_npu_ext.attention_update(lse, out, update_type)
    return merged, (lse_out if update_type == 1 else None)


def _attention_update_cpu(lse, out, update_type=0):
    # The dispatcher drops arguments equal to their schema default, so kernels need it too.
    return attention_update_reference(lse, out, update_type)


def _attention_update_privateuse1(lse, out, update_type=0):
    merged, lse_out = attention_update_npu(lse, out, update_type)
    # torch_npu may leave the second output undefined (None) for update_type 0; the
    # schema promises a tensor.
    return merged, (lse.new_empty(lse.shape[1:]) if lse_out is None else lse_out)


def _register_op() -> torch.library.Library:
    lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    lib.define(OP_SCHEMA)
    lib.impl(OP_NAME, _attention_update_cpu, "CPU")
    lib.impl(OP_NAME, _attention_update_privateuse1, "PrivateUse1")
    torch.library.register_fake(f"{OP_NAMESPACE}::{OP_NAME}", attention_update_fake, lib=lib)
    return lib


_LIBRARY = _register_op()
