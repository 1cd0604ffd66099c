"""Causal attention over packed variable-length sequences (TND), with native GQA.

The fused path is `npu_fused_infer_attention_score` (FIA) or `npu_fusion_attention` (FA) in
TND layout: no padding, K/V never repeated per query group (the operators take the kv head
count), the causal mask in the operators' compressed 2048x2048 form built once per device.
The reference computes each sequence on its own.

Which operator takes which shapes in TND (`choose_operator`), from torch-npu 2.10.0.post4's
`torch_npu/_op_plugin_docs.py` (the docstrings of `npu_fused_infer_attention_score`,
`npu_fused_infer_attention_score_v2` and `npu_fusion_attention`), op-plugin's FIA document and
vllm-ascend 0.23.0.post1's own calls (docs/environment.md, "Operator limits on Ascend"):

- FIA: bfloat16 only; head_dim 128 or 192; q heads a multiple of kv heads, ratio <= 64; at
  most 4096 sequences. These are the limits of `npu_fused_infer_attention_score_v2`'s passage
  and of op-plugin's FIA document; the older passage of `npu_fused_infer_attention_score`
  itself (head_dim 192 only, equal head counts) is contradicted by both and by vllm-ascend's
  hardware-tested calls, so it is not followed. vllm-ascend calls exactly this (TND, GQA,
  head_dim 128, bf16, sparse_mode 3 with equal q/kv lengths) on every Qwen3 prefill
  (`AscendAttentionBackendImpl.forward_fused_infer_attention`).
- FA: float16, bfloat16, float32; head_dim 1..768; q heads 1..256, a multiple of kv heads; at
  most 1024 sequences in TND.
- both: T <= 1M tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from types import ModuleType

import torch

from vllm_npu_ext.ops.packed import PackedSeqs

# sparse_mode 3 ("rightDownCausal") reads this compressed mask instead of a [T, T] one.
COMPRESSED_MASK_SIZE = 2048
SPARSE_MODE_NONE = 0
SPARSE_MODE_CAUSAL = 3
FUSED_INFER = "fused_infer_attention_score"
FUSION = "fusion_attention"
OPERATORS = (FUSED_INFER, FUSION)
FUSED_INFER_TND_DTYPES = (torch.bfloat16,)
FUSED_INFER_TND_HEAD_DIMS = (128, 192)
FUSION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FUSION_MAX_HEAD_DIM = 768
MAX_HEADS = 256
MAX_GQA_RATIO = 64
MAX_SEQS = {FUSED_INFER: 4096, FUSION: 1024}
MAX_TOKENS = 1 << 20


@dataclasses.dataclass(frozen=True)
class OperatorChoice:
    """The fused operator for one attention shape: `operator` is None when neither takes it
    (the unfused path); `reason` says why it is not the requested one ("" when it is)."""

    operator: str | None
    reason: str = ""


def unsupported_reason(
    operator: str, dtype: torch.dtype, head_dim: int, num_heads: int, num_kv_heads: int
) -> str | None:
    """Why `operator` cannot take TND attention of this dtype and shape; None when it can."""
    if operator not in OPERATORS:
        raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        return f"needs q heads ({num_heads}) to be a multiple of kv heads ({num_kv_heads})"
    if num_heads > MAX_HEADS:
        return f"takes at most {MAX_HEADS} q heads, got {num_heads}"
    if operator == FUSION:
        if dtype not in FUSION_DTYPES:
            return f"does not take {dtype}"
        if not 1 <= head_dim <= FUSION_MAX_HEAD_DIM:
            return f"takes head_dim 1..{FUSION_MAX_HEAD_DIM}, got {head_dim}"
        return None
    if dtype not in FUSED_INFER_TND_DTYPES:
        return f"takes bfloat16 only in TND layout, got {dtype}"
    if head_dim not in FUSED_INFER_TND_HEAD_DIMS:
        return f"takes head_dim 128 or 192 only in TND layout, got {head_dim}"
    if num_heads // num_kv_heads > MAX_GQA_RATIO:
        return f"takes a q/kv head ratio of at most {MAX_GQA_RATIO}"
    return None


def choose_operator(
    requested: str, dtype: torch.dtype, head_dim: int, num_heads: int, num_kv_heads: int
) -> OperatorChoice:
    """`requested`, else the other fused operator, else None, for TND attention of this shape.

    dtype: q/k/v's; head_dim: D; num_heads / num_kv_heads: q and k/v heads (per rank).
    """
    reasons = []
    for operator in (requested, *(op for op in OPERATORS if op != requested)):
        reason = unsupported_reason(operator, dtype, head_dim, num_heads, num_kv_heads)
        if reason is None:
            return OperatorChoice(operator, "; ".join(reasons))
        reasons.append(f"npu_{operator} {reason}")
    return OperatorChoice(None, "; ".join(reasons))


@functools.cache
def compressed_causal_mask(device: torch.device) -> torch.Tensor:
    """`triu(ones(2048, 2048), 1)` as bool: True marks a masked (future) position."""
    ones = torch.ones(COMPRESSED_MASK_SIZE, COMPRESSED_MASK_SIZE, dtype=torch.bool, device=device)
    return torch.triu(ones, diagonal=1)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSeqs,
    scale: float,
    causal: bool = True,
    npu: ModuleType | None = None,
    operator: str = FUSED_INFER,
    out: torch.Tensor | None = None,
    kv_seqs: PackedSeqs | None = None,
) -> torch.Tensor:
    """Attention within each packed sequence.

    q `[T, Nq, D]`, k and v `[T, Nkv, D]` with Nq a multiple of Nkv (GQA), `seqs` covering
    exactly T tokens, `scale` usually `D**-0.5` -> `[T, Nq, D]` in q's dtype. With `npu`,
    `operator` must take these shapes (`choose_operator`; ValueError otherwise); batches
    beyond its sequence limit run as several calls. `out` (contiguous, like q): the result is
    written there and returned; FIA writes it itself (its `.out` overload), the others are
    copied into it.

    `kv_seqs`: the keys' own boundaries when a sequence has more keys than queries (k and v
    then `[T_kv, Nkv, D]`, sequence i's queries its last `seqs` tokens: a shared prefix's keys
    before its own, `ops.shared_prefix`); causal masking is then right-down aligned, each
    query seeing the keys up to its own position, as sparse_mode 3 is documented for
    "actual_seq_lengths < actual_seq_lengths_kv" (torch-npu 2.10.0.post4
    `_op_plugin_docs.py`, the TND constraints of npu_fused_infer_attention_score and _v2).
    """
    kv_seqs = seqs if kv_seqs is None else kv_seqs
    _check_shapes(q, k, v, seqs, kv_seqs)
    if npu is None:
        return _into(out, varlen_attention_native(q, k, v, seqs, scale, causal, kv_seqs))
    problem = unsupported_reason(operator, q.dtype, q.shape[2], q.shape[1], k.shape[1])
    if problem is not None:
        raise ValueError(f"operator: npu_{operator} {problem} (see choose_operator)")
    outputs = []
    for (q_start, q_chunk), (kv_start, kv_chunk) in _paired_chunks(seqs, kv_seqs, operator):
        rows = slice(q_start, q_start + q_chunk.num_tokens)
        kv_rows = slice(kv_start, kv_start + kv_chunk.num_tokens)
        target = None if out is None else out[rows]
        outputs.append(_fused_attention(npu, operator, q[rows], k[kv_rows], v[kv_rows],
                                        (q_chunk, kv_chunk), scale, causal, target))  # fmt: skip
    if out is not None:
        return out
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _paired_chunks(seqs: PackedSeqs, kv_seqs: PackedSeqs, operator: str):
    """Query and key chunks of the same sequences within the operator's limits, as
    `[((q_start, q_seqs), (kv_start, kv_seqs))]`."""
    q_chunks = seqs.chunks(MAX_SEQS[operator], MAX_TOKENS)
    if kv_seqs is seqs:
        return [(chunk, chunk) for chunk in q_chunks]
    kv_chunks = kv_seqs.chunks(MAX_SEQS[operator], MAX_TOKENS)
    if [c.num_seqs for _, c in q_chunks] == [c.num_seqs for _, c in kv_chunks]:
        return list(zip(q_chunks, kv_chunks, strict=True))
    chunks, first = [], 0  # the key side's split decides: it is never shorter
    for _, kv_chunk in kv_chunks:
        last = first + kv_chunk.num_seqs
        q_start = seqs.cu_seqlens[first]
        q_cu = tuple(c - q_start for c in seqs.cu_seqlens[first : last + 1])
        chunks.append(((q_start, PackedSeqs(q_cu)), (kv_seqs.cu_seqlens[first], kv_chunk)))
        first = last
    return chunks


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    return result if out is None else out.copy_(result)


def fia_tnd_kwargs(q: torch.Tensor, k: torch.Tensor, seqs: PackedSeqs, scale: float,
                   causal: bool = True, kv_seqs: PackedSeqs | None = None) -> dict:  # fmt: skip
    """FIA's keyword arguments for packed TND attention of q `[T, Nq, D]` and k `[T_kv, Nkv, D]`
    over `seqs` (cumulative lengths; the keys' are `kv_seqs`', equal to q's when None)."""
    lengths = seqs.actual_seq_lengths
    kv_lengths = lengths if kv_seqs is None else kv_seqs.actual_seq_lengths
    return dict(
        atten_mask=compressed_causal_mask(q.device) if causal else None,
        actual_seq_lengths=lengths, actual_seq_lengths_kv=kv_lengths,
        num_heads=q.shape[1], num_key_value_heads=k.shape[1], scale=scale,
        input_layout="TND", sparse_mode=SPARSE_MODE_CAUSAL if causal else SPARSE_MODE_NONE,
    )  # fmt: skip


def _fused_attention(npu, operator, q, k, v, seqs: tuple[PackedSeqs, PackedSeqs],
                     scale: float, causal: bool, out: torch.Tensor | None):  # fmt: skip
    """One fused operator call on a batch within the operator's limits (into `out` if given);
    `seqs`: the query and key boundaries."""
    kwargs = fia_tnd_kwargs(q, k, seqs[0], scale, causal, seqs[1])
    if operator == FUSION:  # the same mask, mode and lengths under FA's names
        return _into(out, npu.npu_fusion_attention(
            q, k, v, q.shape[1], "TND",
            atten_mask=kwargs["atten_mask"], scale=scale, sparse_mode=kwargs["sparse_mode"],
            actual_seq_qlen=kwargs["actual_seq_lengths"],
            actual_seq_kvlen=kwargs["actual_seq_lengths_kv"],
        )[0])  # fmt: skip
    if out is None:
        return npu.npu_fused_infer_attention_score(q, k, v, **kwargs)[0]
    # `.out` writes the result where the caller wants it (no copy); its softmax_lse output is
    # unused without softmax_lse_flag (a one-element placeholder, as vllm-ascend passes).
    placeholder = torch.empty(1, dtype=q.dtype, device=q.device)
    npu.npu_fused_infer_attention_score.out(q, k, v, **kwargs, out=[out, placeholder])
    return out


def varlen_attention_native(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSeqs,
    scale: float,
    causal: bool = True,
    kv_seqs: PackedSeqs | None = None,
) -> torch.Tensor:
    """The unfused equivalent: per sequence, K/V repeated per query group, fp32 softmax
    (`kv_seqs` and the right-down causal mask as in `varlen_attention`)."""
    kv_seqs = seqs if kv_seqs is None else kv_seqs
    _check_shapes(q, k, v, seqs, kv_seqs)
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds = zip(itertools.pairwise(seqs.cu_seqlens), itertools.pairwise(kv_seqs.cu_seqlens),
                 strict=True)  # fmt: skip
    for (start, end), (kv_start, kv_end) in bounds:
        q_i = q[start:end].transpose(0, 1).float()  # [Nq, L, D]
        k_i = k[kv_start:kv_end].repeat_interleave(group, dim=1).transpose(0, 1).float()
        v_i = v[kv_start:kv_end].repeat_interleave(group, dim=1).transpose(0, 1).float()
        scores = torch.matmul(q_i, k_i.transpose(1, 2)) * scale  # [Nq, L, L_kv]
        if causal:
            length, kv_length = end - start, kv_end - kv_start
            future = torch.ones(length, kv_length, dtype=torch.bool, device=q.device)
            scores = scores.masked_fill(future.triu(kv_length - length + 1), float("-inf"))
        out[start:end] = torch.matmul(scores.softmax(dim=-1), v_i).transpose(0, 1).to(q.dtype)
    return out


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs,
                  kv_seqs: PackedSeqs) -> None:  # fmt: skip
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"q, k and v must be TND [T, N, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if k.shape != v.shape or k.shape[2] != q.shape[2]:
        raise ValueError(f"k and v must be [T_kv, Nkv, D] matching q {tuple(q.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if seqs.num_tokens != q.shape[0]:
        raise ValueError(f"seqs cover {seqs.num_tokens} tokens but q has T={q.shape[0]}")
    if kv_seqs.num_tokens != k.shape[0]:
        raise ValueError(f"kv_seqs cover {kv_seqs.num_tokens} tokens but k has {k.shape[0]}")
    if kv_seqs is not seqs and (
        kv_seqs.num_seqs != seqs.num_seqs
        or any(kv < q for q, kv in zip(seqs.seq_lens, kv_seqs.seq_lens, strict=True))
    ):
        raise ValueError(
            f"kv_seqs must give each of the {seqs.num_seqs} sequences at least as many keys as "
            f"queries, got {kv_seqs.num_seqs} with lengths {kv_seqs.seq_lens[:8]}..."
        )
