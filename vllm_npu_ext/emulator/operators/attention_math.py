"""Layouts and the varlen attention math shared by the two emulated attention operators.

Every supported layout is packed into TND (`[T, N, D]` plus per-sequence lengths), attention
runs per sequence in float32 with grouped-query heads read in place (no K/V repeat), and the
result is unpacked into the caller's layout.
"""

from __future__ import annotations

import dataclasses

import torch

from ..runtime.checks import require_ndim, sequence_lengths


@dataclasses.dataclass
class Packed:
    """Query/key/value in TND with per-sequence lengths; `batch`/`seq_len` undo the packing."""

    query: torch.Tensor  # [T, N, D]
    key: torch.Tensor  # [T_kv, N_kv, D]
    value: torch.Tensor  # [T_kv, N_kv, D_v]
    query_lens: list[int]
    key_lens: list[int]
    batch: int
    seq_len: int


@dataclasses.dataclass
class AttentionResult:
    """float32 attention output `[T, N, D_v]` and per-row softmax statistics `[T, N]`."""

    out: torch.Tensor
    row_max: torch.Tensor
    row_sum: torch.Tensor

    @property
    def lse(self) -> torch.Tensor:
        """log-sum-exp of the scaled scores, `[T, N]` float32."""
        return self.row_max + torch.log(self.row_sum)


def _to_bsnd(op: str, layout: str, name: str, x: torch.Tensor, heads: int, head_dim: int | None):
    """`x` in `layout` as `[B, S, N, D]` (a view where possible)."""
    require_ndim(op, name, x, (3,) if layout in ("BSH", "SBH") else (4,))
    if layout == "BSND":
        return x
    if layout == "BNSD":
        return x.transpose(1, 2)
    hidden = x.shape[-1]
    dim = head_dim if head_dim is not None else hidden // heads
    if heads * dim != hidden:
        raise ValueError(
            f"{op}: argument {name!r} hidden size {hidden} is not {heads} heads x head_dim {dim}"
        )
    bsh = x if layout == "BSH" else x.transpose(0, 1)
    return bsh.reshape(bsh.shape[0], bsh.shape[1], heads, dim)


def pack(
    op: str, layout: str, qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    heads: tuple[int, int], cumulative: tuple[list[int] | None, list[int] | None],
    length_names: tuple[str, str],
) -> Packed:
    """Pack query/key/value given in `layout` into TND.

    `heads` is (query heads, key/value heads); `cumulative` the TND sequence-length lists
    (cumulative, no leading 0), which other layouts must leave as None.
    """
    query, key, value = qkv
    if layout == "TND":
        for name, tensor in zip(("query", "key", "value"), qkv, strict=True):
            require_ndim(op, name, tensor, (3,))
        query_lens = sequence_lengths(op, length_names[0], cumulative[0], query.shape[0])
        key_lens = sequence_lengths(op, length_names[1], cumulative[1], key.shape[0])
        if len(query_lens) != len(key_lens):
            raise ValueError(
                f"{op}: {length_names[0]} has {len(query_lens)} entries but {length_names[1]} "
                f"has {len(key_lens)}; both give one cumulative length per sequence"
            )
        return Packed(query, key, value, query_lens, key_lens, len(query_lens), 0)
    for name, lengths in zip(length_names, cumulative, strict=True):
        if lengths is not None:
            raise NotImplementedError(
                f"{op}: argument {name!r} with input_layout {layout!r} is not emulated; "
                "pass None (every sequence uses its full length)"
            )
    q = _to_bsnd(op, layout, "query", query, heads[0], None)
    k = _to_bsnd(op, layout, "key", key, heads[1], q.shape[-1])
    v = _to_bsnd(op, layout, "value", value, heads[1], q.shape[-1])
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"{op}: query, key and value must share the batch size")
    batch, seq_len, seq_len_kv = q.shape[0], q.shape[1], k.shape[1]
    return Packed(
        q.reshape(-1, *q.shape[2:]), k.reshape(-1, *k.shape[2:]), v.reshape(-1, *v.shape[2:]),
        [seq_len] * batch, [seq_len_kv] * batch, batch, seq_len,
    )


def unpack_output(layout: str, out: torch.Tensor, packed: Packed) -> torch.Tensor:
    """TND `[T, N, D]` back into `layout` (the query's batch and sequence length)."""
    if layout == "TND":
        return out
    bsnd = out.reshape(packed.batch, packed.seq_len, *out.shape[1:])
    if layout == "BSND":
        return bsnd
    if layout == "BNSD":
        return bsnd.transpose(1, 2).contiguous()
    bsh = bsnd.reshape(packed.batch, packed.seq_len, -1)
    return bsh if layout == "BSH" else bsh.transpose(0, 1).contiguous()


def unpack_rows(layout: str, rows: torch.Tensor, packed: Packed) -> torch.Tensor:
    """Per-row statistics `[T, N]` as `[T, N]` (TND) or `[B, N, S]` (other layouts)."""
    if layout == "TND":
        return rows
    return rows.reshape(packed.batch, packed.seq_len, -1).transpose(1, 2).contiguous()


def require_visible_keys(op: str, packed: Packed, causal: bool, without_keys=False) -> None:
    """ValueError when a query row would see no key: the kernel's output is undefined there.

    without_keys: let a sequence with no key at all through (FIA: its key lengths need only be
    non-negative, torch-npu 2.10.0.post4 `_op_plugin_docs.py`, npu_fused_infer_attention_score
    `actual_seq_lengths_kv`); `varlen_attention` then writes NaN for its rows, what FIA writes
    there being undocumented. Causal masking over several query tokens still raises where
    rows see no key (sparse_mode 3 wants each sequence's query length within its key length,
    ibid.; sparse_mode is ignored for one query token)."""
    for index, (q_len, kv_len) in enumerate(zip(packed.query_lens, packed.key_lens, strict=True)):
        if without_keys and kv_len == 0 and (not causal or q_len <= 1):
            continue
        if q_len and (kv_len == 0 or (causal and kv_len < q_len)):
            raise ValueError(
                f"{op}: sequence {index} has {q_len} query tokens and {kv_len} key tokens; with "
                f"{'right-down causal masking ' if causal else ''}some query rows see no key, "
                "where the real kernel's output is undefined"
            )


def varlen_attention(packed: Packed, scale: float, causal: bool) -> AttentionResult:
    """softmax(scale * q k^T [+ right-down causal mask]) v per sequence, in float32.

    Query head h reads key/value head h // (N / N_kv) (grouped-query attention).
    """
    num_heads, num_kv_heads = packed.query.shape[1], packed.key.shape[1]
    group = num_heads // num_kv_heads
    outs = [packed.value.new_zeros((0, num_heads, packed.value.shape[-1]), dtype=torch.float32)]
    maxes, sums = [outs[0].new_zeros((0, num_heads))], [outs[0].new_zeros((0, num_heads))]
    q_start = kv_start = 0
    for q_len, kv_len in zip(packed.query_lens, packed.key_lens, strict=True):
        if q_len == 0:
            kv_start += kv_len
            continue
        if kv_len == 0:  # let through by require_visible_keys (FIA only): undefined
            nan = packed.query.new_full((q_len, num_heads), float("nan"), dtype=torch.float32)
            outs.append(nan.unsqueeze(-1).expand(-1, -1, packed.value.shape[-1]))
            maxes.append(nan)
            sums.append(nan)
            q_start += q_len
            continue
        q = packed.query[q_start:q_start + q_len].float()
        k = packed.key[kv_start:kv_start + kv_len].float()
        v = packed.value[kv_start:kv_start + kv_len].float()
        q = q.reshape(q_len, num_kv_heads, group, q.shape[-1])
        scores = torch.einsum("sngd,tnd->ngst", q, k) * scale
        if causal:
            rows = torch.arange(q_len).unsqueeze(1)
            hidden = torch.arange(kv_len).unsqueeze(0) > rows + (kv_len - q_len)
            scores = scores.masked_fill(hidden, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True)
        weights = torch.exp(scores - row_max)
        row_sum = weights.sum(dim=-1, keepdim=True)
        out = torch.einsum("ngst,tnd->sngd", weights / row_sum, v)
        outs.append(out.reshape(q_len, -1, v.shape[-1]))
        maxes.append(row_max.squeeze(-1).permute(2, 0, 1).reshape(q_len, -1))
        sums.append(row_sum.squeeze(-1).permute(2, 0, 1).reshape(q_len, -1))
        q_start, kv_start = q_start + q_len, kv_start + kv_len
    return AttentionResult(torch.cat(outs), torch.cat(maxes), torch.cat(sums))
