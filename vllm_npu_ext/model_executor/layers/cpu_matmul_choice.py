"""Whether a bf16/fp16 model's projections multiply in float32 on the CPU platform path.

`cpu_matmul` (the linear method) holds why; this module only decides, and imports no vLLM, so
`vllm-npu-ext doctor` reports the decision without loading vLLM.
"""

from __future__ import annotations

import platform

import torch

from vllm_npu_ext import envs

SWITCH = envs.CPU_FLOAT32_MATMUL.name
CHOICES = envs.CPU_FLOAT32_MATMUL.choices
HALF_DTYPES = (torch.bfloat16, torch.float16)


def native_half_matmul(dtype: torch.dtype) -> bool:
    """Whether this x86 CPU multiplies `dtype` natively (AVX512-BF16 or AMX for bf16, AMX-FP16
    for fp16), as PyTorch's CPU capability checks report it."""
    if dtype == torch.bfloat16:
        return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return torch.cpu._is_amx_fp16_supported()


def choose(dtype: torch.dtype, cpu_platform_path: bool) -> tuple[bool, str]:
    """(on, why) for a model of `dtype` whose projections run the platform path on the CPU
    (`cpu_platform_path`) or not. ValueError for a value of the switch it does not know."""
    value = envs.CPU_FLOAT32_MATMUL()
    if not cpu_platform_path:
        return False, "not the CPU platform path"
    if dtype not in HALF_DTYPES:
        return False, f"{dtype} multiplies as it is"
    if value == "0":
        return False, f"{SWITCH}=0"
    if value == "1":
        return True, f"{SWITCH}=1"
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, f"auto: {machine} CPU (only x86 is checked for native {dtype} matmul)"
    if native_half_matmul(dtype):
        return False, f"auto: this CPU multiplies {dtype} natively"
    units = "AVX512-BF16/AMX" if dtype == torch.bfloat16 else "AMX-FP16"
    return True, f"auto: this x86 CPU has no native {dtype} matmul ({units})"
