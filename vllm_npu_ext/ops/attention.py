"""Causal attention over packed variable-length sequences (TND), with native GQA.

The fused path is `npu_fused_infer_attention_score` (or, by switch, `npu_fusion_attention`)
in TND layout: no padding, K/V never repeated per query group (the operator takes
`num_key_value_heads`), the causal mask in the operator's compressed 2048x2048 form built once
per device. The reference computes each sequence on its own.
"""

from __future__ import annotations

import functools
import itertools
from types import ModuleType

import torch

from vllm_npu_ext.ops.packed import PackedSeqs

# sparse_mode 3 ("rightDownCausal") reads this compressed mask instead of a [T, T] one.
COMPRESSED_MASK_SIZE = 2048
SPARSE_MODE_NONE = 0
SPARSE_MODE_CAUSAL = 3
OPERATORS = ("fused_infer_attention_score", "fusion_attention")
# npu_fused_infer_attention_score takes float16/bfloat16 (and int8) queries only.
FUSED_INFER_DTYPES = (torch.float16, torch.bfloat16)


def operator_for_dtype(operator: str, dtype: torch.dtype) -> str:
    """`operator`, or npu_fusion_attention where the fused-infer kernel lacks the dtype."""
    if operator not in OPERATORS:
        raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")
    if operator == "fused_infer_attention_score" and dtype not in FUSED_INFER_DTYPES:
        return "fusion_attention"
    return operator


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
    operator: str = "fused_infer_attention_score",
) -> torch.Tensor:
    """Attention within each packed sequence.

    q `[T, Nq, D]`, k and v `[T, Nkv, D]` with Nq a multiple of Nkv (GQA), `seqs` covering
    exactly T tokens, `scale` usually `D**-0.5` -> `[T, Nq, D]` in q's dtype.
    """
    _check_shapes(q, k, v, seqs)
    if npu is None:
        return varlen_attention_native(q, k, v, seqs, scale, causal)
    if operator not in OPERATORS:
        raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")
    mask = compressed_causal_mask(q.device) if causal else None
    sparse_mode = SPARSE_MODE_CAUSAL if causal else SPARSE_MODE_NONE
    lengths = seqs.actual_seq_lengths
    if operator == "fusion_attention":
        return npu.npu_fusion_attention(
            q, k, v, q.shape[1], "TND",
            atten_mask=mask, scale=scale, sparse_mode=sparse_mode,
            actual_seq_qlen=lengths, actual_seq_kvlen=lengths,
        )[0]  # fmt: skip
    out, _ = npu.npu_fused_infer_attention_score(
        q, k, v,
        atten_mask=mask, actual_seq_lengths=lengths, actual_seq_lengths_kv=lengths,
        num_heads=q.shape[1], num_key_value_heads=k.shape[1], scale=scale,
        input_layout="TND", sparse_mode=sparse_mode,
    )  # fmt: skip
    return out


def varlen_attention_native(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seqs: PackedSeqs,
    scale: float,
    causal: bool = True,
) -> torch.Tensor:
    """The unfused equivalent: per sequence, K/V repeated per query group, fp32 softmax."""
    _check_shapes(q, k, v, seqs)
    group = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for start, end in itertools.pairwise(seqs.cu_seqlens):
        q_i = q[start:end].transpose(0, 1).float()  # [Nq, L, D]
        k_i = k[start:end].repeat_interleave(group, dim=1).transpose(0, 1).float()
        v_i = v[start:end].repeat_interleave(group, dim=1).transpose(0, 1).float()
        scores = torch.matmul(q_i, k_i.transpose(1, 2)) * scale  # [Nq, L, L]
        if causal:
            length = end - start
            future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        out[start:end] = torch.matmul(scores.softmax(dim=-1), v_i).transpose(0, 1).to(q.dtype)
    return out


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: PackedSeqs) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"q, k and v must be TND [T, N, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if k.shape != v.shape or k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k and v must be [T, Nkv, D] matching q {tuple(q.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[1]})")
    if seqs.num_tokens != q.shape[0]:
        raise ValueError(f"seqs cover {seqs.num_tokens} tokens but q has T={q.shape[0]}")
