"""The emulated platform keeps what the NPU platform keeps: each linear layer's `weight`.

After loading, vLLM post-processes every unquantized linear layer. On Ascend,
vllm-ascend's `AscendUnquantizedLinearMethod.process_weights_after_loading` keeps
`layer.weight` (ND, or converted in place to its NZ format), and the NPU path reads it. On
the CPU, vLLM packs the weight for oneDNN and drops `layer.weight`
(`dispatch_cpu_unquantized_gemm(layer, remove_weight=True)`), which would leave the NPU path
nothing to read. While the emulator is `torch_npu`, this module's wrapper puts the weight
back after vLLM's CPU post-processing, so the model reads `layer.weight` exactly as it does on
an NPU; the packed CPU GEMM stays for vLLM's own forward (the platform path).

The wrapper is installed on import of `vllm.model_executor.layers.linear` (never importing
vLLM itself) and does nothing while another `torch_npu` (or none) is installed.
"""

from __future__ import annotations

import sys
from types import ModuleType

import torch

from vllm_npu_ext.patches import on_import

LINEAR_MODULE = "vllm.model_executor.layers.linear"
_ORIGINAL = "__vllm_npu_ext_emulator_original__"


def _emulating() -> bool:
    """Whether `torch_npu` is this package (the emulator), by name: no import back up."""
    return getattr(sys.modules.get("torch_npu"), "__name__", None) == __package__


def _keep_weight(original):
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        weight = getattr(layer, "weight", None)
        original(self, layer)
        if not _emulating() or not isinstance(weight, torch.nn.Parameter):
            return
        current = getattr(layer, "weight", None)
        if current is None or current.numel() != weight.numel():
            layer.weight = weight  # the CPU platform dropped it; the NPU platform keeps it

    setattr(process_weights_after_loading, _ORIGINAL, original)
    return process_weights_after_loading


def patch_linear_module(module: ModuleType) -> None:
    """Wrap `UnquantizedLinearMethod.process_weights_after_loading` (once)."""
    method_class = module.UnquantizedLinearMethod
    current = method_class.process_weights_after_loading
    if not hasattr(current, _ORIGINAL):
        method_class.process_weights_after_loading = _keep_weight(current)


class KeepLinearWeights(on_import.PatchOnImport):
    def __init__(self):
        super().__init__({LINEAR_MODULE: patch_linear_module})


def install() -> None:
    """Arrange for the wrapper (idempotent); vLLM is patched when it is imported."""
    on_import.install(KeepLinearWeights())
