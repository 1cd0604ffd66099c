"""The torch_npu emulator: run the NPU code path on any CPU.

A strict stand-in for the torch_npu operators the project calls, installed as
`sys.modules["torch_npu"]`. Tests, `vllm-npu-ext selfcheck --emulate` and, with
`VLLM_NPU_EXT_EMULATE=1`, `register()` in every vLLM process (a whole server) run the NPU
path with it; nothing else in the package imports it. `vllm_npu_ext.ops.dispatch` is the one
place that recognises it.

Three rooms, by what each part stands in for; arrows run one way (operators and device use
the runtime; the device knows no operator; this module and `surface` assemble them):
- `runtime/`: what binds an operator call to its contract. Each emulated operator is a torch
  operator `torch.ops.npu.<name>` defined from the schema string of the torch-npu wheel
  (`runtime/torch_npu_schemas.json`, `runtime/schema.py`), as torch_npu defines its own, with
  a fake kernel giving the wheel's meta shapes (`runtime/fake.py`), so `torch.compile` traces
  each call as one opaque operator (`runtime/registry.py`, which also counts calls). In eager
  mode each call is first bound by the emulator's stricter binder, then torch binds it.
  `runtime/checks.py` holds the contract checks several operators share; `runtime/strict.py`
  the strict modules whose unimplemented names raise AttributeError naming them, never a mock.
- `operators/`: the operators. torch_npu's (attention, matmul, norm, pointwise, quant,
  format_cast, attention_update), ATB's (`atb`), vllm-ascend's compiled library
  (`vllm_ascend_library`) and Triton kernels (`vllm_ascend_triton`), vLLM's Triton kernels
  where vLLM has no Triton backend (`vllm_triton`), and our own CANN operator
  (`npu_ext_cann`). Each CPU kernel checks the documented contract (layouts, cumulative
  host-side sequence lengths, head counts, masks, dtypes, shapes), computes in float32
  PyTorch and returns the input dtype. Calls the real operator would reject or silently
  mis-handle raise ValueError/TypeError; documented features not implemented raise
  NotImplementedError.
- `device/`: the device. `host_npu` (the `npu` device: host memory behind torch's
  PrivateUse1 backend), `npu` (`torch.npu` over it: devices, streams, events, memory),
  `graphs` (NPU graph capture and replay), `collectives` (the `hccl` backend, gloo for host
  and npu tensors), `npugraph_ex` (npugraph_ex's and torchair's pattern registration).

    with torch_npu_emulator.emulated():      # sys.modules["torch_npu"] is the emulator
        ...                                  # vllm_npu_ext.ops.dispatch now takes NPU paths
    torch_npu_emulator.calls["npu_rms_norm"] # kernel calls per operator (compiled graphs too)

`install_stand_in()` adds the rest of the torch_npu surface vllm-ascend 0.23 imports and reads
(`surface`: the device, `torch_npu._C`, CANN's `acl` names, the operators registered outside
`torch.ops.npu`), for the life of the process: what `VLLM_NPU_EXT_EMULATE=1` processes and
`tests/with_vllm_ascend` use.

Operator tensors live on the CPU, which stands in for the NPU, or on the stand-in's `npu`
device (one device per call). While installed, the emulated platform also keeps each linear
layer's weight as the NPU platform does (`platform`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from types import ModuleType

from . import platform
from .operators.atb import ATB_MODULE as atb  # `torch_npu.atb` (torch_npu's own module)
from .operators.atb import _npu_matmul_add_fp32, _npu_reshape_and_cache, _npu_rotary_embedding
from .operators.attention import (
    _npu_fused_infer_attention_score_get_max_workspace,
    npu_fused_infer_attention_score,
    npu_fusion_attention,
)
from .operators.attention_update import npu_attention_update
from .operators.format_cast import npu_format_cast
from .operators.matmul import npu_grouped_matmul, npu_linear
from .operators.norm import npu_add_rms_norm, npu_rms_norm
from .operators.pointwise import npu_rotary_mul, npu_swiglu
from .operators.quant import (
    npu_add_rms_norm_dynamic_quant,
    npu_add_rms_norm_quant,
    npu_dynamic_quant,
    npu_quantize,
)
from .operators.rope_cache import npu_mrope
from .runtime.registry import OPERATORS, calls, corrupted, inside_operator, reset_counts
from .runtime.schema import schema_document

__vllm_npu_ext_emulator__ = True
# The torch-npu wheel whose operator schemas and documentation the stand-in follows
# (vllm-ascend 0.23.0.post1's compiler hashes `torch_npu.__version__` into its compile cache key,
# `AscendCompiler.compute_hash`).
__version__ = "2.10.0.post4"

__all__ = [
    "OPERATORS", "_npu_fused_infer_attention_score_get_max_workspace", "_npu_matmul_add_fp32",
    "_npu_reshape_and_cache", "_npu_rotary_embedding", "atb", "calls", "corrupted", "emulated",
    "inside_operator", "install", "install_stand_in", "reset_counts", "schema_document",
    "uninstall", "npu_add_rms_norm", "npu_attention_update", "npu_format_cast",
    "npu_fused_infer_attention_score", "npu_fusion_attention", "npu_add_rms_norm_dynamic_quant",
    "npu_add_rms_norm_quant", "npu_dynamic_quant", "npu_grouped_matmul", "npu_linear", "npu_mrope",
    "npu_quantize", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu",
]

_MISSING = object()
_previous: list[object] = []


def install() -> ModuleType:
    """Make this module `sys.modules["torch_npu"]` (remembering what was there); return it."""
    module = sys.modules[__name__]
    platform.install()
    _previous.append(sys.modules.get("torch_npu", _MISSING))
    sys.modules["torch_npu"] = module
    return module


def uninstall() -> None:
    """Restore the `sys.modules["torch_npu"]` entry the matching install() replaced."""
    if not _previous:
        raise RuntimeError("torch_npu_emulator.uninstall() without a matching install()")
    previous = _previous.pop()
    if previous is _MISSING:
        sys.modules.pop("torch_npu", None)
    else:
        sys.modules["torch_npu"] = previous


def install_stand_in() -> ModuleType:
    """install() plus the torch_npu surface vllm-ascend needs (`surface`: `torch.npu`,
    `torch_npu._C`, the `hccl` backend as gloo), for the rest of the process."""
    from . import surface, torch_fit

    module = sys.modules[__name__]
    if sys.modules.get("torch_npu") is not module:
        install()
    surface.install(module)
    torch_fit.fit()  # vllm-ascend 0.23's graph mode on this torch (its docstring)
    return module


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise AttributeError(
        f"torch_npu.{name} is not implemented by the torch_npu stand-in ({__name__}); "
        "add it there, with the real contract, if the code under test needs it"
    )


@contextlib.contextmanager
def emulated() -> Iterator[ModuleType]:
    """install() for the duration of a `with` block, then uninstall()."""
    module = install()
    try:
        yield module
    finally:
        uninstall()
