"""Emulated `npu_format_cast`: an NPU tensor's storage format, on a host with one layout.

`torch_npu.npu_format_cast(self, acl_format) -> Tensor` "修改NPU张量的格式" (changes the format of
an NPU tensor; torch-npu 2.10.0.post4 `_op_plugin_docs.py`, the `npu_format_cast` docstring): a new
tensor with the input's logical shape, dtype and values, stored in another layout. The formats are
`torch_npu.npu.Format` (the wheel's `torch_npu/npu/_format.py`); FRACTAL_NZ (29) is the blocked
matrix layout vllm-ascend 0.23.0.post1 gives linear weights after loading
(`AscendUnquantizedLinearMethod.process_weights_after_loading`, through
`vllm_ascend.utils.maybe_trans_nz` and `_should_trans_nz`: never float32; bfloat16/float16 when
`weight_nz_mode` is 2; other dtypes unless it is 0; everything on 310P).

Operators read a tensor through its logical shape whatever its storage format (npu_linear takes
input and weight in "[ND, NHWC, FRACTAL_NZ]", the `npu_linear` docstring of `_op_plugin_docs.py`),
and the host keeps every tensor in ND (`torch.npu.config`, `device/npu.py`), so the emulated cast
returns a contiguous copy with the input's shape, dtype and values. ND (2) and FRACTAL_NZ (29) are
emulated; the other documented formats (convolution layouts such as NC1HWC0, with shape rules of
their own) raise NotImplementedError, values outside `Format` ValueError. `customize_dtype` and
`input_dtype` (quantised storage) and the `.Tensor` overload (the format of another tensor, which
the host does not record) are not emulated.
"""

from __future__ import annotations

import torch

from ..runtime.checks import require_choice
from ..runtime.registry import emulated_operator
from ..runtime.schema import BoundCall

FORMAT_CAST = "npu_format_cast"
ACL_FORMAT_ND = 2
ACL_FORMAT_FRACTAL_NZ = 29
EMULATED_FORMATS = (ACL_FORMAT_ND, ACL_FORMAT_FRACTAL_NZ)
# torch_npu.npu.Format (torch-npu 2.10.0.post4 `torch_npu/npu/_format.py`), UNDEFINED excluded.
DOCUMENTED_FORMATS = {
    "NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "NC1HWC0_C04": 12, "HWCN": 16,
    "NDHWC": 27, "FRACTAL_NZ": 29, "NCDHW": 30, "NDC1HWC0": 32, "FRACTAL_Z_3D": 33, "NC": 35,
    "NCL": 47, "FRACTAL_NZ_C0_16": 50, "FRACTAL_NZ_C0_32": 51, "FRACTAL_NZ_C0_2": 52,
    "FRACTAL_NZ_C0_4": 53, "FRACTAL_NZ_C0_8": 54,
}  # fmt: skip


@emulated_operator(FORMAT_CAST)
def npu_format_cast(call: BoundCall) -> torch.Tensor:
    """A contiguous copy of `self` (same shape, dtype, values) in format ND or FRACTAL_NZ."""
    call.require_defaults({"input", "acl_format"})
    acl_format = call.acl_format
    require_choice(FORMAT_CAST, "acl_format", acl_format, list(DOCUMENTED_FORMATS.values()))
    if acl_format not in EMULATED_FORMATS:
        name = next(k for k, v in DOCUMENTED_FORMATS.items() if v == acl_format)
        raise NotImplementedError(
            f"{FORMAT_CAST}: acl_format {acl_format} ({name}) is not emulated; emulated: "
            f"{ACL_FORMAT_ND} (ND), {ACL_FORMAT_FRACTAL_NZ} (FRACTAL_NZ)"
        )
    return call.input.clone(memory_format=torch.contiguous_format)
