"""Patch: vllm-ascend 0.23's PCP runner gives its padding tokens the id 0, not async
scheduling's `-1` placeholder.

What goes wrong. Under async scheduling (vLLM's default) the runner writes `-1` into the input
batch's token row for every token it sampled, to be replaced on the device next step
(vllm-ascend 0.23.0.post1 `NPUModelRunner._bookkeeping_sync`, `sampled_ids = [-1]`); a row keeps
them after its request finishes. With PCP, `_prepare_inputs` pads each request for its DualChunkSwap
split (`pcp_manager.update_tokens_for_pcp`) and gathers the ids of the padded positions from that
row (`NPUModelRunner._prepare_inputs`, its `token_indices` gather from `token_ids_cpu`), so a new
request in a reused row gets `-1` ids for its padding. vLLM's `_prepare_input_ids` then copies the
host ids to the device and writes the sampled tokens of continuing requests over their positions, by
index (`vllm/v1/worker/gpu_model_runner.py`, `_prepare_input_ids`): the padding keeps `-1`. Above
TP 1 the vocabulary-parallel embedding masks it (`AscendVocabParallelEmbedding._forward_origin`);
at TP 1 it is an out-of-range index (IndexError on the host; on Ascend not known here).

What it does. When vllm-ascend imports `model_runner_v1` (workers only), `NPUModelRunner` gets a
`_prepare_input_ids` that, in a PCP runner with async scheduling, sets the host ids below 0 to
0 and then runs vLLM's: the padding embeds token 0 (its output is discarded with the padding),
and every position a sampled token replaces is written by vLLM's code as before. The runner
functions it relies on are pinned (`patches/__init__.py`); `VLLM_NPU_EXT_PCP_INPUT_IDS_PATCH=0`
turns it off.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType

from vllm_npu_ext import patches
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.patches import on_import

NAME = "vllm_ascend_pcp_input_ids"  # its row in the patch table
RUNNER_MODULE = "vllm_ascend.worker.model_runner_v1"
RUNNER_CLASS = "NPUModelRunner"
METHOD = "_prepare_input_ids"
PATCHED_MARKER = "__vllm_npu_ext_pcp_input_ids__"
COUNT = "_vllm_npu_ext_placeholder_ids"  # on the runner: the ids it set to 0 so far


def placeholder_ids_set(runner) -> int:
    """How many placeholder ids the patch set to 0 in `runner` (for probes and logs)."""
    return getattr(runner, COUNT, 0)


def placeholders_to_zero(runner, num_tokens: int) -> int:
    """Set the runner's host input ids below 0 among the first `num_tokens` to 0, in a PCP
    runner with async scheduling; returns how many there were."""
    if getattr(runner, "pcp_size", 1) <= 1 or not getattr(runner, "use_async_scheduling", False):
        return 0
    ids = runner.input_ids.cpu[:num_tokens]
    negative = ids < 0
    count = int(negative.sum())
    if count:
        ids.masked_fill_(negative, 0)
        setattr(runner, COUNT, placeholder_ids_set(runner) + count)
    return count


def _wrap(original):
    @functools.wraps(original)
    def _prepare_input_ids(self, scheduler_output, num_reqs, total_num_scheduled_tokens,
                           cu_num_tokens):  # fmt: skip
        placeholders_to_zero(self, total_num_scheduled_tokens)
        return original(self, scheduler_output, num_reqs, total_num_scheduled_tokens,
                        cu_num_tokens)  # fmt: skip

    setattr(_prepare_input_ids, PATCHED_MARKER, original)
    return _prepare_input_ids


def patch_module(module: ModuleType) -> bool:
    """Wrap `NPUModelRunner._prepare_input_ids` in `module`; refuse (logged) on unpinned code."""
    runner = getattr(module, RUNNER_CLASS, None)
    if runner is None:
        get_logger(__name__).warning(
            "vllm-npu-ext: PCP input-ids patch not applied: %s.%s does not exist",
            module.__name__, RUNNER_CLASS,
        )  # fmt: skip
        return False
    current = getattr(runner, METHOD)
    if hasattr(current, PATCHED_MARKER):
        return True
    if patches.refusals(NAME):
        return False
    # vllm-ascend inherits vLLM's method: the wrapper goes on its class, vLLM's stays as is.
    setattr(runner, METHOD, _wrap(current))
    get_logger(__name__).info(
        "vllm-npu-ext: %s.%s.%s: async scheduling's -1 placeholders -> token 0 for PCP padding",
        module.__name__, RUNNER_CLASS, METHOD,
    )  # fmt: skip
    return True


def unpatch_module(module: ModuleType) -> None:
    runner = getattr(module, RUNNER_CLASS, None)
    method = runner.__dict__.get(METHOD) if runner is not None else None
    if method is not None and hasattr(method, PATCHED_MARKER):
        original = getattr(method, PATCHED_MARKER)
        if getattr(original, "__qualname__", "").startswith(f"{RUNNER_CLASS}."):
            setattr(runner, METHOD, original)
        else:
            delattr(runner, METHOD)


class PatchOnImport(on_import.PatchOnImport):
    """Patches vllm-ascend's runner module when vllm-ascend imports it."""

    def __init__(self):
        super().__init__({RUNNER_MODULE: patch_module})


def install() -> list[str]:
    """Arrange the patch for when vllm-ascend's runner is imported; returns what was arranged."""
    import importlib.util

    if importlib.util.find_spec("vllm_ascend") is None:
        return []
    on_import.install(PatchOnImport())
    return [f"vllm-ascend PCP runner: -1 placeholder ids -> 0 for padding (on import of "
            f"{RUNNER_MODULE})"]  # fmt: skip


def uninstall() -> None:
    on_import.uninstall(PatchOnImport)
    if RUNNER_MODULE in sys.modules:
        unpatch_module(sys.modules[RUNNER_MODULE])
