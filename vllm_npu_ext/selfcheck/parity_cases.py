"""Parity cases: every fused NPU operator against our PyTorch reference, in one table.

Shared by the emulator tier (tests/ops/test_fused_ops.py), the NPU tier
(tests/selfcheck/test_npu_tier.py, `pytest -m npu`) and `vllm-npu-ext selfcheck`. A case names
an operator family (`OPS`), a dtype and its sizes. `OpCase.run(npu, device)`:

1. builds deterministic inputs on the CPU (already rounded to the case dtype);
2. evaluates the reference there from float32 copies of those inputs and rounds each
   output once to its dtype: what an exact kernel would return, so the comparison measures
   the fused kernel's error and not the reference's own intermediate roundings;
3. moves the inputs to `device` and runs the fused operator through the same
   `vllm_npu_ext.ops` function the model calls, with `npu` the torch_npu module (or the
   emulator);

and returns one `Parity` per output. `OpCase.bench_pair` gives the fused and the unfused
(reference) call on device-resident inputs, for micro-benchmarks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from vllm_npu_ext.ops import activation, attention, layernorm, linear, rotary
from vllm_npu_ext.ops.attention_update import attention_update_reference
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.selfcheck.parity import Parity, dtype_name

EPS = 1e-6
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MERGE_UPDATE_TYPE = 1  # both outputs (merged out and lse) are produced and compared
ATTENTION_UPDATE_KERNELS = {"list": "npu_attention_update", "custom": "npu_ext_attention_update"}


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Standard normal CPU tensor from a fixed seed, rounded to `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(dtype)


# -- input builders (CPU, deterministic) and runs (`npu` None: the reference) ------------


def _norm_weight(size: int, dtype: torch.dtype) -> torch.Tensor:
    return 1 + 0.1 * randn(size, dtype=dtype, seed=1)


def _rms_norm_inputs(dtype, shape):
    return {"x": randn(*shape, dtype=dtype), "weight": _norm_weight(shape[-1], dtype)}


def _rms_norm(npu, x, weight):
    return [layernorm.rms_norm(x, weight, EPS, npu=npu)]


def _strided_rms_norm_inputs(dtype, rows=9, width=160, columns=96):
    return {"wide": randn(rows, width, dtype=dtype), "weight": _norm_weight(columns, dtype)}


def _strided_rms_norm(npu, wide, weight):
    # Row stride `width`: a view into a wider buffer, made on the device itself.
    return [layernorm.rms_norm(wide[:, : weight.shape[0]], weight, EPS, npu=npu)]


def _add_rms_norm_inputs(dtype, tokens, hidden=96):
    return {
        "x": randn(tokens, hidden, dtype=dtype),
        "residual": randn(tokens, hidden, dtype=dtype, seed=2),
        "weight": _norm_weight(hidden, dtype),
    }


def _add_rms_norm(npu, x, residual, weight):
    return list(layernorm.add_rms_norm(x, residual, weight, EPS, npu=npu))


def _rotary_inputs(dtype, tokens, heads, head_dim, max_position=512, base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = torch.outer(torch.arange(max_position).float(), inv_freq)
    cos_sin_cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)
    generator = torch.Generator().manual_seed(3)
    positions = torch.randint(0, max_position, (tokens,), generator=generator)
    cos, sin = rotary.gather_tables(*rotary.full_width_tables(cos_sin_cache), positions)
    return {"x": randn(tokens, heads, head_dim, dtype=dtype), "cos": cos, "sin": sin}


def _rotary(npu, x, cos, sin):
    return [rotary.apply_rotary(x, cos, sin, npu=npu)]


def _rotary_qk_inputs(dtype, tokens, q_heads, kv_heads, head_dim, rotary_dim=None,
                      max_position=512, base=10000.0):  # fmt: skip
    rotary_dim = rotary_dim or head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(torch.arange(max_position).float(), inv_freq)
    generator = torch.Generator().manual_seed(3)
    return {
        "q": randn(tokens, q_heads, head_dim, dtype=dtype),
        "k": randn(tokens, kv_heads, head_dim, dtype=dtype, seed=1),
        "positions": torch.randint(0, max_position, (tokens,), generator=generator),
        "cos_sin_cache": torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype),
    }


def _rotary_qk(npu, q, k, positions, cos_sin_cache):
    return list(rotary.apply_rotary_qk(q, k, positions, cos_sin_cache, npu=npu))


def _swiglu_inputs(dtype, shape):
    return {"x": randn(*shape, dtype=dtype)}


def _swiglu(npu, x):
    return [activation.swiglu(x, npu=npu)]


def _linear_inputs(dtype, tokens, k, n):
    return {"x": randn(tokens, k, dtype=dtype), "weight": randn(n, k, dtype=dtype, seed=1) / k**0.5}


def _linear(npu, x, weight):
    return [linear.linear(x, weight, npu=npu)]


def _grouped_qkv_inputs(dtype, tokens, q_heads, kv_heads, head_dim=32, hidden=96):
    sizes = [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
    weights = [randn(n, hidden, dtype=dtype, seed=i) / hidden**0.5 for i, n in enumerate(sizes)]
    return {
        "x": randn(tokens, hidden, dtype=dtype),
        "weights": weights,
        "weights_kn": [w.t().contiguous() for w in weights],
    }


def _grouped_qkv(npu, x, weights, weights_kn):
    """Fused: one grouped matmul on [K, N] weights. Reference: three separate projections."""
    if npu is None:
        return [linear.linear(x, w) for w in weights]
    return linear.grouped_linear(x, weights_kn, npu=npu)


def _attention_inputs(dtype, operator, seq_lens, q_heads, kv_heads, head_dim=64):
    tokens = sum(seq_lens)
    return {
        "q": randn(tokens, q_heads, head_dim, dtype=dtype),
        "k": randn(tokens, kv_heads, head_dim, dtype=dtype, seed=1),
        "v": randn(tokens, kv_heads, head_dim, dtype=dtype, seed=2),
        "seqs": PackedSeqs.from_seq_lens(seq_lens),
        "operator": operator,
    }


def _attention(npu, q, k, v, seqs, operator):
    scale = q.shape[-1] ** -0.5
    return [attention.varlen_attention(q, k, v, seqs, scale, npu=npu, operator=operator)]


def _merge_shards(npu, kernel, lse, out):
    """AttentionUpdate through one kernel: torch_npu's TensorList op or our custom op."""
    if npu is None:
        return list(attention_update_reference(lse, out, MERGE_UPDATE_TYPE))
    if kernel == "custom":
        from vllm_npu_ext.cann_ops import binding  # defines the op, loads its NPU kernel

        if not binding.custom_kernel_available(lse.device):
            raise RuntimeError(f"{binding.QUALIFIED_NAME} has no kernel for {lse.device}")
        merged = torch.ops.npu_ext_cann.npu_ext_attention_update(lse, out, MERGE_UPDATE_TYPE)
    else:
        merged = npu.npu_attention_update(
            list(lse.unbind(0)), list(out.unbind(0)), MERGE_UPDATE_TYPE
        )
    return list(merged)


def _shard_buffer(sp, rows, head_dim, seed=0):
    """fp32 `[sp, N, D + 1]`: out in the first D columns, lse (about 1/4 shards empty) last."""
    generator = torch.Generator().manual_seed(seed)
    buffer = torch.randn(sp, rows, head_dim + 1, generator=generator)
    lse = buffer[..., head_dim]
    lse *= 4
    empty = torch.rand(sp, rows, generator=generator) < 0.25
    empty[0] = False  # every row keeps shard 0's keys: a decode query always sees itself
    lse[empty] = float("-inf")
    return buffer


def _attention_update_inputs(dtype, kernel, sp, rows, head_dim):
    buffer = _shard_buffer(sp, rows, head_dim)
    lse, out = buffer[..., head_dim].contiguous(), buffer[..., :head_dim].contiguous().to(dtype)
    return {"kernel": kernel, "lse": lse, "out": out}


def _strided_attention_update_inputs(dtype, kernel, sp, rows, head_dim):
    if dtype != torch.float32:
        raise ValueError(f"strided AttentionUpdate cases are float32 (the CP buffer), got {dtype}")
    return {"kernel": kernel, "buffer": _shard_buffer(sp, rows, head_dim)}


def _strided_attention_update(npu, kernel, buffer):
    # The views the CP merge passes (vllm_npu_ext.ops.cp_merge.split_out_lse), made on-device.
    return _merge_shards(npu, kernel, buffer[..., -1], buffer[..., :-1])


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """How to test one operator family.

    operator: the torch_npu operator (or a function of the case's params naming it).
    inputs(dtype, **params) -> CPU inputs by name; run(npu, **inputs) -> outputs, with
    `npu=None` the PyTorch reference. outputs: their names. float32_outputs: outputs that
    are float32 whatever the case dtype (e.g. a log-sum-exp).
    """

    operator: str | Callable[[dict[str, Any]], str]
    inputs: Callable[..., dict[str, Any]]
    run: Callable[..., Sequence[torch.Tensor]]
    outputs: tuple[str, ...] = ("y",)
    float32_outputs: tuple[str, ...] = ()


def _attention_update_operator(params: dict[str, Any]) -> str:
    return ATTENTION_UPDATE_KERNELS[params["kernel"]]


OPS: dict[str, OpSpec] = {
    "rms_norm": OpSpec("npu_rms_norm", _rms_norm_inputs, _rms_norm),
    "rms_norm_strided": OpSpec("npu_rms_norm", _strided_rms_norm_inputs, _strided_rms_norm),
    "add_rms_norm": OpSpec(
        "npu_add_rms_norm", _add_rms_norm_inputs, _add_rms_norm, outputs=("y", "x_sum")
    ),
    "rotary": OpSpec("npu_rotary_mul", _rotary_inputs, _rotary),
    "rotary_qk": OpSpec("npu_mrope", _rotary_qk_inputs, _rotary_qk, outputs=("q", "k")),
    "swiglu": OpSpec("npu_swiglu", _swiglu_inputs, _swiglu),
    "linear": OpSpec("npu_linear", _linear_inputs, _linear),
    "grouped_qkv": OpSpec(
        "npu_grouped_matmul", _grouped_qkv_inputs, _grouped_qkv, outputs=("q", "k", "v")
    ),
    "attention": OpSpec(lambda p: f"npu_{p['operator']}", _attention_inputs, _attention),
    "attention_update": OpSpec(
        _attention_update_operator,
        _attention_update_inputs,
        _merge_shards,
        outputs=("out", "lse"),
        float32_outputs=("lse",),
    ),
    "attention_update_strided": OpSpec(
        _attention_update_operator,
        _strided_attention_update_inputs,
        _strided_attention_update,
        outputs=("out", "lse"),
        float32_outputs=("lse",),
    ),
}


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, list):
        return [_map_tensors(item, fn) for item in value]
    return value


def _float32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.is_floating_point() else t


@dataclasses.dataclass(frozen=True)
class OpCase:
    """One parity case. params: the input builder's keyword arguments, as sorted pairs.

    models: the Qwen3-Embedding sizes whose layers this case reproduces (empty for the
    small unit cases).
    """

    op: str
    dtype: torch.dtype
    params: tuple[tuple[str, Any], ...]
    models: tuple[str, ...] = ()

    @classmethod
    def of(cls, op: str, dtype: torch.dtype, models: Sequence[str] = (), **params) -> OpCase:
        if op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, got {op!r}")
        frozen = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
        return cls(op, dtype, tuple(sorted(frozen.items())), tuple(models))

    @property
    def kwargs(self) -> dict[str, Any]:
        return {k: list(v) if k == "seq_lens" else v for k, v in self.params}

    @property
    def operator(self) -> str:
        spec = OPS[self.op]
        return spec.operator if isinstance(spec.operator, str) else spec.operator(self.kwargs)

    @property
    def fusion(self) -> str:
        """The family name without layout variants (a `FusionConfig` field where one exists)."""
        return self.op.removesuffix("_strided")

    def describe(self) -> str:
        """The sizes as `k=v` pairs (a lone `shape` as `7x1024`, packed `seq_lens=5+17+1`),
        e.g. for `shape=[...]`; layout variants say so first (`strided,...`)."""
        parts = ["strided"] if self.op.endswith("_strided") else []
        for key, value in self.params:
            joiner = "+" if key == "seq_lens" else "x"  # packed lengths vs a tensor shape
            text = joiner.join(map(str, value)) if isinstance(value, tuple) else str(value)
            parts.append(text if key == "shape" else f"{key}={text}")
        return ",".join(parts)

    def __str__(self) -> str:
        return f"{self.op}-{dtype_name(self.dtype)}-{self.describe()}"

    def inputs(self) -> dict[str, Any]:
        return OPS[self.op].inputs(self.dtype, **self.kwargs)

    def run(self, npu: ModuleType, device: torch.device | str = "cpu") -> list[Parity]:
        """The fused operator on `device` against the float32 reference on the CPU."""
        spec = OPS[self.op]
        inputs = self.inputs()
        reference = spec.run(None, **{k: _map_tensors(v, _float32) for k, v in inputs.items()})
        on_device = {k: _map_tensors(v, lambda t: t.to(device)) for k, v in inputs.items()}
        fused = spec.run(npu, **on_device)
        if len(fused) != len(spec.outputs):
            raise ValueError(f"{self}: the fused path returned {len(fused)} outputs")
        return [
            Parity(self.operator, name, actual, expected.to(self._output_dtype(name)))
            for name, actual, expected in zip(spec.outputs, fused, reference, strict=True)
        ]

    def bench_pair(self, npu: ModuleType, device: torch.device | str) -> tuple[Callable, Callable]:
        """(fused, unfused) zero-argument calls on inputs already on `device`."""
        spec = OPS[self.op]
        on_device = {k: _map_tensors(v, lambda t: t.to(device)) for k, v in self.inputs().items()}
        return (lambda: spec.run(npu, **on_device)), (lambda: spec.run(None, **on_device))

    def _output_dtype(self, name: str) -> torch.dtype:
        return torch.float32 if name in OPS[self.op].float32_outputs else self.dtype
