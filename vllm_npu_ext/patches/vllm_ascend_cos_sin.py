"""Patch: vllm-ascend 0.23's per-step cos/sin tables, for our cache-free pooling model, which
never reads them.

What it replaces. vllm-ascend's `AscendRotaryEmbedding.__init__` records the first rotary
cache built in the process (`ops/rotary_embedding.py`, `_record_cos_sin_cache`), and from then
on its model runner calls `update_cos_sin(positions)` before every forward
(`worker/model_runner_v1.py`, `NPUModelRunner.execute_model` and `_dummy_run`): two
index_selects of that cache, two repeats and two copies into the module's `_cos`/`_sin`
buffers, device launches outside any graph. Only readers of `get_cos_and_sin_slice()` use
those buffers (its 310P rotary, a MiniMax patch); our model rotates q and k from its own
tables (`model_executor/layers/npu_step.py`) and calls no vllm-ascend rotary forward. Clearing
the recorded cache makes `update_cos_sin` return at its first check (`_cos_sin_cache is None`).

When it applies: once our cache-free pooling model is built on the NPU path under vllm-ascend
(`models/qwen3.py`, through `patches.apply`); generation keeps vLLM's Qwen3 and this state
untouched. The target is verified first (the module, `update_cos_sin` with the source pinned
in the patch table, `_cos_sin_cache`); otherwise nothing changes and the reason is returned.
`VLLM_NPU_EXT_COS_SIN_PATCH=0` turns it off.
"""

from __future__ import annotations

import importlib.util
import sys

from vllm_npu_ext import envs, patches

NAME = "vllm_ascend_cos_sin"  # its row in the patch table
TARGET_MODULE = "vllm_ascend.ops.rotary_embedding"


def stop_cos_sin_updates() -> str:
    """Make vllm-ascend's per-step `update_cos_sin` a no-op in this process, through the patch
    table (its switch, then `stop`); returns what was done, for the model's build log."""
    done = patches.apply(NAME)
    off = f"vllm-ascend's per-step cos/sin update left on ({envs.COS_SIN_PATCH}=0)"
    return "; ".join(done) or off


def stop() -> str:
    """The patch itself (see the module docstring)."""
    module = sys.modules.get(TARGET_MODULE)
    if module is None and importlib.util.find_spec("vllm_ascend") is None:
        return "no vllm-ascend: no per-step cos/sin update to stop"
    if module is None:  # vllm-ascend present, its rotary op never built: nothing recorded
        return "vllm-ascend's rotary op not built: no per-step cos/sin update to stop"
    if not (callable(getattr(module, "update_cos_sin", None))
            and hasattr(module, "_cos_sin_cache")):  # fmt: skip
        return f"{TARGET_MODULE} has no update_cos_sin/_cos_sin_cache: left as is"
    if patches.refusals(NAME, lambda target: module.update_cos_sin):
        return f"{TARGET_MODULE}.update_cos_sin is not the source this patch was verified on"
    module._cos_sin_cache = None
    return "vllm-ascend's per-step cos/sin update stopped (our model does not read it)"
