"""Shared prefixes in vLLM's forward: one step's texts that start alike, computed once.

Our cache-free pooling model holds a `SharedPrefixes` (None where sharing is off or does not
apply). vLLM's runner calls the model through `_model_forward`; the patch
`patches/vllm_shared_prefix.py` hands each such call here, with what the runner holds on the
host, and this module:

1. plans the step (`ops.shared_prefix.find_shared_prefixes`) from the runner's host token
   ids and query offsets, only for whole prompts (nothing computed before, no prompt
   embeddings, no pipeline stage but the only one): no device-to-host sync;
2. chooses the rows the model runs: the unique rows, padded to the smallest graph size that
   holds them where the runner replays piecewise graphs (the graph is chosen for the
   deduplicated count, not the step's), or exactly them where it runs eagerly. In one graph
   per forward, attention is captured with the static tensors of its capture and only its
   host lengths change per replay: shared-prefix attention gathers keys per step, which no
   captured graph holds, so a sharing step runs that compiled forward eagerly;
3. gathers the input ids and positions of those rows (positions continue after the prefix:
   they are the step's own) into the runner's buffers where a graph reads them at their
   captured addresses, runs the model under `forward_context.shared_prefix_step` (attention
   reads the plan there), and returns the hidden states of every step row, taken from the
   unique row that holds it, so the pooler reads the rows it always reads.

A step that shares nothing runs the runner's call unchanged.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from vllm_npu_ext import envs
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.model_executor import forward_context
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.ops.shared_prefix import SharedPrefixPlan, find_shared_prefixes

logger = get_logger(__name__)
# Graph modes of our model (`Qwen3ForCausalLM.graph_mode`) under which sharing steps run.
GRAPH_MODES = ("none", "piecewise", "full")


@dataclasses.dataclass
class SharingStats:
    """What sharing did in this process: steps seen and shared, tokens of those steps and
    tokens computed (unique rows, padding excluded), host seconds spent planning."""

    steps: int = 0
    shared_steps: int = 0
    tokens: int = 0
    computed_tokens: int = 0
    planning_seconds: float = 0.0
    last_rows: int = 0  # rows the last sharing step ran (its graph's size where it replayed one)
    last_graph_mode: str = ""  # and its graph mode (vLLM's CUDAGraphMode name)


@dataclasses.dataclass
class SharedPrefixes:
    """One model's sharing: `min_len` (VLLM_NPU_EXT_SHARED_PREFIX_MIN_TOKENS) and the model's
    `graph_mode` ("none", "piecewise" or "full": `models/qwen3_config.py`)."""

    min_len: int
    graph_mode: str
    stats: SharingStats = dataclasses.field(default_factory=SharingStats)

    def __post_init__(self) -> None:
        if self.min_len < 1:
            raise ValueError(f"min_len must be >= 1, got {self.min_len}")
        if self.graph_mode not in GRAPH_MODES:
            raise ValueError(f"graph_mode must be one of {GRAPH_MODES}, got {self.graph_mode!r}")

    def plan(self, host_ids: torch.Tensor, query_start_loc: torch.Tensor,
             num_computed: Any) -> SharedPrefixPlan | None:  # fmt: skip
        """The step's plan from the runner's host tensors: ids `[>= T]`, `query_start_loc`
        `[num_reqs + 1]` and the requests' computed-token counts; None if nothing is shared."""
        began = time.perf_counter()
        offsets = query_start_loc.tolist()
        plan = None
        if len(offsets) > 2 and offsets[0] == 0 and offsets[-1] <= host_ids.shape[0]:
            seqs = PackedSeqs.from_query_start_loc(query_start_loc)
            if seqs.num_seqs == len(offsets) - 1 and not any(int(n) for n in num_computed):
                plan = find_shared_prefixes(host_ids[: seqs.num_tokens], seqs, self.min_len)
        stats, num_tokens = self.stats, offsets[-1] - offsets[0]
        stats.planning_seconds += time.perf_counter() - began
        stats.steps += 1
        stats.tokens += num_tokens
        stats.computed_tokens += num_tokens if plan is None else plan.num_unique
        stats.shared_steps += plan is not None
        return plan

    def rows_and_mode(self, plan: SharedPrefixPlan, runtime_mode: Any,
                      capture_sizes: list[int]) -> tuple[int, Any]:  # fmt: skip
        """How many rows the model runs and under which graph mode (module docstring, 2)."""
        from vllm.config.compilation import CUDAGraphMode

        if runtime_mode == CUDAGraphMode.NONE or self.graph_mode == "full":
            return plan.num_unique, CUDAGraphMode.NONE
        if runtime_mode != CUDAGraphMode.PIECEWISE:
            raise ValueError(f"shared prefixes run eagerly or in piecewise graphs, not in "
                             f"{runtime_mode}")  # fmt: skip
        sizes = sorted(capture_sizes)
        index = bisect.bisect_left(sizes, plan.num_unique)
        if index == len(sizes):
            return plan.num_unique, CUDAGraphMode.NONE
        return sizes[index], runtime_mode

    def forward(self, run_model: Callable, plan: SharedPrefixPlan, input_ids: torch.Tensor,
                positions: torch.Tensor, capture_sizes: list[int]) -> torch.Tensor:  # fmt: skip
        """`run_model(input_ids, positions)` on the plan's rows; hidden states of the step's
        `input_ids.shape[0]` rows (module docstring, 2 and 3)."""
        from vllm.config.compilation import CUDAGraphMode

        num_rows, mode = self.rows_and_mode(plan, forward_context.runtime_mode(), capture_sizes)
        self.stats.last_rows, self.stats.last_graph_mode = num_rows, mode.name
        gather = plan.tensor("unique_rows", input_ids.device, num_rows)
        ids = input_ids.index_select(0, gather)
        rows = positions.index_select(positions.dim() - 1, gather)
        if mode != CUDAGraphMode.NONE:  # a replay reads its inputs at the captured addresses
            input_ids[:num_rows].copy_(ids)
            positions[..., :num_rows].copy_(rows)
            ids, rows = input_ids[:num_rows], positions[..., :num_rows]
        with forward_context.shared_prefix_step(plan, num_rows, mode):
            hidden_states = run_model(ids, rows)
        scatter = plan.tensor("original_to_unique", input_ids.device, input_ids.shape[0])
        return hidden_states.index_select(0, scatter)


def for_model(vllm_config: Any, cache_free: bool, graph_mode: str) -> SharedPrefixes | None:
    """The model's sharing, or None (logged why) where it is off or cannot apply: a pooling
    run without a KV cache, one pipeline stage, one data-parallel rank (their steps must keep
    the token counts the other ranks expect), no sequence parallelism (it pads and splits the
    step's rows across ranks), no LoRA (requests with other adapters compute other prefixes),
    token-id prompts."""
    if not cache_free or not envs.SHARED_PREFIX():
        return None
    parallel = vllm_config.parallel_config
    pass_config = getattr(getattr(vllm_config, "compilation_config", None), "pass_config", None)
    reason = None
    if parallel.pipeline_parallel_size > 1 or parallel.data_parallel_size > 1:
        reason = "pipeline or data parallelism"
    elif getattr(pass_config, "enable_sp", False):
        reason = "sequence parallelism"
    elif getattr(vllm_config, "lora_config", None) is not None:
        reason = "LoRA (adapters differ per request)"
    elif getattr(vllm_config.model_config, "enable_prompt_embeds", False):
        reason = "prompt embeddings (no token ids to compare)"
    if reason is not None:
        logger.info("vllm-npu-ext: shared prefixes are not computed once with %s", reason)
        return None
    return SharedPrefixes(envs.SHARED_PREFIX_MIN_TOKENS(), graph_mode)
