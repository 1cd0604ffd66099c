"""Every environment variable the package reads, in one place.

One object per variable (`Variable`, `Flag`, `PositiveInt`): its name, documented default and
meaning, and the values it takes. Calling it reads the environment then (nothing is cached at
import, so a process that changes its environment before building a model sees the change) and
returns the typed value; choices are checked by one helper, `checked_choice`, as vLLM's
`envs.env_with_choices` does. `VARIABLES` lists them all (vLLM learns them: patches/
vllm_environment.py; docs/environment.md documents them) and `describe()` reports them for
`vllm-npu-ext doctor`. This module imports neither torch nor vLLM: the platform plugin reads it
before torch_npu loads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
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

OFF_VALUES = ("0", "false", "no", "off")


def checked_choice(name: str, value: str, choices: Sequence[str]) -> str:
    """`value` if it is one of `choices`, else ValueError naming the variable (the one check
    of every variable with choices, as vLLM's `envs.env_with_choices`)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: its documented default and meaning, and the values it takes
    (`choices`, empty for free text). Calling it reads the environment now, stripped, and
    validates a choice (lower-cased first)."""

    name: str
    default: str
    meaning: str
    choices: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.name

    def raw(self) -> str:
        """The value as set, or the documented default."""
        return os.environ.get(self.name, self.default)

    def __call__(self) -> str:
        value = self.raw().strip()
        if not self.choices:
            return value
        return checked_choice(self.name, value.lower(), self.choices)


class Flag(Variable):
    """A 0/1 switch; anything but 0/false/no/off counts as on."""

    def __call__(self) -> bool:  # type: ignore[override]
        return self.raw().strip().lower() not in OFF_VALUES


class PositiveInt(Variable):
    """A positive integer."""

    def __call__(self) -> int:  # type: ignore[override]
        value = self.raw().strip()
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{self.name} must be a positive integer, got {value!r}")
        return int(value)


class OptionalPositiveInt(PositiveInt):
    """A positive integer, or None where unset or empty (documented default: empty)."""

    def __call__(self) -> int | None:  # type: ignore[override]
        return super().__call__() if self.raw().strip() else None


MODEL_OVERRIDE = Flag(
    "VLLM_NPU_EXT_MODEL_OVERRIDE", "1",
    "0: vLLM's own Qwen3 classes for every run (1: ours for pooling runs)",
)  # fmt: skip
GENERATION = Flag(
    "VLLM_NPU_EXT_GENERATION", "0",
    "1: our Qwen3 class for generation too (default: generation runs vLLM's own)",
)  # fmt: skip
EMULATE = Flag(
    "VLLM_NPU_EXT_EMULATE", "0",
    "1: every vLLM process installs the torch_npu stand-in (emulated operators, torch.npu on "
    "the host, hccl as gloo) before the platform resolves, so the NPU path, and vllm-ascend's "
    "own code where installed, run on the CPU (a functional check; nothing is measured)",
)  # fmt: skip
EMULATE_OPS = Flag(
    "VLLM_NPU_EXT_EMULATE_OPS", "1",
    "with VLLM_NPU_EXT_EMULATE=1: 1: the stand-in also stands in for our built operator "
    "package (`vllm-npu-ext build-ops`): NpuExtAttentionUpdate's AscendC kernel, built for "
    "the host, on the npu device; 0: as where the package is not built (the CP merge takes "
    "torch_npu's TensorList kernel)",
)  # fmt: skip
EMULATE_DEVICE_MIB = OptionalPositiveInt(
    "VLLM_NPU_EXT_EMULATE_DEVICE_MIB", "",
    "with VLLM_NPU_EXT_EMULATE=1: each emulated NPU's memory in MiB (what mem_get_info and "
    "get_device_properties report; empty: the host's MemTotal). The ranks of one host share "
    "its RAM: a multi-rank server at vLLM's default --gpu-memory-utilization needs it below "
    "MemTotal / ranks",
)  # fmt: skip
KV_CACHE_FREE = Flag(
    "VLLM_NPU_EXT_KV_CACHE_FREE", "1",
    "1: pooling runs allocate and write no KV cache (prefix caching and chunked prefill are "
    "then off); 0: keep vLLM's KV cache for pooling",
)  # fmt: skip
FULL_GRAPH = Flag(
    "VLLM_NPU_EXT_FULL_GRAPH", "1",
    "0: cache-free pooling on the NPU path splits its graphs at attention (piecewise); 1: one "
    "graph per forward with attention inside, its sequence lengths updated per replay, where "
    "FIA takes the model (bfloat16, head_dim 128 or 192)",
)  # fmt: skip
SHARED_PREFIX = Flag(
    "VLLM_NPU_EXT_SHARED_PREFIX", "1",
    "cache-free pooling: 1: token prefixes that texts of one step share (an instruction, a "
    "reranker's prompt and query) are computed once per step; 0: every text whole",
)  # fmt: skip
SHARED_PREFIX_MIN_TOKENS = PositiveInt(
    "VLLM_NPU_EXT_SHARED_PREFIX_MIN_TOKENS", "4",
    "with VLLM_NPU_EXT_SHARED_PREFIX=1: the fewest tokens a shared prefix must have to be "
    "computed once (shorter ones are computed per text)",
)  # fmt: skip
COMPILE = Flag(
    "VLLM_NPU_EXT_COMPILE", "1",
    "0: vLLM does not compile our Qwen3 (eager forward, no graphs; --enforce-eager does the "
    "same for every model)",
)  # fmt: skip
CPU_FLOAT32_MATMUL = Variable(
    "VLLM_NPU_EXT_CPU_FLOAT32_MATMUL", "auto",
    "CPU platform path, bf16/fp16 models: keep the projection weights in float32 and multiply "
    "in float32 (auto: on x86 CPUs without native bf16/fp16 matmul, where it is about ten "
    "times faster; 1: always on the CPU; 0: never)",
    choices=("auto", "1", "0"),
)  # fmt: skip
FUSED = Flag(
    "VLLM_NPU_EXT_FUSED", "1", "0: every NPU fusion off (reference PyTorch ops on the NPU)"
)
FUSE: dict[str, Flag] = {
    name: Flag(f"VLLM_NPU_EXT_FUSE_{name.upper()}", "1", f"0: {unfused} instead of {fused}")
    for name, (fused, unfused) in FUSIONS.items()
}
ATTENTION_OP = Variable(
    "VLLM_NPU_EXT_ATTENTION_OP", "fused_infer_attention_score",
    "fused attention operator: fused_infer_attention_score or fusion_attention (the other one "
    "where the chosen one does not take the model's dtype or head_dim)",
)  # fmt: skip  (its choices: ops.attention.OPERATORS, checked by npu_plan.FusionConfig)
ATTENTION_UPDATE_KERNEL = Variable(
    "VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL", "auto",
    "context-parallel merge kernel on NPU: auto (our custom op when loaded, else "
    "torch_npu.npu_attention_update), custom, or list; read once, when the CP patch is installed",
    choices=("auto", "custom", "list"),
)  # fmt: skip
ATTENTION_UPDATE_CONTIGUOUS = Flag(
    "VLLM_NPU_EXT_ATTENTION_UPDATE_CONTIGUOUS", "0",
    "1: copy the CP merge's strided lse/out views into contiguous tensors before "
    "torch_npu.npu_attention_update (the list kernel); 0: pass the views, as vllm-ascend does",
)  # fmt: skip
CP_PATCH = Flag(
    "VLLM_NPU_EXT_CP_PATCH", "1", "0: leave vllm-ascend's context-parallel decode merge as is"
)
COS_SIN_PATCH = Flag(
    "VLLM_NPU_EXT_COS_SIN_PATCH", "1",
    "0: leave vllm-ascend's per-step cos/sin table update on for our pooling model (it does "
    "not read them)",
)  # fmt: skip
PCP_INPUT_IDS_PATCH = Flag(
    "VLLM_NPU_EXT_PCP_INPUT_IDS_PATCH", "1",
    "0: leave vllm-ascend's PCP runner reading async scheduling's -1 placeholders as token ids "
    "for its padding (an out-of-range embedding index at TP 1)",
)  # fmt: skip
ACCEPT_PATCH_SOURCES = Variable(
    "VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES", "",
    "comma-separated sha256 hashes (as the refusal's log line and `vllm-npu-ext doctor` print "
    "them) of vLLM/vllm-ascend function sources a patch was not verified on, to patch them "
    "anyway once you have checked that the patch still fits",
)  # fmt: skip
BOOTSTRAP = Flag(
    "VLLM_NPU_EXT_BOOTSTRAP", "1", "0: do not reorder ASCEND_CUSTOM_OPP_PATH/LD_LIBRARY_PATH"
)
OPP_PATH = Variable(
    "VLLM_NPU_EXT_OPP_PATH", "",
    "vendor directory of our custom op package (default: the cann_ops build's install)",
)  # fmt: skip
HOST_KERNEL_CACHE = Variable(
    "VLLM_NPU_EXT_HOST_KERNEL_CACHE", "",
    "directory of the host (g++) builds of our AscendC kernel that the emulator runs "
    "(default: $XDG_CACHE_HOME/vllm_npu_ext/host-kernel, else ~/.cache/...)",
)  # fmt: skip
TEI_MAX_CLIENT_BATCH_SIZE = PositiveInt(
    "VLLM_NPU_EXT_TEI_MAX_CLIENT_BATCH_SIZE", "32",
    "most inputs one request to the TEI routes (/embed, /rerank, ...) may carry; larger "
    "batches get TEI's 422 (TEI's --max-client-batch-size, same default)",
)  # fmt: skip
TEI_AUTO_TRUNCATE = Flag(
    "VLLM_NPU_EXT_TEI_AUTO_TRUNCATE", "1",
    "0: the TEI routes refuse inputs longer than the model instead of truncating them when a "
    "request sets no `truncate` (TEI's --auto-truncate, same default since TEI 1.9)",
)  # fmt: skip
TEI_PAYLOAD_LIMIT = PositiveInt(
    "VLLM_NPU_EXT_TEI_PAYLOAD_LIMIT", "2000000",
    "largest request body in bytes the TEI routes accept; larger get 413 (TEI's "
    "--payload-limit, same default)",
)  # fmt: skip
TEI_MAX_CONCURRENT_REQUESTS = PositiveInt(
    "VLLM_NPU_EXT_TEI_MAX_CONCURRENT_REQUESTS", "512",
    "inputs the TEI routes compute at once (each input of a batch counts, as in TEI); past "
    "it a request gets TEI's 429 (TEI's --max-concurrent-requests, same default)",
)  # fmt: skip
TASK_FLAG_PATCH = Flag(
    "VLLM_NPU_EXT_TASK_FLAG_PATCH", "1",
    "0: leave vLLM's argument parser alone (`vllm serve --task embed` then fails as in stock "
    "vLLM; 1: read as --runner pooling --convert embed, with a notice)",
)  # fmt: skip
SELFCHECK_EMULATE = Flag(
    "VLLM_NPU_EXT_SELFCHECK_EMULATE", "0",
    "1: `vllm-npu-ext selfcheck` runs on the CPU under the torch_npu emulator (tests selfcheck "
    "itself; every line says emulated)",
)  # fmt: skip

# Every variable, documented in docs/environment.md's variable table.
VARIABLES: dict[str, Variable] = {
    variable.name: variable
    for variable in (
        MODEL_OVERRIDE, GENERATION, EMULATE, EMULATE_OPS, EMULATE_DEVICE_MIB, KV_CACHE_FREE,
        FULL_GRAPH, SHARED_PREFIX, SHARED_PREFIX_MIN_TOKENS, COMPILE,
        CPU_FLOAT32_MATMUL, FUSED, *FUSE.values(), ATTENTION_OP, ATTENTION_UPDATE_KERNEL,
        ATTENTION_UPDATE_CONTIGUOUS, CP_PATCH, COS_SIN_PATCH, PCP_INPUT_IDS_PATCH,
        ACCEPT_PATCH_SOURCES, BOOTSTRAP,
        OPP_PATH, HOST_KERNEL_CACHE, TEI_MAX_CLIENT_BATCH_SIZE, TEI_AUTO_TRUNCATE,
        TEI_PAYLOAD_LIMIT, TEI_MAX_CONCURRENT_REQUESTS, TASK_FLAG_PATCH, SELFCHECK_EMULATE,
    )
}


def get(name: str) -> str:
    """The variable `name`'s value as set, or its documented default; ValueError for a name
    the package does not read."""
    if name not in VARIABLES:
        raise ValueError(f"unknown vllm-npu-ext environment variable: {name!r}")
    return VARIABLES[name].raw()


def cache_dir() -> Path:
    """The package's cache directory: $XDG_CACHE_HOME/vllm_npu_ext, else ~/.cache/vllm_npu_ext
    (built-in models, generated templates, host kernel builds)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm_npu_ext"


def describe() -> dict[str, dict[str, str]]:
    """Every variable with its effective value and whether it is set explicitly."""
    return {
        name: {"value": var.raw(), "default": var.default, "set": str(name in os.environ).lower()}
        for name, var in VARIABLES.items()
    }
