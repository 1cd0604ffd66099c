"""Every environment variable the package reads, in one place.

Values are read when asked for (not cached at import), so a process that changes its
environment before building a model sees the change. `describe()` returns the state of
every switch for `vllm-npu-ext doctor`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

# Fusion name -> (fused NPU operator, unfused equivalent), in docs/environment.md's table order.
FUSIONS: dict[str, tuple[str, str]] = {
    "attention": (
        "npu_fused_infer_attention_score or npu_fusion_attention (TND, sparse_mode=3, GQA)",
        "per-sequence matmul + softmax, K/V repeated per query group",
    ),
    "rms_norm": ("npu_rms_norm (also the per-head q/k norms)", "float32 pow/mean/rsqrt/mul"),
    "add_rms_norm": ("npu_add_rms_norm (residual add + RMSNorm)", "add, then the unfused RMSNorm"),
    "rotary": (
        "npu_mrope for q and k in one launch from vLLM's cos_sin_cache (npu_rotary_mul per "
        "tensor where npu_mrope does not take the head size)",
        "rotate_half in PyTorch",
    ),
    "qk_norm_rope": (
        "vllm-ascend's vllm.qkv_rmsnorm_rope on the merged q/k/v projection (split, q/k "
        "RMSNorm and RoPE in one launch; bfloat16, head_dim 128, where vllm-ascend registers it)",
        "the q/k norms and rotary as their own switches say",
    ),
    "swiglu": ("npu_swiglu on the merged gate/up projection", "silu(gate) * up"),
    "grouped_qkv": (
        "npu_grouped_matmul with pre-transposed [K, N] q/k/v weights",
        "one merged q/k/v matmul, split into views",
    ),
    "linear": ("npu_linear for o/gate_up/down (and merged qkv)", "torch.nn.functional.linear"),
}

MASTER_SWITCH = "VLLM_NPU_EXT_FUSED"
COMPILE_SWITCH = "VLLM_NPU_EXT_COMPILE"
KV_CACHE_FREE_SWITCH = "VLLM_NPU_EXT_KV_CACHE_FREE"
FULL_GRAPH_SWITCH = "VLLM_NPU_EXT_FULL_GRAPH"
ATTENTION_OP = "VLLM_NPU_EXT_ATTENTION_OP"
ATTENTION_OPS = ("fused_infer_attention_score", "fusion_attention")

# name -> (default, meaning); documented in docs/environment.md's variable table.
VARIABLES: dict[str, tuple[str, str]] = {
    "VLLM_NPU_EXT_MODEL_OVERRIDE": (
        "1",
        "0: vLLM's own Qwen3 classes for every run (1: ours for pooling runs)",
    ),
    "VLLM_NPU_EXT_GENERATION": (
        "0",
        "1: our Qwen3 class for generation too (default: generation runs vLLM's own)",
    ),
    "VLLM_NPU_EXT_EMULATE": (
        "0",
        "1: every vLLM process installs the torch_npu stand-in (emulated operators, "
        "torch.npu on the host, hccl as gloo) before the platform resolves, so the NPU path, "
        "and vllm-ascend's own code where installed, run on the CPU (a functional check; "
        "nothing is measured)",
    ),
    KV_CACHE_FREE_SWITCH: (
        "1",
        "1: pooling runs allocate and write no KV cache (prefix caching and chunked prefill "
        "are then off); 0: keep vLLM's KV cache for pooling",
    ),
    FULL_GRAPH_SWITCH: (
        "1",
        "0: cache-free pooling on the NPU path splits its graphs at attention (piecewise); 1: "
        "one graph per forward with attention inside, its sequence lengths updated per replay, "
        "where FIA takes the model (bfloat16, head_dim 128 or 192)",
    ),
    COMPILE_SWITCH: (
        "1",
        "0: vLLM does not compile our Qwen3 (eager forward, no graphs; --enforce-eager does the "
        "same for every model)",
    ),
    "VLLM_NPU_EXT_CPU_FLOAT32_MATMUL": (
        "auto",
        "CPU platform path, bf16/fp16 models: keep the projection weights in float32 and "
        "multiply in float32 (auto: on x86 CPUs without native bf16/fp16 matmul, where it is "
        "about ten times faster; 1: always on the CPU; 0: never)",
    ),
    MASTER_SWITCH: ("1", "0: every NPU fusion off (reference PyTorch ops on the NPU)"),
    **{
        f"VLLM_NPU_EXT_FUSE_{name.upper()}": ("1", f"0: {unfused} instead of {fused}")
        for name, (fused, unfused) in FUSIONS.items()
    },
    ATTENTION_OP: (
        "fused_infer_attention_score",
        "fused attention operator: fused_infer_attention_score or fusion_attention (the other "
        "one where the chosen one does not take the model's dtype or head_dim)",
    ),
    "VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL": (
        "auto",
        "context-parallel merge kernel on NPU: auto (our custom op when loaded, else "
        "torch_npu.npu_attention_update), custom, or list",
    ),
    "VLLM_NPU_EXT_ATTENTION_UPDATE_CONTIGUOUS": (
        "0",
        "1: copy the CP merge's strided lse/out views into contiguous tensors before "
        "torch_npu.npu_attention_update (the list kernel); 0: pass the views, as vllm-ascend does",
    ),
    "VLLM_NPU_EXT_CP_PATCH": ("1", "0: leave vllm-ascend's context-parallel decode merge as is"),
    "VLLM_NPU_EXT_COS_SIN_PATCH": (
        "1",
        "0: leave vllm-ascend's per-step cos/sin table update on for our pooling model (it "
        "does not read them)",
    ),
    "VLLM_NPU_EXT_BOOTSTRAP": ("1", "0: do not reorder ASCEND_CUSTOM_OPP_PATH/LD_LIBRARY_PATH"),
    "VLLM_NPU_EXT_OPP_PATH": (
        "",
        "vendor directory of our custom op package (default: the cann_ops build's install)",
    ),
    "VLLM_NPU_EXT_HOST_KERNEL_CACHE": (
        "",
        "directory of the host (g++) builds of our AscendC kernel that the emulator runs "
        "(default: $XDG_CACHE_HOME/vllm_npu_ext/host-kernel, else ~/.cache/...)",
    ),
    "VLLM_NPU_EXT_TEI_MAX_CLIENT_BATCH_SIZE": (
        "32",
        "most inputs one request to the TEI routes (/embed, /rerank, ...) may carry; larger "
        "batches get TEI's 413 (TEI's --max-client-batch-size, same default)",
    ),
    "VLLM_NPU_EXT_SELFCHECK_EMULATE": (
        "0",
        "1: `vllm-npu-ext selfcheck` runs on the CPU under the torch_npu emulator (tests "
        "selfcheck itself; every line says emulated)",
    ),
}


def get(name: str) -> str:
    """The variable's value, or its documented default."""
    if name not in VARIABLES:
        raise ValueError(f"unknown vllm-npu-ext environment variable: {name!r}")
    return os.environ.get(name, VARIABLES[name][0])


def cache_dir() -> Path:
    """The package's cache directory: $XDG_CACHE_HOME/vllm_npu_ext, else ~/.cache/vllm_npu_ext
    (built-in models, generated templates, host kernel builds)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm_npu_ext"


def flag(name: str) -> bool:
    """A 0/1 switch; anything but 0/false/no/off counts as on."""
    return get(name).strip().lower() not in ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class FusionConfig:
    """Which NPU fusions are on. Built once per model from the environment."""

    attention: bool = True
    rms_norm: bool = True
    add_rms_norm: bool = True
    rotary: bool = True
    qk_norm_rope: bool = True
    swiglu: bool = True
    grouped_qkv: bool = True
    linear: bool = True
    attention_op: str = "fused_infer_attention_score"

    @classmethod
    def from_env(cls) -> FusionConfig:
        master = flag(MASTER_SWITCH)
        switches = {name: master and flag(f"VLLM_NPU_EXT_FUSE_{name.upper()}") for name in FUSIONS}
        attention_op = get(ATTENTION_OP).strip()
        if attention_op not in ATTENTION_OPS:
            raise ValueError(f"{ATTENTION_OP} must be one of {ATTENTION_OPS}, got {attention_op!r}")
        return cls(**switches, attention_op=attention_op)

    @classmethod
    def all_off(cls) -> FusionConfig:
        return cls(**{name: False for name in FUSIONS})

    def without(self, fusion: str) -> FusionConfig:
        """This configuration with one fusion switched off."""
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {tuple(FUSIONS)}, got {fusion!r}")
        return dataclasses.replace(self, **{fusion: False})

    def active(self) -> list[str]:
        return [name for name in FUSIONS if getattr(self, name)]


def describe() -> dict[str, dict[str, str]]:
    """Every variable with its effective value and whether it is set explicitly."""
    return {
        name: {"value": get(name), "default": default, "set": str(name in os.environ).lower()}
        for name, (default, _) in VARIABLES.items()
    }
