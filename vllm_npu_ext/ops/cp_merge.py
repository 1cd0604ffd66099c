"""Context-parallel decode: exchange partial attention results and merge them.

In DCP every rank attends with all `dcp * H` query heads to its own KV shard; in PCP every
rank holds a different part of each sequence's KV as well. Each rank then owns the partial
outputs of `H` heads from every CP rank and merges them with AttentionUpdate.

The layout is chosen so that the merge needs no per-shard slicing or stacking:

    pack:      out [bs, dcp*H, D] + lse [bs, dcp*H]  ->  send buffer fp32 [dcp, bs, H, D+1]
               (out and lse written into one buffer, head blocks leading: two copy_ calls)
    exchange:  all_to_all over DCP (block j goes to DCP rank j), then all-gather over PCP
               ->  buffer fp32 [world, bs, H, D+1], world = pcp * dcp,
               shard index = pcp_rank * dcp + dcp_rank
    merge:     lse = buffer[..., D] viewed [world, bs*H], out = buffer[..., :D] viewed
               [world, bs*H, D] (strided views of the one buffer)  ->  [bs, H, D] fp32

vllm-ascend 0.23 exchanges the same bytes in a `[dcp*H, D+1, bs]` layout, so before its
TensorList call it must permute and copy the whole buffer and unbind it into per-shard views.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vllm_npu_ext.ops.attention_update import MergeKernel, attention_update


def group_size(group: dist.ProcessGroup | None) -> int:
    """World size of a process group; None stands for a group of one."""
    return 1 if group is None else dist.get_world_size(group)


def pack_out_lse(
    out: torch.Tensor,
    lse: torch.Tensor,
    dcp_size: int,
    empty: torch.Tensor | None = None,
    *,
    neg_inf: torch.Tensor | None = None,
    zero_out: bool = True,
) -> torch.Tensor:
    """Write local partial results into a DCP send buffer.

    out: `[bs, dcp_size * H, D]` (any float dtype); lse: `[bs, dcp_size * H]` or
    `[bs, dcp_size * H, 1]`. empty: bool `[bs]` on out's device, True for a sequence of which
    this rank holds no key: its lse is written as -inf and (`zero_out`) its out rows as 0,
    whatever the attention kernel left there (FIA's result for zero keys is not documented),
    so the merge gives the shard weight 0. None: every sequence has keys here. The lse is
    written through `torch.where` from `neg_inf` (an fp32 0-dim tensor on out's device; made
    here when None) in place of its copy; `zero_out=False` (a merge that does not read out at
    weight 0, e.g. inside a graph) adds nothing else.
    Returns fp32 `[dcp_size, bs, H, D + 1]`: block j holds heads `j*H .. (j+1)*H - 1`,
    last channel the lse.
    """
    if out.dim() != 3:
        raise ValueError(f"out must be [bs, dcp_size * H, D], got shape {tuple(out.shape)}")
    num_tokens, total_heads, head_dim = out.shape
    if dcp_size < 1 or total_heads % dcp_size:
        raise ValueError(f"dcp_size must divide out's head count {total_heads}, got {dcp_size}")
    if lse.numel() != num_tokens * total_heads or lse.shape[:2] != out.shape[:2]:
        raise ValueError(
            f"lse must be [bs, H] or [bs, H, 1] = {tuple(out.shape[:2])}, got {tuple(lse.shape)}"
        )
    heads = total_heads // dcp_size
    buffer = out.new_empty((dcp_size, num_tokens, heads, head_dim + 1), dtype=torch.float32)
    buffer[..., :head_dim].copy_(out.unflatten(1, (dcp_size, heads)).transpose(0, 1))
    lse_blocks = lse.reshape(num_tokens, dcp_size, heads).transpose(0, 1)
    if empty is None:
        buffer[..., head_dim].copy_(lse_blocks)
        return buffer
    if empty.shape != (num_tokens,) or empty.dtype != torch.bool:
        raise ValueError(
            f"empty must be bool [bs] = [{num_tokens}], got {empty.dtype} {tuple(empty.shape)}"
        )
    if neg_inf is None:
        neg_inf = torch.full((), float("-inf"), dtype=torch.float32, device=buffer.device)
    elif neg_inf.dim() != 0 or neg_inf.dtype != torch.float32:
        raise ValueError(f"neg_inf must be a 0-dim fp32 tensor, got {neg_inf.dtype} "
                         f"{tuple(neg_inf.shape)}")  # fmt: skip
    rows = empty.view(1, num_tokens, 1)
    torch.where(rows, neg_inf, lse_blocks.float(), out=buffer[..., head_dim])
    if zero_out:
        buffer[..., :head_dim].masked_fill_(rows.unsqueeze(-1), 0.0)
    return buffer


def _all_gather_into(output: torch.Tensor, tensor: torch.Tensor, group: dist.ProcessGroup):
    # torch 2.13 renamed all_gather_into_tensor (still present, deprecated) to all_gather_single.
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, tensor, group=group)


def exchange(
    buffer: torch.Tensor,
    dcp_group: dist.ProcessGroup | None = None,
    pcp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """The collective step: all_to_all over DCP, then all-gather over PCP, into one tensor.

    buffer: the `[dcp, bs, H, D + 1]` send buffer from `pack_out_lse`; dcp must be the DCP
    group's size. Returns `[pcp * dcp, bs, H, D + 1]` (buffer itself when both groups are
    of size 1): shard `pcp_rank * dcp + dcp_rank` is that rank's partial for our H heads.
    """
    dcp_size, pcp_size = group_size(dcp_group), group_size(pcp_group)
    if buffer.dim() != 4 or buffer.shape[0] != dcp_size:
        raise ValueError(
            f"buffer must be [dcp={dcp_size}, bs, H, D+1], got shape {tuple(buffer.shape)}"
        )
    if dcp_size > 1:
        received = torch.empty_like(buffer)
        dist.all_to_all_single(received, buffer.contiguous(), group=dcp_group)
        buffer = received
    if pcp_size > 1:
        gathered = buffer.new_empty((pcp_size * dcp_size, *buffer.shape[1:]))
        _all_gather_into(gathered, buffer.contiguous(), pcp_group)
        buffer = gathered
    return buffer


def split_out_lse(buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a merged-layout buffer: (lse `[world, bs*H]`, out `[world, bs*H, D]`).

    buffer: fp32 `[world, bs, H, D + 1]`, contiguous in its last three dims (the output of
    `exchange` is). No data is copied.
    """
    if buffer.dim() != 4 or buffer.shape[-1] < 2:
        raise ValueError(f"buffer must be [world, bs, H, D+1], got shape {tuple(buffer.shape)}")
    world, num_tokens, heads, width = buffer.shape
    if buffer.stride()[1:] != (heads * width, width, 1):
        raise ValueError(
            f"buffer must be contiguous in its last three dims, got strides {buffer.stride()}"
        )
    lse = buffer[..., width - 1 :].view(world, num_tokens * heads)
    out = buffer[..., : width - 1].view(world, num_tokens * heads, width - 1)
    return lse, out


def merge_cp_buffer(buffer: torch.Tensor, kernel: MergeKernel | None = None) -> torch.Tensor:
    """Merge a `[world, bs, H, D + 1]` buffer (see `exchange`) into `[bs, H, D]` fp32 (`kernel`:
    as `attention_update` takes it)."""
    lse, out = split_out_lse(buffer)
    merged, _ = attention_update(lse, out, kernel=kernel)
    return merged.view(buffer.shape[1], buffer.shape[2], out.shape[-1])


def cp_decode_merge(
    out: torch.Tensor,
    lse: torch.Tensor,
    dcp_group: dist.ProcessGroup | None = None,
    pcp_group: dist.ProcessGroup | None = None,
    kernel: MergeKernel | None = None,
    empty: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pack, exchange and merge one rank's partial decode attention.

    out: `[bs, dcp * H, D]`, lse: `[bs, dcp * H]` (or `[..., 1]`) fp32, this rank's partial
    over its KV shard for every head; empty: as `pack_out_lse` takes it. Returns fp32
    `[bs, H, D]`: the full attention for heads `dcp_rank * H .. (dcp_rank + 1) * H - 1`
    (0 for a sequence of which no rank holds a key).
    """
    buffer = pack_out_lse(out, lse, group_size(dcp_group), empty)
    return merge_cp_buffer(exchange(buffer, dcp_group, pcp_group), kernel)
