"""ctypes access to the CPU twin of the NpuExtAttentionUpdate kernel (tests/host/).

The twin runs the kernel's tiling, tile walk, strided offsets, UB layout and fp32 arithmetic
on the host. `AttentionUpdateTwin.run` takes torch CPU tensors, makes each input contiguous
once as a whole (what the aclnn layer does on the NPU) and returns the kernel's outputs.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

# AttentionUpdateTiling in op_kernel/attention_update_tiling_math.h, in order.
TILING_FIELDS = (
    "sp",
    "totalLength",
    "hDim",
    "goElemBytes",
    "updateType",
    "usedCoreNum",
    "formerNum",
    "formerLength",
    "tailLength",
    "tileLength",
)
# go dtype codes of npu_ext_au_twin_run.
GO_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# An Ascend 910B vector core's unified buffer and a typical vector core count.
UB_BYTES_910B = 192 * 1024
CORE_NUM_910B = 40


class AttentionUpdateTiling(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint32) for name in TILING_FIELDS]


class AttentionUpdateTwin:
    """The twin library at `library_path` (built by host_build.build_twin)."""

    def __init__(self, library_path: Path) -> None:
        self._lib = ctypes.CDLL(str(library_path))
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        self._lib.npu_ext_au_twin_tiling.argtypes = [
            u64, u64, u64, u32, u32, u32, u64, ctypes.POINTER(AttentionUpdateTiling)
        ]
        self._lib.npu_ext_au_twin_run.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
            u32, u32, u32, ctypes.c_int32, u32, u32, u64,
        ]
        self._lib.npu_ext_au_twin_last_error.restype = ctypes.c_char_p

    def tiling(
        self, sp: int, rows: int, head_dim: int, go_elem_bytes: int, update_type: int,
        core_num: int = CORE_NUM_910B, ub_bytes: int = UB_BYTES_910B,
    ) -> tuple[int, AttentionUpdateTiling]:
        """(TilingStatus value, tiling) for lse [sp, rows], go [sp, rows, head_dim]."""
        tiling = AttentionUpdateTiling()
        status = self._lib.npu_ext_au_twin_tiling(
            sp, rows, head_dim, go_elem_bytes, update_type, core_num, ub_bytes,
            ctypes.byref(tiling),
        )
        return status, tiling

    def run(
        self, lse: torch.Tensor, go: torch.Tensor, update_type: int,
        core_num: int = CORE_NUM_910B, ub_bytes: int = UB_BYTES_910B,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Kernel outputs for lse fp32 `[sp, N]`, go `[sp, N, D]` (CPU tensors).

        Returns (out `[N, D]` in go's dtype, lse_out fp32 `[N]`). Elements the kernel does not
        write stay NaN: all of lse_out when update_type == 0.
        """
        lse, go = lse.contiguous(), go.contiguous()
        sp, rows, head_dim = go.shape
        out = torch.full((rows, head_dim), float("nan"), dtype=go.dtype)
        lse_out = torch.full((rows,), float("nan"), dtype=torch.float32)
        status = self._lib.npu_ext_au_twin_run(
            lse.data_ptr(), go.data_ptr(), out.data_ptr(), lse_out.data_ptr(),
            sp, rows, head_dim, GO_DTYPE_CODES[go.dtype], update_type, core_num, ub_bytes,
        )
        if status != 0:
            message = self._lib.npu_ext_au_twin_last_error().decode()
            raise RuntimeError(f"twin failed with status {status}: {message}")
        return out, lse_out
