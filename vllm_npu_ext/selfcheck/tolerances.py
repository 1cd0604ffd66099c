"""How close a fused NPU operator must come to its PyTorch reference: written down once.

Shared by the emulator tests, the NPU test tier (`pytest -m npu`) and `vllm-npu-ext
selfcheck`, which all compare through `vllm_npu_ext.selfcheck.parity_cases`. There the
reference runs on the CPU from float32 copies of the fused operator's (already rounded)
inputs and each output is rounded once to its dtype: what an exact kernel would return. A
reference run in bfloat16/float16 would round every intermediate (`x * cos` and
`rotate_half(x) * sin` separately, the normalised row before the weight) and spend part of
the budget on its own error: at Qwen3 sizes up to 0.65 of the float16 tolerance, measured.
The fused kernel then differs from the reference in two ways only:

- Accumulation order. Fused kernels tile their reductions (matmul K, attention keys, norm
  width) across AI cores and accumulate tiles in float32; the sums are the same numbers added
  in another order. For float32 inputs that moves results by a few ulps per thousand terms,
  hence rtol 1e-5 rather than torch's default 1.3e-6. (A kernel that multiplies float32 in
  HF32, 10 mantissa bits, would show ~1e-3 relative error and fail here on purpose.)
- Output rounding. The kernel's float32 result and the reference's differ by the
  accumulation order, so rounding them to the output dtype can land one step apart: one
  bfloat16 step is 2**-8 relative (~0.4%), inside rtol 1.6e-2 (torch's bfloat16 default)
  with room for a kernel that rounds an intermediate or two itself; float16 has 2**-11
  (~0.05%), rtol 1e-3. atol covers values near zero, where relative error is meaningless.

Attention adds a softmax over up to thousands of keys; flash-style kernels round the
probabilities to the input dtype before the second matmul (P @ V), so its float16/bfloat16
atol is looser. AttentionUpdate (torch_npu's TensorList op and our custom op alike) sums
exp-weighted partial outputs; it keeps the attention tolerances.

Whole-model embeddings compound these over every layer; after L2 normalisation the cosine to
the reference is what users see. Targets: float32 0.99999 (the project's parity bar),
float16 0.9999, bfloat16 0.999 (bfloat16 has 3 fewer mantissa bits than float16: 8x coarser).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


_DEFAULT: dict[torch.dtype, Tolerance] = {
    torch.float32: Tolerance(atol=1e-5, rtol=1e-5),
    torch.float16: Tolerance(atol=2e-3, rtol=1e-3),
    torch.bfloat16: Tolerance(atol=1.6e-2, rtol=1.6e-2),
}

# Per-operator exceptions to _DEFAULT (operator name as in torch_npu).
_OVERRIDES: dict[tuple[str, torch.dtype], Tolerance] = {
    ("npu_fused_infer_attention_score", torch.float16): Tolerance(atol=4e-3, rtol=2e-3),
    ("npu_fused_infer_attention_score", torch.bfloat16): Tolerance(atol=3e-2, rtol=2e-2),
    ("npu_fusion_attention", torch.float16): Tolerance(atol=4e-3, rtol=2e-3),
    ("npu_fusion_attention", torch.bfloat16): Tolerance(atol=3e-2, rtol=2e-2),
    ("npu_attention_update", torch.float16): Tolerance(atol=4e-3, rtol=2e-3),
    ("npu_attention_update", torch.bfloat16): Tolerance(atol=3e-2, rtol=2e-2),
    ("npu_ext_attention_update", torch.float16): Tolerance(atol=4e-3, rtol=2e-3),
    ("npu_ext_attention_update", torch.bfloat16): Tolerance(atol=3e-2, rtol=2e-2),
}

EMBEDDING_MIN_COSINE: dict[torch.dtype, float] = {
    torch.float32: 0.99999,
    torch.float16: 0.9999,
    torch.bfloat16: 0.999,
}


def op_tolerance(operator: str, dtype: torch.dtype) -> Tolerance:
    """The tolerance for `operator`'s output in `dtype` against the float32 reference."""
    if dtype not in _DEFAULT:
        raise ValueError(f"no tolerance for dtype {dtype}; expected one of {list(_DEFAULT)}")
    return _OVERRIDES.get((operator, dtype), _DEFAULT[dtype])


def min_embedding_cosine(dtype: torch.dtype) -> float:
    """The lowest cosine an embedding computed in `dtype` may have to the float32 reference."""
    if dtype not in EMBEDDING_MIN_COSINE:
        raise ValueError(f"no embedding tolerance for dtype {dtype}")
    return EMBEDDING_MIN_COSINE[dtype]
