"""What a selfcheck run covers: the full plan for an Ascend host, the quick one for CI."""

from __future__ import annotations

import dataclasses

from vllm_npu_ext.selfcheck import parity_tables
from vllm_npu_ext.selfcheck.parity_cases import OpCase

KERNELS_WITHOUT_CUSTOM = ("list",)
KERNELS_WITH_CUSTOM = ("list", "custom")
# Tiny checkpoints of the model part: name -> overrides of the `tiny` preset. head_dim 32
# runs fused attention through npu_fusion_attention; head_dim 128 in bfloat16 through
# npu_fused_infer_attention_score, as Qwen3-Embedding does (ops.attention.choose_operator).
TINY_MODELS: dict[str, dict] = {"tiny": {}, "tiny-d128": {"head_dim": 128}}


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes per part. models: Qwen3-Embedding sizes (keys of parity_tables.QWEN3_EMBEDDING);
    tokens: tokens per token-wise op case; seq_lens_sets: packed attention batches;
    shard_counts: CP merge shard counts; unit_grid: also the small unit cases;
    bench_*: micro-benchmark sizes and repeats; tiny_runs: (TINY_MODELS name, engine dtype)
    of each tiny-model engine; compiled_engine: each model also in a compiled engine (vLLM's
    default graph mode).
    """

    name: str
    models: tuple[str, ...]
    tokens: tuple[int, ...]
    seq_lens_sets: tuple[tuple[int, ...], ...]
    long_sequence: bool
    shard_counts: tuple[int, ...]
    unit_grid: bool
    bench_models: tuple[str, ...]
    bench_tokens: tuple[int, ...]
    bench_warmup: int
    bench_repeats: int
    tiny_runs: tuple[tuple[str, str], ...]
    compiled_engine: bool

    def op_cases(self, custom_kernel: bool) -> list[OpCase]:
        """Qwen3-Embedding layer cases (and the unit grid); our custom op only if installed."""
        kernels = KERNELS_WITH_CUSTOM if custom_kernel else KERNELS_WITHOUT_CUSTOM
        cases = parity_tables.qwen3_cases(
            models=self.models, tokens=self.tokens, seq_lens_sets=self.seq_lens_sets,
            long_sequence=self.long_sequence, update_kernels=kernels,
            shard_counts=self.shard_counts,
        )  # fmt: skip
        if self.unit_grid:
            unit = parity_tables.UNIT_CASES
            cases += [c for c in unit if c.kwargs.get("kernel", "list") in kernels]
        return cases

    def bench_cases(self) -> list[OpCase]:
        return parity_tables.bench_cases(models=self.bench_models, tokens=self.bench_tokens)

    def coverage(self, parts: list[str], model_label: str | None) -> str:
        """Which shapes this run covers, in words, for the report."""
        described = []
        if "ops" in parts:
            seqs = " ".join("[" + ",".join(map(str, s)) + "]" for s in self.seq_lens_sets)
            long = f" + [{','.join(map(str, parity_tables.LONG_SEQ_LENS))}] bf16"
            described.append(
                f"ops at Qwen3-Embedding {'/'.join(self.models)} layer shapes (tokens "
                f"{','.join(map(str, self.tokens))}; attention seq_lens {seqs}"
                f"{long if self.long_sequence else ''}; CP merge sp "
                f"{','.join(map(str, self.shard_counts))})"
                + (" + unit grid" if self.unit_grid else "")
            )
        if "model" in parts:
            tiny = " + ".join(f"{name} ({dtype})" for name, dtype in self.tiny_runs)
            engines = ", eager and compiled engines" if self.compiled_engine else ""
            described.append(
                "model " + (f"{tiny} + {model_label}" if model_label else tiny) + engines
            )
        if "bench" in parts:
            described.append(
                f"bench {'/'.join(self.bench_models)} at "
                f"{','.join(map(str, self.bench_tokens))} tokens"
            )
        return f"{self.name} plan: " + "; ".join(described)


FULL = Plan(
    name="full",
    models=tuple(parity_tables.QWEN3_EMBEDDING),
    tokens=(7, 257),
    seq_lens_sets=((1, 7, 33), (257, 1, 1000)),
    long_sequence=True,
    shard_counts=(2, 8),
    unit_grid=True,
    bench_models=tuple(parity_tables.QWEN3_EMBEDDING),
    bench_tokens=(16, 1024),
    bench_warmup=3,
    bench_repeats=10,
    tiny_runs=(("tiny", "bfloat16"), ("tiny", "float32"), ("tiny-d128", "bfloat16")),
    compiled_engine=True,
)

# For CI under the emulator (2 cores): the 0.6B shapes, few tokens, one (eager) engine; the
# compiled engine is tested by tests/model_executor/test_graph_mode.py there.
QUICK = Plan(
    name="quick",
    models=("0.6b",),
    tokens=(5,),
    seq_lens_sets=((1, 4, 9),),
    long_sequence=False,
    shard_counts=(2,),
    unit_grid=False,
    bench_models=("0.6b",),
    bench_tokens=(16,),
    bench_warmup=1,
    bench_repeats=3,
    tiny_runs=(("tiny", "bfloat16"),),
    compiled_engine=False,
)
