"""NpuExtAttentionUpdate: the renamed, tensor-input AttentionUpdate CANN operator package.

Layout (as CANN's own operator packages): `op_host/` (definition, infershape, tiling),
`op_kernel/` (AscendC kernel and the AscendC-free tiling header), `op_api/` (aclnn API),
`torch_binding/` (PrivateUse1 kernel and torchair converter), `host_kernel/` (the kernel
source built and run on the host with g++), `tests/` (golden reference and tiling sweep).
See README.md for the build.
"""

from __future__ import annotations

from pathlib import Path

OP_DIR = Path(__file__).resolve().parent
TILING_MATH_HEADER = OP_DIR / "op_kernel" / "attention_update_tiling_math.h"
