"""Patches of other packages, one small module each.

`apply_patches()` runs from `register()` in every vLLM process. It stays cheap and safe
there: a patch module checks with `importlib.util.find_spec` that its target package is
installed before importing anything of it, and each one has its own off switch.

- `vllm_ascend_cp`: vllm-ascend's context-parallel decode merge -> our tensor-input
  AttentionUpdate (VLLM_NPU_EXT_CP_PATCH).
- `vllm_ascend_cos_sin`: vllm-ascend's per-step cos/sin tables, stopped for our pooling model,
  which does not read them (VLLM_NPU_EXT_COS_SIN_PATCH); applied by the model when it is built,
  not here.
"""

from __future__ import annotations


def apply_patches() -> list[str]:
    """Apply (or arrange) every patch; returns one line per patch applied."""
    from vllm_npu_ext.patches import vllm_ascend_cp

    return vllm_ascend_cp.install()
