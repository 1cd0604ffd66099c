"""Per-forward state of the NPU path, built once by the model and passed to every layer.

Layers receive it explicitly (never through a global): `None` means the platform path
(vLLM's own kernels: CPU, CUDA, ...); an `NpuStep` means torch_npu operators, fused where the
`FusionConfig` says so and the PyTorch reference otherwise.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch
from torch import nn

from vllm_npu_ext.envs import FusionConfig
from vllm_npu_ext.ops import rotary
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass(frozen=True)
class NpuStep:
    """What every layer of one NPU forward pass shares.

    npu: torch_npu, as `ops.dispatch` chose it. fusions: which fused operators to use.
    cos, sin: `[T, D]` rotary tables gathered for this batch's positions (once, not per layer).
    seqs: explicit sequence boundaries (`forward_packed`); None in vLLM's forward, where
    cache-free attention reads them itself (`cache_free_op`) and attention with a KV cache
    goes through vLLM's attention layer.
    """

    npu: ModuleType
    fusions: FusionConfig
    cos: torch.Tensor
    sin: torch.Tensor
    seqs: PackedSeqs | None

    def ops(self, fusion: str) -> ModuleType | None:
        """torch_npu when `fusion` is on, else None (the PyTorch reference)."""
        return self.npu if getattr(self.fusions, fusion) else None


class RotaryTables(nn.Module):
    """Full-width cos/sin tables `[max_pos, D]` for `npu_rotary_mul`, built once.

    Kept as (non-persistent) buffers and built right after loading (`prepare`), so a compiled
    forward reads them as module state and only the per-batch gather is in the graph.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def prepare(self, cos_sin_cache: torch.Tensor, dtype: torch.dtype) -> None:
        """Build the tables from vLLM's `cos_sin_cache` `[max_pos, D]` in `dtype`."""
        self.cos, self.sin = rotary.full_width_tables(cos_sin_cache.to(dtype=dtype))

    def gather(
        self, cos_sin_cache: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token cos, sin `[T, D]` for `positions` `[T]` (tables built first if needed)."""
        if not self.cos.numel() or self.cos.dtype != dtype or self.cos.device != positions.device:
            self.prepare(cos_sin_cache.to(device=positions.device), dtype)
        return rotary.gather_tables(self.cos, self.sin, positions)
