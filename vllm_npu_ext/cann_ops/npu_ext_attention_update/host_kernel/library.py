"""The host build of the NpuExtAttentionUpdate kernel (host_kernel/build.py), through ctypes.

`HostKernel.launch(lse, go, update_type)` does on the CPU what aclnnNpuExtAttentionUpdate
does on the NPU: one contiguous copy of each input (op_api's Contiguous), op_host's tiling
for the platform's vector cores and UB, then the AscendC kernel once per core, and returns
the outputs with a `LaunchInfo` (tiling, block dim, UB used, tail tiles). A kernel that
breaks an AscendC rule the shim checks raises `KernelRuleViolation` naming the rule.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel import build

# AttentionUpdateTiling (op_kernel/attention_update_tiling_math.h) and the TilingData of
# op_host/npu_ext_attention_update_tiling.h, in order.
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
# go dtype codes of launch.cpp.
GO_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
# An Atlas A2 (Ascend 910B) vector core's unified buffer, and a 910B vector core count.
UB_BYTES_910B = 192 * 1024
CORE_NUM_910B = 40
# launch.cpp's Status values.
OK, TILING_FAILED, BAD_ARGUMENT, VIOLATION = 0, 1, 2, 3
MAX_TILING_WORDS = 16


class LaunchInfo(ctypes.Structure):
    """NpuExtAuLaunchInfo of launch.cpp: what op_host's tiling chose and what the launch did."""

    _fields_ = [
        ("tiling_key", ctypes.c_uint64),
        ("workspace_bytes", ctypes.c_uint64),
        ("block_dim", ctypes.c_uint32),
        ("tiling_words", ctypes.c_uint32),
        ("tiling_data", ctypes.c_uint32 * MAX_TILING_WORDS),
        ("ub_peak_bytes", ctypes.c_uint32),
        ("out_copies", ctypes.c_uint32),
        ("short_out_copies", ctypes.c_uint32),
    ]

    @property
    def tiling(self) -> dict[str, int]:
        """The tiling data by field name."""
        if self.tiling_words != len(TILING_FIELDS):
            raise RuntimeError(f"tiling data has {self.tiling_words} words, expected "
                               f"{len(TILING_FIELDS)} ({TILING_FIELDS})")  # fmt: skip
        return dict(zip(TILING_FIELDS, self.tiling_data, strict=False))


class KernelRuleViolation(RuntimeError):
    """The kernel broke an AscendC rule the host shim enforces (UB bounds, alignment, ...)."""


class HostKernel:
    """The library at `library_path` (from build.build_library)."""

    def __init__(self, library_path: Path) -> None:
        self.path = Path(library_path)
        lib = ctypes.CDLL(str(library_path))
        u32, u64, i32, i64 = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64
        info = ctypes.POINTER(LaunchInfo)
        lib.npu_ext_au_host_tiling.argtypes = [u64, u64, u64, i32, i64, u32, u64, info]
        lib.npu_ext_au_host_launch.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
            u64, u64, u64, i32, i64, u32, u64, info,
        ]  # fmt: skip
        lib.npu_ext_au_host_ub_bytes_of_tile.argtypes = [u32, u32, u32, u32]
        lib.npu_ext_au_host_ub_bytes_of_tile.restype = u64
        lib.npu_ext_au_host_last_error.restype = ctypes.c_char_p
        self._lib = lib

    def tiling(
        self, sp: int, rows: int, head_dim: int, dtype: torch.dtype, update_type: int,
        core_num: int = CORE_NUM_910B, ub_bytes: int = UB_BYTES_910B,
    ) -> LaunchInfo | None:
        """op_host's tiling for lse [sp, rows], go [sp, rows, head_dim]; None if it refuses."""
        info = LaunchInfo()
        status = self._lib.npu_ext_au_host_tiling(
            sp, rows, head_dim, GO_DTYPE_CODES[dtype], update_type, core_num, ub_bytes,
            ctypes.byref(info),
        )  # fmt: skip
        if status not in (OK, TILING_FAILED):
            raise RuntimeError(self._error(status))
        return info if status == OK else None

    def ub_bytes_of_tile(self, sp: int, head_dim: int, elem_bytes: int, tile_length: int) -> int:
        """UB bytes the kernel's buffers take for tiles of `tile_length` rows."""
        return self._lib.npu_ext_au_host_ub_bytes_of_tile(sp, head_dim, elem_bytes, tile_length)

    def launch(
        self, lse: torch.Tensor, go: torch.Tensor, update_type: int,
        core_num: int = CORE_NUM_910B, ub_bytes: int = UB_BYTES_910B,
    ) -> tuple[torch.Tensor, torch.Tensor, LaunchInfo]:
        """Run the kernel on lse fp32 `[sp, N]`, go `[sp, N, D]` (CPU tensors, any strides).

        Returns (out `[N, D]` in go's dtype, lse_out fp32 `[N]`, LaunchInfo). lse_out is NaN
        where the kernel does not write it (update_type 0). N == 0 launches nothing, as
        aclnn does. Raises KernelRuleViolation, or RuntimeError when op_host's tiling refuses.
        """
        sp, rows, head_dim = go.shape
        out = torch.empty((rows, head_dim), dtype=go.dtype)
        lse_out = torch.full((rows,), float("nan"), dtype=torch.float32)
        info = LaunchInfo()
        if rows == 0:
            return out, lse_out, info
        lse, go = lse.contiguous(), go.contiguous()
        status = self._lib.npu_ext_au_host_launch(
            lse.data_ptr(), go.data_ptr(), out.data_ptr(), lse_out.data_ptr(), sp, rows,
            head_dim, GO_DTYPE_CODES[go.dtype], update_type, core_num, ub_bytes,
            ctypes.byref(info),
        )  # fmt: skip
        if status == VIOLATION:
            raise KernelRuleViolation(self._error(status))
        if status != OK:
            raise RuntimeError(self._error(status))
        return out, lse_out, info

    def _error(self, status: int) -> str:
        message = self._lib.npu_ext_au_host_last_error().decode()
        return f"NpuExtAttentionUpdate host kernel ({self.path.name}), status {status}: {message}"


@functools.cache
def default_kernel() -> HostKernel:
    """The kernel built from this package's op_kernel/ (built on first use, then cached).

    Raises build.CompilerMissing when no C++ compiler is available: there is no fallback.
    """
    return HostKernel(build.build_library())
