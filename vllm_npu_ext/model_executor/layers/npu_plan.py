"""What one model runs, decided once when it is built: the NPU plan and the platform path's one
choice.

NPU path (torch_npu, or its emulator): which fusions apply to the model's dtype and attention
shapes (`FusionConfig`, from the environment, minus what the operators do not take), how q and
k are normed and rotated (`QK_PATHS`), and one note per fusion given up. A compiled forward
reads the plan as constants: deciding looks up registered operators, which dynamo cannot trace.
Platform path (vLLM's kernels): whether bf16/fp16 projections multiply in float32 on the CPU.
`describe_backend` is the build log's one-line account of either.

Imports no vLLM at module level, so `vllm-npu-ext doctor` reads `FusionConfig` without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, NamedTuple

import torch

from vllm_npu_ext import envs
from vllm_npu_ext.ops import attention, dispatch, linear, qk_norm_rope, rotary


class _FusionSwitches:
    """The methods of `FusionConfig`; its fields are made from `envs.FUSIONS` below."""

    @classmethod
    def from_env(cls) -> FusionConfig:
        """The switches as the environment sets them (`VLLM_NPU_EXT_FUSED` turns all off)."""
        switches = {name: envs.FUSED() and envs.FUSE[name]() for name in envs.FUSIONS}
        operator = envs.checked_choice(
            envs.ATTENTION_OP.name, envs.ATTENTION_OP(), attention.OPERATORS
        )
        return cls(**switches, attention_op=operator)

    @classmethod
    def all_off(cls) -> FusionConfig:
        return cls(**{name: False for name in envs.FUSIONS})

    def without(self, fusion: str) -> FusionConfig:
        """This configuration with one fusion switched off."""
        if fusion not in envs.FUSIONS:
            raise ValueError(f"fusion must be one of {tuple(envs.FUSIONS)}, got {fusion!r}")
        return dataclasses.replace(self, **{fusion: False})

    def active(self) -> list[str]:
        return [name for name in envs.FUSIONS if getattr(self, name)]


# One bool per entry of `envs.FUSIONS` (all on by default), and the fused attention operator.
FusionConfig = dataclasses.make_dataclass(
    "FusionConfig",
    [*((name, bool, True) for name in envs.FUSIONS), ("attention_op", str, attention.FUSED_INFER)],
    bases=(_FusionSwitches,),
    frozen=True,
)
FusionConfig.__module__ = __name__
FusionConfig.__doc__ = "Which NPU fusions are on (one field per `envs.FUSIONS` entry)."

# How q and k get their per-head norms and rotary on the NPU path: one vllm-ascend operator
# after a merged projection; the norms, then npu_mrope for q and k together; the norms, then
# npu_rotary_mul per tensor; the norms, then the PyTorch rotary.
QK_FUSED, QK_MROPE, QK_ROTARY_MUL, QK_REFERENCE = "qkv_rmsnorm_rope", "mrope", "rotary_mul", "ref"
QK_PATHS = (QK_FUSED, QK_MROPE, QK_ROTARY_MUL, QK_REFERENCE)
QK_PATH_NAMES = {
    QK_FUSED: f"vllm.{qk_norm_rope.OP} (one launch)",
    QK_MROPE: "npu_rms_norm x2 + npu_mrope",
    QK_ROTARY_MUL: "npu_rms_norm x2 + npu_rotary_mul x2",
    QK_REFERENCE: "norms as rms_norm says, PyTorch rotary",
}
# The paths that read per-token cos/sin tables, gathered once per forward.
QK_PATHS_WITH_TABLES = (QK_ROTARY_MUL, QK_REFERENCE)


class HeadShape(NamedTuple):
    """What the plan reads of a model's attention (per tensor-parallel rank)."""

    head_dim: int
    num_heads: int
    num_kv_heads: int
    neox: bool
    rotary_dim: int

    @classmethod
    def of(cls, attn: Any) -> HeadShape:
        """From a Qwen3Attention (or anything with its shape attributes and `rotary_emb`)."""
        rotary_dim = attn.rotary_emb.cos_sin_cache.shape[-1]
        return cls(attn.head_dim, attn.num_heads, attn.num_kv_heads, attn.neox, rotary_dim)


@dataclasses.dataclass(frozen=True)
class NpuPlan:
    """The NPU path of one model: `fusions`, `qk_path` (one of QK_PATHS), and `notes`, one line
    per fusion that is on but not taken, and why. `dtype` and `head` are what it was made for."""

    dtype: torch.dtype
    head: HeadShape
    fusions: FusionConfig
    qk_path: str
    notes: tuple[str, ...] = ()

    def under(self, fusions: FusionConfig) -> NpuPlan:
        """This model's plan with other fusions, taken as given (`forward_packed` compares
        fusion configurations on one model)."""
        if fusions is self.fusions:
            return self
        qk_path = _qk_path(fusions, self.dtype, self.head, [])
        return dataclasses.replace(self, fusions=fusions, qk_path=qk_path, notes=())

    def describe(self) -> str:
        active = ", ".join(self.fusions.active()) or "none"
        line = f"NPU path ({dispatch.npu_ops_name()}), fusions: {active}"
        line += f", q/k norms and rotary: {QK_PATH_NAMES[self.qk_path]}"
        if self.fusions.attention:
            line += f", attention operator npu_{self.fusions.attention_op}"
        return line


def plan_for(dtype: torch.dtype, attn: Any) -> NpuPlan:
    """The environment's fusions, minus what the NPU operators do not take for a model of
    `dtype` with attention `attn`, with one note per change.

    Both limits are documented ones (ops/linear.py, ops/attention.py): npu_grouped_matmul
    takes float32 only as one x/weight/y, so float32 q/k/v use the merged projection; the
    attention operator follows `attention.choose_operator` for the layer's dtype and heads.
    """
    head, fusions, notes = HeadShape.of(attn), FusionConfig.from_env(), []
    if fusions.grouped_qkv and not linear.grouped_linear_supports(dtype):
        notes.append(
            f"npu_grouped_matmul takes {dtype} only with a single x/weight/y tensor; q/k/v use "
            "the merged projection"
        )
        fusions = dataclasses.replace(fusions, grouped_qkv=False)
    qk_path = _qk_path(fusions, dtype, head, notes)
    fusions = _attention_operator(fusions, dtype, head, notes)
    return NpuPlan(dtype, head, fusions, qk_path, tuple(notes))


def fusions_for(dtype: torch.dtype, attn: Any) -> tuple[FusionConfig, list[str]]:
    """`plan_for`'s fusions and notes."""
    plan = plan_for(dtype, attn)
    return plan.fusions, list(plan.notes)


def qk_path_for(fusions: FusionConfig, dtype: torch.dtype, attn: Any) -> tuple[str, list[str]]:
    """(one of QK_PATHS, notes on why a fusion that is on was not taken)."""
    notes: list[str] = []
    return _qk_path(fusions, dtype, HeadShape.of(attn), notes), notes


def _qk_path(fusions: FusionConfig, dtype: torch.dtype, head: HeadShape, notes: list[str]) -> str:
    if fusions.qk_norm_rope:
        reason = qk_norm_rope.unsupported_reason(dtype, head.head_dim, head.neox)
        if reason is None and not qk_norm_rope.registered():
            reason = f"vllm.{qk_norm_rope.OP} is not registered (vllm-ascend's NPU worker does)"
        if reason is None:
            return QK_FUSED
        notes.append(f"{reason}; q/k norms and rotary run as separate operators")
    if not fusions.rotary:
        return QK_REFERENCE
    reason = rotary.mrope_unsupported_reason(dtype, head.head_dim, head.rotary_dim)
    if reason is None:
        return QK_MROPE
    notes.append(f"{reason}; rotary runs as npu_rotary_mul on q and on k")
    return QK_ROTARY_MUL


def _attention_operator(
    fusions: FusionConfig, dtype: torch.dtype, head: HeadShape, notes: list[str]
) -> FusionConfig:
    """`fusions` with the attention operator `attention.choose_operator` gives this shape."""
    if not fusions.attention:
        return fusions
    shape = (head.head_dim, head.num_heads, head.num_kv_heads)
    choice = attention.choose_operator(fusions.attention_op, dtype, *shape)
    described = f"{dtype}, head_dim {shape[0]}, {shape[1]} q / {shape[2]} kv heads"
    if choice.operator is None:
        notes.append(f"{choice.reason} ({described}); attention runs unfused")
        return dataclasses.replace(fusions, attention=False)
    if choice.operator != fusions.attention_op:
        notes.append(f"{choice.reason} ({described}); fused attention uses npu_{choice.operator}")
        return dataclasses.replace(fusions, attention_op=choice.operator)
    return fusions


def float32_matmul(layers: Iterable[Any], dtype: torch.dtype, npu_possible: bool) -> str | None:
    """Give the projections of decoder `layers` float32 matmuls on the CPU platform path where
    `cpu_matmul_choice.choose` says so; the reason when on (for the build log), else None."""
    from vllm.platforms import current_platform

    from vllm_npu_ext.model_executor.layers import cpu_matmul, cpu_matmul_choice

    on, why = cpu_matmul_choice.choose(dtype, not npu_possible and current_platform.is_cpu())
    projections = (proj for layer in layers for proj in layer.projections())
    count = cpu_matmul.use_float32_matmul(projections) if on else 0
    return f"{count} projections in float32 ({why})" if count else None


def describe_backend(plan: NpuPlan | None, float32_note: str | None) -> str:
    """The build log's backend: the NPU plan, or the platform's kernels (`plan` None)."""
    if plan is not None:
        return plan.describe()
    from vllm.platforms import current_platform

    backend = f"platform kernels ({current_platform.device_type})"
    return f"{backend}, {float32_note}" if float32_note else backend
