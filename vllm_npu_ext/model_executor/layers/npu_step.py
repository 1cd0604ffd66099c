"""Per-forward state of the NPU path, built once by the model and passed to every layer.

Layers receive it explicitly (never through a global): `None` means the platform path
(vLLM's own kernels: CPU, CUDA, ...); an `NpuStep` means torch_npu operators, fused where the
`FusionConfig` says so and the PyTorch reference otherwise.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

import torch

from vllm_npu_ext.envs import FusionConfig
from vllm_npu_ext.ops import rotary
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass(frozen=True)
class NpuStep:
    """What every layer of one NPU forward pass shares.

    npu: torch_npu, as `ops.dispatch` chose it. fusions: which fused operators to use.
    cos, sin: `[T, D]` rotary tables gathered for this batch's positions (once, not per layer).
    seqs: sequence boundaries for cache-free attention; None when attention goes through
    vLLM's attention layer (KV cache present, e.g. generation).
    """

    npu: ModuleType
    fusions: FusionConfig
    cos: torch.Tensor
    sin: torch.Tensor
    seqs: PackedSeqs | None

    def ops(self, fusion: str) -> ModuleType | None:
        """torch_npu when `fusion` is on, else None (the PyTorch reference)."""
        return self.npu if getattr(self.fusions, fusion) else None


class RotaryTables:
    """Full-width cos/sin tables for `npu_rotary_mul`, built once per device and dtype."""

    def __init__(self) -> None:
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def gather(
        self, cos_sin_cache: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token cos, sin `[T, D]` for `positions` `[T]`."""
        key = (positions.device, dtype)
        if key not in self._tables:
            cache = cos_sin_cache.to(device=positions.device, dtype=dtype)
            self._tables[key] = rotary.full_width_tables(cache)
        cos_table, sin_table = self._tables[key]
        return rotary.gather_tables(cos_table, sin_table, positions)
