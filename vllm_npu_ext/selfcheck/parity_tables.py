"""Which parity cases run where: the small unit grid and the Qwen3-Embedding layer shapes.

- `UNIT_CASES`: dtypes x odd sizes x GQA ratios, small enough for the emulator tier and the
  NPU tier to run all of them. Fused attention covers both sides of the documented FIA domain
  (`ops.attention.choose_operator`): FIA where it takes the shapes (bfloat16, head_dim 128 or
  192), FA at the small head dims and the dtypes FIA lacks. The CP merge runs on contiguous
  lists and on the strided views the CP path passes, at the same sizes.
- `qwen3_cases(...)`: every fused operator at the shapes Qwen3-Embedding 0.6B/4B/8B's layers
  use (few tokens, so the CPU reference stays cheap), for the NPU tier and selfcheck.
- `bench_cases(...)`: the same layers at serving batch sizes, for micro-benchmarks.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

import torch

from vllm_npu_ext.ops.attention import FUSED_INFER, FUSION, choose_operator
from vllm_npu_ext.ops.attention import OPERATORS as ATTENTION_OPERATORS
from vllm_npu_ext.ops.linear import grouped_linear_supports
from vllm_npu_ext.selfcheck.parity_cases import DTYPES, OpCase


@dataclasses.dataclass(frozen=True)
class ModelShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int

    @property
    def qkv_size(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


# (hidden, q heads, kv heads, head_dim, intermediate, layers), from the models' config.json.
QWEN3_EMBEDDING: dict[str, ModelShape] = {
    "0.6b": ModelShape(1024, 16, 8, 128, 3072, 28),
    "4b": ModelShape(2560, 32, 8, 128, 9728, 36),
    "8b": ModelShape(4096, 32, 8, 128, 12288, 36),
}
ROPE_THETA = 1_000_000.0
MAX_POSITION = 32768
# Beyond the 2048x2048 compressed causal mask: checks sparse_mode=3 on long documents.
LONG_SEQ_LENS = (2100, 3)
CP_BATCH = 5  # decode requests per CP merge case: N = CP_BATCH * heads rows


def _grid(op: str, dtypes: Iterable[torch.dtype], sizes: Iterable[dict]) -> list[OpCase]:
    return [OpCase.of(op, dtype, **size) for dtype, size in itertools.product(dtypes, sizes)]


SEQ_LEN_CASES = [(1,), (5, 17, 1), (64, 3, 33)]
HEAD_COUNTS = [(4, 4), (4, 2), (8, 2)]
UNIT_CASES: list[OpCase] = [
    *_grid("rms_norm", DTYPES, [{"shape": s} for s in [(1, 64), (7, 130), (33, 4, 32)]]),
    *_grid("rms_norm_strided", DTYPES, [{}]),
    *_grid("add_rms_norm", DTYPES, [{"tokens": t} for t in (1, 7, 33)]),
    *_grid(
        "rotary",
        DTYPES,
        [
            {"tokens": t, "heads": n, "head_dim": d}
            for t, n, d in [(1, 1, 32), (7, 4, 64), (33, 3, 128)]
        ],
    ),
    *_grid(  # npu_mrope's domain: head_dim and rotary_dim multiples of 32 (ops/rotary.py)
        "rotary_qk",
        DTYPES,
        [
            {"tokens": t, "q_heads": q, "kv_heads": kv, "head_dim": d, "rotary_dim": r}
            for t, q, kv, d, r in [(1, 1, 1, 32, 32), (7, 4, 2, 64, 64), (33, 3, 1, 128, 64)]
        ],
    ),
    *_grid("swiglu", DTYPES, [{"shape": s} for s in [(1, 64), (7, 2 * 3072 // 8), (33, 18)]]),
    *_grid(
        "linear",
        DTYPES,
        [{"tokens": t, "k": k, "n": n} for t, k, n in [(1, 64, 32), (7, 96, 160), (33, 128, 48)]],
    ),
    *_grid(
        "grouped_qkv",
        [dtype for dtype in DTYPES if grouped_linear_supports(dtype)],
        [
            {"tokens": t, "q_heads": q, "kv_heads": kv}
            for t, q, kv in [(1, 4, 4), (7, 4, 2), (33, 8, 2)]
        ],
    ),
    *_grid(  # inside FIA's TND domain
        "attention",
        [torch.bfloat16],
        [
            {"operator": FUSED_INFER, "seq_lens": s, "q_heads": q, "kv_heads": kv, "head_dim": d}
            for (s, (q, kv)), d in [
                *((case, 128) for case in itertools.product(SEQ_LEN_CASES, HEAD_COUNTS)),
                (((5, 17, 1), (4, 2)), 192),
            ]
        ],
    ),
    *_grid(  # outside it: where the model uses FA (small head dims, float16, float32)
        "attention",
        DTYPES,
        [
            {"operator": FUSION, "seq_lens": s, "q_heads": q, "kv_heads": kv, "head_dim": d}
            for s, (q, kv), d in itertools.product(SEQ_LEN_CASES, [(4, 4), (8, 2)], (32, 64))
        ],
    ),
    *_grid(
        "attention_update",
        DTYPES,
        [
            {"kernel": kernel, "sp": sp, "rows": rows, "head_dim": d}
            for kernel, (sp, rows, d) in itertools.product(
                ("list", "custom"), [(1, 5, 8), (4, 20, 64), (16, 3, 512)]
            )
        ],
    ),
    *_grid(
        "attention_update_strided",
        [torch.float32],
        [{"kernel": kernel, "sp": 4, "rows": 20, "head_dim": 64} for kernel in ("list", "custom")],
    ),
]


def unit_cases(op: str, **match) -> list[OpCase]:
    """The unit cases of `op` whose params include every `match` item."""
    return [
        case
        for case in UNIT_CASES
        if case.op == op and all(case.kwargs.get(k) == v for k, v in match.items())
    ]


def _layer_cases(model: str, shape: ModelShape, dtype: torch.dtype, tokens: int) -> list[OpCase]:
    """The token-wise operators of one decoder layer for `tokens` tokens."""
    h, d, inter = shape.hidden, shape.head_dim, shape.intermediate
    rope = {"head_dim": d, "max_position": MAX_POSITION, "base": ROPE_THETA}
    sizes = [
        ("rms_norm", {"shape": (tokens, h)}),  # input_layernorm of layer 0
        ("rms_norm", {"shape": (tokens, shape.heads, d)}),  # q_norm
        ("rms_norm", {"shape": (tokens, shape.kv_heads, d)}),  # k_norm
        ("add_rms_norm", {"tokens": tokens, "hidden": h}),
        ("rotary", {"tokens": tokens, "heads": shape.heads, **rope}),
        ("rotary", {"tokens": tokens, "heads": shape.kv_heads, **rope}),
        ("rotary_qk", {"tokens": tokens, "q_heads": shape.heads, "kv_heads": shape.kv_heads,
                       **rope}),  # fmt: skip
        ("swiglu", {"shape": (tokens, 2 * inter)}),
        ("linear", {"tokens": tokens, "k": h, "n": shape.qkv_size}),  # merged qkv
        ("linear", {"tokens": tokens, "k": shape.heads * d, "n": h}),  # o_proj
        ("linear", {"tokens": tokens, "k": h, "n": 2 * inter}),  # gate_up_proj
        ("linear", {"tokens": tokens, "k": inter, "n": h}),  # down_proj
        (
            "grouped_qkv",
            {
                "tokens": tokens,
                "q_heads": shape.heads,
                "kv_heads": shape.kv_heads,
                "head_dim": d,
                "hidden": h,
            },
        ),
    ]
    if not grouped_linear_supports(dtype):  # float32: the model uses the merged qkv linear
        sizes = [(op, size) for op, size in sizes if op != "grouped_qkv"]
    return [OpCase.of(op, dtype, models=[model], **size) for op, size in sizes]


def _attention_cases(model, shape, dtype, seq_lens_sets) -> list[OpCase]:
    """Each attention operator the model may choose for this shape (either switch setting)."""
    heads = (shape.head_dim, shape.heads, shape.kv_heads)
    choices = [choose_operator(op, dtype, *heads).operator for op in ATTENTION_OPERATORS]
    operators = [op for op in dict.fromkeys(choices) if op is not None]
    return [
        OpCase.of(
            "attention",
            dtype,
            models=[model],
            operator=operator,
            seq_lens=seq_lens,
            q_heads=shape.heads,
            kv_heads=shape.kv_heads,
            head_dim=shape.head_dim,
        )
        for operator, seq_lens in itertools.product(operators, seq_lens_sets)
    ]


def _attention_update_cases(model, shape, dtype, kernels, shard_counts) -> list[OpCase]:
    sizes = [
        {"kernel": k, "sp": sp, "rows": CP_BATCH * shape.heads, "head_dim": shape.head_dim}
        for k, sp in itertools.product(kernels, shard_counts)
    ]
    cases = [OpCase.of("attention_update", dtype, models=[model], **size) for size in sizes]
    if dtype == torch.float32:  # the CP merge's buffer is float32
        cases += [OpCase.of("attention_update_strided", dtype, models=[model], **s) for s in sizes]
    return cases


def merge_models(cases: Iterable[OpCase]) -> list[OpCase]:
    """One case per (op, dtype, params), its `models` the union, first-seen order kept."""
    merged: dict[tuple, list[str]] = {}
    for case in cases:
        models = merged.setdefault((case.op, case.dtype, case.params), [])
        models.extend(m for m in case.models if m not in models)
    return [OpCase(*key, tuple(models)) for key, models in merged.items()]


def qwen3_cases(
    models: Sequence[str] = tuple(QWEN3_EMBEDDING),
    dtypes: Sequence[torch.dtype] = DTYPES,
    tokens: Sequence[int] = (7, 257),
    seq_lens_sets: Sequence[tuple[int, ...]] = ((1, 7, 33), (257, 1, 1000)),
    long_sequence: bool = True,
    update_kernels: Sequence[str] = ("list",),
    shard_counts: Sequence[int] = (2, 8),
) -> list[OpCase]:
    """Every fused operator at the listed Qwen3-Embedding sizes.

    long_sequence adds one bfloat16 attention case longer than the compressed causal mask
    (LONG_SEQ_LENS) at the first model's head counts.
    """
    unknown = set(models) - set(QWEN3_EMBEDDING)
    if unknown:
        raise ValueError(f"models must be among {sorted(QWEN3_EMBEDDING)}, got {sorted(unknown)}")
    cases: list[OpCase] = []
    for model, dtype in itertools.product(models, dtypes):
        shape = QWEN3_EMBEDDING[model]
        for count in tokens:
            cases += _layer_cases(model, shape, dtype, count)
        cases += _attention_cases(model, shape, dtype, seq_lens_sets)
        cases += _attention_update_cases(model, shape, dtype, update_kernels, shard_counts)
    if long_sequence and models:
        shape = QWEN3_EMBEDDING[models[0]]
        cases += _attention_cases(models[0], shape, torch.bfloat16, [LONG_SEQ_LENS])
    return merge_models(cases)


def _packed_seq_lens(tokens: int, longest: int = 512) -> tuple[int, ...]:
    """`tokens` as sequences of `longest` tokens (plus a shorter last one)."""
    full, rest = divmod(tokens, longest)
    return (longest,) * full + ((rest,) if rest else ())


def bench_cases(
    models: Sequence[str] = tuple(QWEN3_EMBEDDING),
    tokens: Sequence[int] = (16, 1024),
    dtype: torch.dtype = torch.bfloat16,
) -> list[OpCase]:
    """One case per fusion and layer shape at serving batch sizes (tokens per forward)."""
    cases: list[OpCase] = []
    for model, count in itertools.product(models, tokens):
        shape = QWEN3_EMBEDDING[model]
        cases += _layer_cases(model, shape, dtype, count)
        cases += _attention_cases(model, shape, dtype, [_packed_seq_lens(count)])[:1]
    return merge_models(cases)
