"""Applying the CP patch to vllm-ascend's modules, and undoing it.

When vllm-ascend imports a caller module (`attention_cp`, `mla_cp`; workers with DCP or PCP > 1
only), `patch` verifies it and replaces the merges in it with the bound methods of the
process's `CPMerge`:

- the names it imported from `common_cp`: the decode pair `_process_attn_out_lse` /
  `_npu_attention_update` (both modules) and the prefill merge `_npu_attn_out_lse_update`
  (`attention_cp`), each with the parameters it is called with;
- wrapped methods of `attention_cp`'s classes: the CP builder's `build` (then the step's graph
  masks are written) and `_compute_prefill_context` (then a context chunk's rows of a request
  without context here go out as 0 / -inf).

Verified first, fail closed: every pin of the patch that concerns the module (what it replaces,
wraps, and relies on: `patches/__init__.py`) must match, and speculative decoding must be off
(vllm-ascend 0.23.0.post1 rewrites the per-rank key counts of a draft step after `build`,
`PCPManager.update_spec_decode_drafting_cp_metadata`, so masks written at `build` would be
stale). Otherwise a warning says why and the module is left as vllm-ascend wrote it.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

from vllm_npu_ext import patches
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.patches.vllm_ascend_cp import masks
from vllm_npu_ext.patches.vllm_ascend_cp.kernel import KernelChoice
from vllm_npu_ext.patches.vllm_ascend_cp.merge import CPMerge

logger = get_logger(__name__)

NAME = "vllm_ascend_cp"  # its row in the patch table
PACKAGE = "vllm_ascend.attention.context_parallel"
COMMON_MODULE = f"{PACKAGE}.common_cp"
ATTENTION_CP = f"{PACKAGE}.attention_cp"
CALLER_MODULES = (ATTENTION_CP, f"{PACKAGE}.mla_cp")
# name -> parameters of vllm-ascend's function, replaced where a caller module imported it;
# the decode pair is replaced as a pair, never one alone.
TARGET_SIGNATURES = {
    "_process_attn_out_lse": ("attn_output", "softmax_lse"),
    "_npu_attention_update": ("head_size", "attn_out_lse"),
    "_npu_attn_out_lse_update": ("attn_lse_mask", "attn_lse_nomask", "attn_out_mask",
                                 "attn_out_nomask"),
}  # fmt: skip
PAIR = ("_process_attn_out_lse", "_npu_attention_update")
REPLACEMENTS = {"_process_attn_out_lse": "process_attn_out_lse",
                "_npu_attention_update": "npu_attention_update",
                "_npu_attn_out_lse_update": "npu_attn_out_lse_update"}  # fmt: skip
# (class, method) -> the CPMerge method that wraps it
WRAPPED = {("AscendAttentionCPMetadataBuilder", "build"): "refresh_after",
           ("AscendAttentionCPImpl", "_compute_prefill_context"): "mask_empty_context"}  # fmt: skip
ORIGINALS = "__vllm_npu_ext_cp_originals__"


def target_problem(module: ModuleType) -> str | None:
    """Why `module` cannot be patched (a missing or changed target), or None."""
    for name in _replaced_in(module):
        params = tuple(inspect.signature(getattr(module, name)).parameters)
        if params != TARGET_SIGNATURES[name]:
            return f"{module.__name__}.{name}{params} no longer takes {TARGET_SIGNATURES[name]}"
    missing = [name for name in PAIR if not callable(getattr(module, name, None))]
    return f"{module.__name__}.{missing[0]} does not exist" if missing else None


def _replaced_in(module: ModuleType) -> list[str]:
    """The functions of `TARGET_SIGNATURES` that `module` holds (the pair in both callers)."""
    return [name for name in TARGET_SIGNATURES if callable(getattr(module, name, None))]


def speculative_decoding(config) -> bool:
    return config is not None and getattr(config, "speculative_config", None) is not None


def held_by(module: ModuleType, target: str) -> bool:
    """Whether `module` holds the object a pin names: its own definitions, and `common_cp`'s
    functions it imported."""
    module_name, _, qualname = target.partition(":")
    return module_name == module.__name__ or (
        module_name == COMMON_MODULE and hasattr(module, qualname.split(".")[0])
    )


def pinned_object(module: ModuleType, target: str):
    """The object a pin names, as `module` holds it (`held_by`)."""
    owner = module
    for part in target.partition(":")[2].split("."):
        owner = getattr(owner, part)
    return owner


def refusal(module: ModuleType, config) -> str | None:
    """Why the patch must leave `module` alone, or None (pins are logged by `refusals`). Pins
    of what the module holds are read from it; the others (vLLM's, vllm-ascend's runner's)
    from their modules as imported, or their files."""
    problem = target_problem(module)
    if problem is not None:
        return problem
    if speculative_decoding(config):
        return ("speculative decoding is on: vllm-ascend rewrites the per-rank key counts of "
                "draft steps after the CP builder's build, which the empty-shard masks read")
    pinned = patches.PATCHES[NAME].pins
    others = {name for name in CALLER_MODULES if name != module.__name__}
    held = [target for target in pinned if held_by(module, target)]
    elsewhere = [target for target in pinned if target not in held
                 and target.partition(":")[0] not in others]  # fmt: skip
    if patches.refusals(NAME, lambda target: pinned_object(module, target), held) or (
        patches.refusals(NAME, None, elsewhere)
    ):
        return "a function it replaces or relies on is not one it was verified on"
    return None


def patch(merge: CPMerge, module: ModuleType) -> bool:
    """Replace the merges in one caller module with `merge`'s; leave it alone (warning) where
    `refusal` says so."""
    if getattr(module, ORIGINALS, None) is not None:
        return True
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    problem = refusal(module, config)
    if problem is not None:
        from vllm_npu_ext.logger import get_logger as refusal_logger  # as the pins' refusals

        refusal_logger(__name__).warning(
            "vllm-npu-ext: CP merge patch not applied, %s left as vllm-ascend wrote it: %s",
            module.__name__, problem,
        )  # fmt: skip
        return False
    settle(merge, config)
    originals = {name: getattr(module, name) for name in _replaced_in(module)}
    for name in originals:
        setattr(module, name, getattr(merge, REPLACEMENTS[name]))
    for (class_name, method), wrapper in WRAPPED.items():
        owner = getattr(module, class_name, None)
        if owner is not None and method in vars(owner):
            original = vars(owner)[method]
            originals[f"{class_name}.{method}"] = original
            setattr(owner, method, functools.wraps(original)(getattr(merge, wrapper)(original)))
    setattr(module, ORIGINALS, originals)
    logger.info("vllm-npu-ext: %s CP merges (%s) -> vllm_npu_ext.attention_update",
                module.__name__, ", ".join(originals))  # fmt: skip
    merge.kernel.register_graph_converter()
    return True


def settle(merge: CPMerge, config) -> None:
    """At the first module patched: the kernel, whether graphs need masks, their rows."""
    if merge.kernel is not None:
        return
    merge.kernel = KernelChoice.from_env()
    merge.shards_can_be_empty = masks.decode_shards_can_be_empty(config)
    if config is not None:
        merge.graph_rows = max(config.compilation_config.cudagraph_capture_sizes or [0])
        logger.info(
            "vllm-npu-ext: CP decode graphs %s empty-shard masks (a decode step %s leave a "
            "rank without keys at this CP size and cp_kv_cache_interleave_size)",
            "carry" if merge.shards_can_be_empty else "need no",
            "can" if merge.shards_can_be_empty else "cannot",
        )  # fmt: skip


def patched(module: ModuleType) -> bool:
    """Whether `module` holds the patch's merges now."""
    return getattr(module, ORIGINALS, None) is not None


def unpatch(module: ModuleType) -> None:
    """Restore vllm-ascend's functions and methods in a patched module."""
    originals = getattr(module, ORIGINALS, None) or {}
    for name, original in originals.items():
        class_name, _, method = name.rpartition(".")
        setattr(getattr(module, class_name) if class_name else module, method or name, original)
    if hasattr(module, ORIGINALS):
        delattr(module, ORIGINALS)
