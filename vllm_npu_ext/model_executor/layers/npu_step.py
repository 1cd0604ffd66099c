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
    """The model's one rotary table: vLLM's rotary embedding (`source`, which every attention
    layer takes for the platform path), and for the NPU path its `cos_sin_cache`
    `[max_pos, rotary_dim]` in the model's dtype (for npu_mrope and vllm-ascend's q/k norm +
    rope operator) and full-width cos/sin tables `[max_pos, D]` (for `npu_rotary_mul` and the
    reference), built once.

    The tables are (non-persistent) buffers built right after loading (`prepare`), so a
    compiled forward reads them as module state and only the per-batch gather, where a path
    needs it, is in the graph. `source` is registered by each attention layer, as in vLLM's
    Qwen3, so it is held here without being registered a second time.
    """

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        self._source = (source,)
        self.register_buffer("cos_sin_cache", torch.empty(0), persistent=False)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    @property
    def source(self) -> nn.Module:
        """vLLM's rotary embedding (`get_rope`), shared by every attention layer."""
        return self._source[0]

    def prepare(self, dtype: torch.dtype, device: torch.device | None = None) -> None:
        """Build the tables from the source's `cos_sin_cache` in `dtype` (on `device`)."""
        cache = self.source.cos_sin_cache.to(device=device, dtype=dtype)
        self.cos_sin_cache = cache.contiguous()
        self.cos, self.sin = rotary.full_width_tables(self.cos_sin_cache)

    def cache(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The `[max_pos, rotary_dim]` cache on `device` in `dtype` (built first if needed)."""
        stale = self.cos_sin_cache.dtype != dtype or self.cos_sin_cache.device != device
        if not self.cos_sin_cache.numel() or stale:
            self.prepare(dtype, device)
        return self.cos_sin_cache

    def gather(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token cos, sin `[T, D]` for `positions` `[T]` (after `cache`)."""
        return rotary.gather_tables(self.cos, self.sin, positions)
