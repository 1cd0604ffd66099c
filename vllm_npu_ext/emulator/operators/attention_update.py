"""Emulated `npu_attention_update`: combine per-rank partial attention by their LSEs.

Formula (torch_npu docs, aclnnAttentionUpdate):
    lse_max = max_i lse_i;  lse_m = lse_max + log(sum_i exp(lse_i - lse_max))
    out = sum_i O_i * exp(lse_i - lse_m)
Evaluated literally in float32: a shard whose lse is -inf contributes nothing; a row where
every shard's lse is -inf gives exp(-inf - -inf) = NaN, as the formula (and so the kernel)
does. The emulator does not clean that up.

Strided lse/local_out views are accepted. The aclnnAttentionUpdate table marks them non-contiguous
"x" (ops-transformer `attention/attention_update/docs/aclnnAttentionUpdate.md`, the 参数说明 table
of aclnnAttentionUpdateGetWorkspaceSize, column 非连续Tensor), but its L2 API makes every list item
contiguous itself before launching the kernel (`op_host/op_api/aclnn_attention_update.cpp`,
`aclnnAttentionUpdateGetWorkspaceSize`: `l0op::Contiguous` per item), and vllm-ascend 0.23.0.post1
passes such views (`_npu_attention_update` in
`vllm_ascend/attention/context_parallel/common_cp.py`). The selfcheck runs both forms on hardware
(`attention_update` and `attention_update_strided`).
"""

from __future__ import annotations

import torch

from ..runtime.checks import FLOAT_TYPES, require_choice, require_dtype, require_ndim
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall

ATTENTION_UPDATE = "npu_attention_update"
MAX_SP = 16
HEAD_DIM_RANGE = (8, 512)


def _require_update_inputs(lse: list[torch.Tensor], local_out: list[torch.Tensor]) -> None:
    """sp in 1..16; lse_i float32 `[N]`; O_i `[N, D]` of one float dtype; D in 8..512, 8 | D."""
    if not 1 <= len(lse) <= MAX_SP:
        raise ValueError(
            f"{ATTENTION_UPDATE}: sp = len(lse) must lie in 1..{MAX_SP}, got {len(lse)}"
        )
    if len(local_out) != len(lse):
        raise ValueError(
            f"{ATTENTION_UPDATE}: lse has {len(lse)} tensors but local_out has {len(local_out)}"
        )
    rows = lse[0].shape[0] if lse[0].dim() == 1 else -1
    for index, (lse_i, out_i) in enumerate(zip(lse, local_out, strict=True)):
        require_ndim(ATTENTION_UPDATE, f"lse[{index}]", lse_i, (1,))
        require_dtype(ATTENTION_UPDATE, f"lse[{index}]", lse_i, (torch.float32,))
        require_ndim(ATTENTION_UPDATE, f"local_out[{index}]", out_i, (2,))
        require_dtype(ATTENTION_UPDATE, f"local_out[{index}]", out_i, (local_out[0].dtype,))
        if lse_i.shape[0] != rows or out_i.shape[0] != rows:
            raise ValueError(
                f"{ATTENTION_UPDATE}: every lse[i] must be [N] and local_out[i] [N, D] with one N; "
                f"lse[{index}] {tuple(lse_i.shape)}, local_out[{index}] {tuple(out_i.shape)}"
            )
    require_dtype(ATTENTION_UPDATE, "local_out[0]", local_out[0], FLOAT_TYPES)
    head_dim = local_out[0].shape[1]
    low, high = HEAD_DIM_RANGE
    if not low <= head_dim <= high or head_dim % 8 or {o.shape[1] for o in local_out} != {head_dim}:
        raise ValueError(
            f"{ATTENTION_UPDATE}: head_dim must be one value in {low}..{high}, a multiple of 8; "
            f"got {sorted({o.shape[1] for o in local_out})}"
        )


@emulated_operator(ATTENTION_UPDATE)
def npu_attention_update(call: BoundCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Combine sp partial results: lse `list[[N] float32]`, local_out `list[[N, D]]`.

    Returns (out `[N, D]` like local_out[0], lse_m `[N]` float32 when update_type == 1 else
    None: the operator only allocates the second output for update_type 1).
    """
    lse, local_out = list(call.lse), list(call.local_out)
    require_choice(ATTENTION_UPDATE, "update_type", call.update_type, (0, 1))
    _require_update_inputs(lse, local_out)
    lses = torch.stack([t.float() for t in lse])  # [sp, N]
    lse_max = lses.amax(dim=0)
    lse_m = lse_max + torch.log(torch.exp(lses - lse_max).sum(dim=0))
    weights = torch.exp(lses - lse_m).unsqueeze(-1)  # [sp, N, 1]
    out = (torch.stack([o.float() for o in local_out]) * weights).sum(dim=0)
    return out.to(local_out[0].dtype), (lse_m if call.update_type == 1 else None)
