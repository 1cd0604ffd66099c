"""A stand-in for vllm-ascend's compiled operator library, `vllm_ascend.vllm_ascend_C`.

On an Ascend host vllm-ascend ships `vllm_ascend_C`, a C++ extension whose import defines the
`_C_ascend` operators (`csrc/torch_binding.cpp`) with their Meta kernels
(`csrc/torch_binding_meta.cpp`). `vllm_ascend.utils.enable_custom_op()` imports it and, when
the import works, its layers call those operators: `AscendRMSNorm` adds the residual with
`torch.ops._C_ascend.npu_add_rms_norm_bias` (vllm-ascend 0.23.0.post1 `AscendRMSNorm.forward_oot`)
instead of torch_npu's `npu_add_rms_norm`. A CPU host has no such library, and the failed import is
not only a different path: `AscendRMSNorm.forward_oot` makes the first `enable_custom_op()` call
inside the forward that graph mode traces, and dynamo stops at the failing import ("Import failure",
the `import vllm_ascend.vllm_ascend_C` in `vllm_ascend.utils.enable_custom_op`), so stock
vllm-ascend's graph mode needs the library to start at all.

This module is found as `vllm_ascend.vllm_ascend_C` only where no such file exists (its finder
comes after Python's own, so a real or a test's stub library on disk wins) and only once the
stand-in is installed. Importing it defines, verbatim from vllm-ascend 0.23.0.post1's
`csrc/torch_binding.cpp`:

- `npu_add_rms_norm_bias` (its `ops.def` schema), emulated: x = x1 + x2, y = rms_norm(x) * gamma +
  beta, rstd = 1 / sqrt(mean(x^2) + epsilon) over gamma's dimensions; x1, x2, gamma and beta one
  dtype of float16, float32 and bfloat16
  (`csrc/moe/add_rms_norm_bias/op_host/add_rms_norm_bias_def.cpp`: one dtype column per row). The
  rounding follows the kernel (`op_kernel/add_rms_norm_bias_single_n.h`,
  `KernelAddRmsNormBiasSingleN`): the sum is rounded to the input dtype before the norm and returned
  as x (`ProcessBf16`, the `CAST_RINT` of the sum); in bfloat16 the normalised x * rstd is rounded
  to bfloat16 before the float32 product with gamma and sum with beta (`ProcessBf16`); in float16
  the product with gamma and the sum with beta are float16 operations (`ProcessFp16`). Meta kernel:
  `csrc/torch_binding_meta.cpp` `npu_add_rms_norm_bias_meta` (rstd float32 of x1's leading
  dimensions then 1s).
- `get_masked_input_and_mask`, `bgmv_expand` and `sgmv_expand` (their `ops.def` schemas in the same
  file): defined, not emulated (a call raises NotImplementedError naming the operator).
  vllm-ascend's `meta_registration.py`, imported by `enable_custom_op()` after this library,
  registers Meta kernels for exactly these three, which torch refuses for an operator that
  does not exist.

Any other `_C_ascend` operator is absent: `torch.ops._C_ascend.<name>` raises AttributeError
naming it. Calls are counted in `runtime.registry.calls` under `_C_ascend.<name>`.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import types

import torch

from ..runtime.registry import calls

NAMESPACE = "_C_ascend"
MODULE = "vllm_ascend.vllm_ascend_C"
ADD_RMS_NORM_BIAS = "npu_add_rms_norm_bias"
SCHEMAS = {
    ADD_RMS_NORM_BIAS: "npu_add_rms_norm_bias(Tensor x1, Tensor x2, Tensor gamma, "
                       "Tensor? beta=None, float epsilon=1e-6) "
                       "-> (Tensor y ,Tensor rstd, Tensor x)",
    "get_masked_input_and_mask": "get_masked_input_and_mask(Tensor input, "
                                 "int org_vocab_start_index, int org_vocab_end_index, "
                                 "int num_org_vocab_padding, int added_vocab_start_index, "
                                 "int added_vocab_end_index) -> (Tensor masked_input, Tensor mask)",
    "bgmv_expand": "bgmv_expand(Tensor! x, Tensor! weight, Tensor! indices, Tensor! y, "
                   "int slice_offset, int slice_size) -> Tensor",
    "sgmv_expand": "sgmv_expand(Tensor! x, Tensor! weight, Tensor! lora_indices, "
                   "Tensor! seq_len, Tensor! y, int slice_offset, int slice_size) -> Tensor",
}  # fmt: skip
FLOAT_TYPES = (torch.float16, torch.float32, torch.bfloat16)


def _rstd_shape(x1: torch.Tensor, gamma: torch.Tensor) -> list:
    diff = x1.dim() - gamma.dim()
    return [*x1.shape[:diff], *[1] * gamma.dim()] if diff > 0 else [1] * x1.dim()


def _check_add_rms_norm_bias(x1, x2, gamma, beta) -> None:
    name = f"{NAMESPACE}.{ADD_RMS_NORM_BIAS}"
    tensors = {"x1": x1, "x2": x2, "gamma": gamma}
    if beta is not None:
        tensors["beta"] = beta
    if x1.dtype not in FLOAT_TYPES:
        raise TypeError(f"{name}: x1 must be float16, float32 or bfloat16, got {x1.dtype}")
    for arg, tensor in tensors.items():
        if tensor.dtype != x1.dtype:
            raise TypeError(f"{name}: {arg} is {tensor.dtype}, x1 is {x1.dtype}: one dtype for all")
    if x1.shape != x2.shape:
        raise ValueError(f"{name}: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} must have "
                         "one shape")
    trailing = tuple(x1.shape[x1.dim() - gamma.dim():])
    if gamma.dim() == 0 or gamma.dim() > x1.dim() or tuple(gamma.shape) != trailing:
        raise ValueError(f"{name}: gamma {tuple(gamma.shape)} must equal x1's trailing dimensions "
                         f"{tuple(x1.shape)}")  # fmt: skip
    if beta is not None and beta.shape != gamma.shape:
        raise ValueError(f"{name}: beta {tuple(beta.shape)} must have gamma's shape "
                         f"{tuple(gamma.shape)}")
    if len({t.device for t in tensors.values()}) != 1:
        raise ValueError(f"{name}: x1, x2, gamma and beta must be on one device")


def npu_add_rms_norm_bias(x1, x2, gamma, beta=None, epsilon=1e-6):
    """The CPU kernel (npu tensors reach it as host views): (y, rstd, x), see the module text."""
    calls[f"{NAMESPACE}.{ADD_RMS_NORM_BIAS}"] += 1
    _check_add_rms_norm_bias(x1, x2, gamma, beta)
    dtype = x1.dtype
    x = (x1.float() + x2.float()).to(dtype)
    x32 = x.float()
    dims = tuple(range(x1.dim() - gamma.dim(), x1.dim()))
    rstd = 1.0 / torch.sqrt(x32.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    normed = x32 * rstd
    if dtype == torch.float32:
        y = normed * gamma if beta is None else normed * gamma + beta
    elif dtype == torch.bfloat16:
        y = normed.to(dtype).float() * gamma.float()
        y = (y if beta is None else y + beta.float()).to(dtype)
    else:  # float16: the product with gamma and the sum with beta in float16
        y = normed.to(dtype) * gamma
        y = y if beta is None else y + beta
    return y, rstd.reshape(_rstd_shape(x1, gamma)), x


def _npu_add_rms_norm_bias_meta(x1, x2, gamma, beta=None, epsilon=1e-6):
    rstd = x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32)
    return torch.empty_like(x1), rstd, torch.empty_like(x1)


def _not_emulated(op: str):
    def kernel(*args, **kwargs):
        calls[f"{NAMESPACE}.{op}"] += 1
        raise NotImplementedError(f"{NAMESPACE}::{op} (vllm-ascend's operator library) is not "
                                  "emulated by the torch_npu stand-in")  # fmt: skip

    return kernel


@functools.cache
def register() -> torch.library.Library:
    """Define the `_C_ascend` operators above, once per process (what importing the library
    does on an Ascend host)."""
    library = torch.library.Library(NAMESPACE, "DEF")
    for op, schema in SCHEMAS.items():
        library.define(schema)
        if op == ADD_RMS_NORM_BIAS:
            library.impl(op, npu_add_rms_norm_bias, "CPU")
            library.impl(op, _npu_add_rms_norm_bias_meta, "Meta")
        else:
            library.impl(op, _not_emulated(op), "CPU")
    return library


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module) -> None:
        module.__vllm_npu_ext_emulator__ = True
        module.__doc__ = __doc__
        register()


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != MODULE:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(), origin=__name__)


def install() -> None:
    """Answer `import vllm_ascend.vllm_ascend_C` where Python's own finders find no library."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
