"""The independent oracle (`vllm_npu_ext.selfcheck.hf_oracle`) and how tests compare with it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_npu_ext.selfcheck.hf_oracle import hf_embeddings
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

__all__ = ["MIN_COSINE", "cosines", "hf_embeddings"]

# float32 embeddings from vLLM (any path) against the float32 oracle.
MIN_COSINE = min_embedding_cosine(torch.float32)


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.float(), b.float(), dim=-1)
