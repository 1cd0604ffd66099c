"""Per-forward state of the NPU path, built once by the model and passed to every layer.

Layers receive it explicitly (never through a global): `None` means the platform path
(vLLM's own kernels: CPU, CUDA, ...); an `NpuStep` means torch_npu operators, fused where the
model's `NpuPlan` says so and the PyTorch reference otherwise.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch
from torch import nn

from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
from vllm_npu_ext.ops import rotary
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass(frozen=True)
class NpuStep:
    """What every layer of one NPU forward pass shares (positions come as the layers' argument).

    npu: torch_npu, as `ops.dispatch` chose it. fusions: which fused operators to use.
    qk_path: one of `npu_plan.QK_PATHS`. cos_sin_cache `[max_pos, rotary_dim]` in the model's
    dtype, for the paths that take it; cos, sin: `[T, D]` rotary tables gathered for this
    batch's positions (once, not per layer) for the paths that need them, else None.
    seqs: explicit sequence boundaries (`forward_packed`); None in vLLM's forward, where
    cache-free attention reads them itself (`cache_free/op.py`) and attention with a KV cache
    goes through vLLM's attention layer.
    """

    npu: ModuleType
    fusions: FusionConfig
    qk_path: str
    cos_sin_cache: torch.Tensor
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    seqs: PackedSeqs | None

    def ops(self, fusion: str) -> ModuleType | None:
        """torch_npu when `fusion` is on, else None (the PyTorch reference)."""
        return self.npu if getattr(self.fusions, fusion) else None


class RotaryTables(nn.Module):
    """vLLM's `cos_sin_cache` `[max_pos, rotary_dim]` in the model's dtype (for npu_mrope and
    vllm-ascend's q/k norm + rope operator) and full-width cos/sin tables `[max_pos, D]` (for
    `npu_rotary_mul` and the reference), built once.

    Kept as (non-persistent) buffers and built right after loading (`prepare`), so a compiled
    forward reads them as module state and only the per-batch gather, where a path needs it,
    is in the graph.
    """

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def prepare(self, cos_sin_cache: torch.Tensor, dtype: torch.dtype) -> None:
        """Build the tables from vLLM's `cos_sin_cache` `[max_pos, rotary_dim]` in `dtype`."""
        self.cos_sin_cache = cos_sin_cache.to(dtype=dtype).contiguous()
        self.cos, self.sin = rotary.full_width_tables(self.cos_sin_cache)

    def cache(self, cos_sin_cache: torch.Tensor, device: torch.device, dtype: torch.dtype):
        """The `[max_pos, rotary_dim]` cache on `device` in `dtype` (built first if needed)."""
        stale = self.cos_sin_cache.dtype != dtype or self.cos_sin_cache.device != device
        if not self.cos_sin_cache.numel() or stale:
            self.prepare(cos_sin_cache.to(device=device), dtype)
        return self.cos_sin_cache

    def gather(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token cos, sin `[T, D]` for `positions` `[T]` (after `cache`)."""
        return rotary.gather_tables(self.cos, self.sin, positions)
