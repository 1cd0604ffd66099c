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
    fill: torch.Tensor | None = None,
    zero_out: bool = True,
) -> torch.Tensor:
    """Write local partial results into a DCP send buffer.

    out: `[bs, dcp_size * H, D]` (any float dtype); lse: `[bs, dcp_size * H]` or
    `[bs, dcp_size * H, 1]`. empty: bool `[bs]` on out's device, True for a sequence of which
    this rank holds no key: its lse is written as `fill` and (`zero_out`) its out rows as 0,
    whatever the attention kernel left there (FIA's result for zero keys is not documented).
    fill: fp32 `[bs]` or 0-dim on out's device (None: -inf, the shard gets weight 0); written
    through `torch.where` in place of the lse copy. `zero_out=False` (a merge that does not read
    out at weight 0, e.g. our operator) adds nothing else. None for `empty`: every sequence has
    keys here.
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
    if fill is None:
        fill = torch.full((), float("-inf"), dtype=torch.float32, device=buffer.device)
    elif fill.dtype != torch.float32 or fill.shape not in ((), (num_tokens,)):
        raise ValueError(f"fill must be fp32 [bs] = [{num_tokens}] or 0-dim, got {fill.dtype} "
                         f"{tuple(fill.shape)}")  # fmt: skip
    rows = empty.view(1, num_tokens, 1)
    fill = fill.view(1, -1, 1) if fill.dim() else fill
    torch.where(rows, fill, lse_blocks.float(), out=buffer[..., head_dim])
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


def from_vllm_ascend_layout(buffer: torch.Tensor, dcp_size: int, pcp_size: int) -> torch.Tensor:
    """vllm-ascend 0.23's exchanged `[pcp*bs, dcp*H, D+1]` -> contiguous `[pcp*dcp, bs, H, D+1]`
    (one copy, as its `_npu_attention_update` makes)."""
    if buffer.dim() != 3 or buffer.shape[0] % pcp_size or buffer.shape[1] % dcp_size:
        raise ValueError(f"buffer must be [pcp*bs, dcp*H, D+1] with pcp={pcp_size}, "
                         f"dcp={dcp_size}, got shape {tuple(buffer.shape)}")  # fmt: skip
    rows, heads, width = buffer.shape
    shards = buffer.view(pcp_size, rows // pcp_size, dcp_size, heads // dcp_size, width)
    shards = shards.transpose(1, 2).contiguous()
    return shards.view(pcp_size * dcp_size, rows // pcp_size, heads // dcp_size, width)


def merge_pair(lses, outs, kernel: MergeKernel | None = None) -> torch.Tensor:
    """Merge two partials of the same queries over disjoint keys into fp32 `[T, N, D]`.

    lses: two `[T, N, 1]` (or `[T, N]`) tensors; outs: two `[T, N, D]` tensors, any float
    dtype, in shard order. They are copied (cast to fp32) into one `[2, T*N]` lse and one
    `[2, T*N, D]` out, the operator's tensor inputs: the copies vllm-ascend 0.23 makes to cast
    them before its TensorList call (`common_cp._npu_attn_out_lse_update`), no more.
    """
    if len(lses) != 2 or len(outs) != 2:
        raise ValueError(f"merge_pair takes two lses and two outs, got {len(lses)}, {len(outs)}")
    shape = outs[0].shape
    if len(shape) != 3 or outs[1].shape != shape:
        raise ValueError(f"outs must be two [T, N, D] tensors of one shape, got "
                         f"{tuple(outs[0].shape)}, {tuple(outs[1].shape)}")  # fmt: skip
    rows, head_dim = shape[0] * shape[1], shape[2]
    if any(lse.numel() != rows or lse.shape[:2] != shape[:2] for lse in lses):
        raise ValueError(f"lses must be [T, N, 1] = {(*shape[:2], 1)}, got "
                         f"{[tuple(lse.shape) for lse in lses]}")  # fmt: skip
    out = outs[0].new_empty((2, rows, head_dim), dtype=torch.float32)
    lse = out.new_empty((2, rows))
    for index in range(2):
        out[index].copy_(outs[index].reshape(rows, head_dim))
        lse[index].copy_(lses[index].reshape(rows))
    merged, _ = attention_update(lse, out, kernel=kernel)
    return merged.view(shape)


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
