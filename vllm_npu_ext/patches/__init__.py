"""Every change this package makes to another package's state, in one table.

`PATCHES` below is that table, in the form of vllm-ascend's `vllm_ascend/patch/__init__.py`:
for each patch the module that holds it, its target, why, how, the switch that turns it off,
when it applies, and when to remove it. `apply(name)` is the one way a patch is applied: it
checks the switch and the source pins, then calls the patch's install function; nothing else
installs a patch. Each patch module says in its docstring what it replaces in detail.

Pins (`pins.py`): for every vLLM or vllm-ascend function a patch replaces, wraps or relies on,
the sha256 of its source on each version it was verified on. A source that matches none is
not patched (fail closed): a warning names the function and what to do, and
`vllm-npu-ext doctor` reports it and exits 1. VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES accepts a new
source knowingly. Patches whose target is imported later check their pins themselves when
they patch (`verified_by_patch`); `apply` checks the others before installing.

The table imports nothing: `register()` and the platform plugin read it in every process.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping

from vllm_npu_ext import envs
from vllm_npu_ext.patches import pins

# When a patch applies: the caller of `apply` for it.
PLATFORM_PLUGIN = "platform plugin and register(), before the platform resolves"
MODEL_CLASSES = "register(), with our model classes"
REGISTER = "register()"
GRAPH_CONFIG = "vLLM's config of a cache-free pooling run, by our graph-mode hook"
MODEL_BUILD = "when our cache-free model is built"

VLLM_0_23 = "vLLM 0.23.0"
VLLM_0_32 = "vLLM 0.32.0"
VLLM_ASCEND_0_23 = "vllm-ascend 0.23.0.post1"
_REGISTRY = "vllm.model_executor.models.registry:_ModelRegistry"
_CP_PACKAGE = "vllm_ascend.attention.context_parallel"
_COMMON_CP = f"{_CP_PACKAGE}.common_cp"
_ATTENTION_CP = f"{_CP_PACKAGE}.attention_cp"
_RUNNER = "vllm_ascend.worker.model_runner_v1"
_VLLM_RUNNER = "vllm.v1.worker.gpu_model_runner"


@dataclasses.dataclass(frozen=True)
class Patch:
    """One row of the table. `install` is "module:function" (imported only when applied)."""

    name: str
    target: str
    why: str
    how: str
    switch: envs.Flag | None
    when: str
    remove_when: str
    install: str
    pins: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    verified_by_patch: bool = False
    uninstall: str | None = None
    needs: str | None = None  # the package without which it never applies (pins then absent)


PATCHES: dict[str, Patch] = {patch.name: patch for patch in (
    Patch(
        name="torch_npu_stand_in",
        target="sys.modules['torch_npu'], torch.npu, torch.distributed's hccl backend",
        why="run the NPU path, and vllm-ascend's own code, on a CPU (tests, CI, selfcheck)",
        how="vllm_npu_ext.emulator.install_stand_in: the emulated torch_npu, before anything "
            "imports the real one",
        switch=envs.EMULATE,
        when=PLATFORM_PLUGIN,
        remove_when="never: a test device, off unless VLLM_NPU_EXT_EMULATE=1",
        install="vllm_npu_ext.emulator:install_stand_in",
    ),
    Patch(
        name="vllm_environment",
        target="vllm.envs.environment_variables",
        why="vLLM warns about every VLLM_* variable it does not know, ours included",
        how="a getter for each of our variables, where vLLM has none (vllm_environment.py)",
        switch=None,
        when=REGISTER,
        remove_when="vLLM gives plugins a way to declare their variables (none in 0.32)",
        install="vllm_npu_ext.patches.vllm_environment:declare",
    ),
    Patch(
        name="vllm_task_flag",
        target="vllm.utils.argparse_utils:FlexibleArgumentParser.parse_args",
        why="vLLM removed `--task`; `vllm serve MODEL --task embed` (vllm-ascend's older "
            "tutorials) stops at 'unrecognized arguments'",
        how="wrap parse_args to read `--task X` on server command lines as the --runner/"
            "--convert flags vLLM 0.10 read it as, with a one-line notice (vllm_task_flag.py)",
        switch=envs.TASK_FLAG_PATCH,
        when=REGISTER,
        remove_when="users no longer pass --task",
        install="vllm_npu_ext.patches.vllm_task_flag:install",
        uninstall="vllm_npu_ext.patches.vllm_task_flag:uninstall",
        pins={
            "vllm.utils.argparse_utils:FlexibleArgumentParser.parse_args": {
                VLLM_0_23: "f654045a66b805b5a3a013fb6262df0ac19d917364a047cc0844914f7fb038be",
                VLLM_0_32: "c0317c008f2cdf152d9f9b2c0f2f3e2e90a9cbafde15185165434b3d65b05ce0",
            },
        },
    ),
    Patch(
        name="vllm_model_registry",
        target=f"{_REGISTRY}.resolve_model_cls and .inspect_model_cls",
        why="Qwen3 pooling runs get our classes while generation keeps vLLM's own Qwen3",
        how="register our classes under names of their own and wrap both methods to "
            "substitute those names for pooling runs (vllm_model_registry.py)",
        switch=envs.MODEL_OVERRIDE,
        when=MODEL_CLASSES,
        remove_when="vLLM lets a plugin register a class for one runner only",
        install="vllm_npu_ext.patches.vllm_model_registry:install_ours",
        uninstall="vllm_npu_ext.patches.vllm_model_registry:uninstall",
        pins={
            f"{_REGISTRY}.resolve_model_cls": {
                VLLM_0_23: "d16237985322c5226da4d6df4c19c8737f565920a3978bbd0f21b794cff33974",
                VLLM_0_32: "d16237985322c5226da4d6df4c19c8737f565920a3978bbd0f21b794cff33974",
            },
            f"{_REGISTRY}.inspect_model_cls": {
                VLLM_0_23: "5bdf403809229830a9e493d1f1ea0b8a9e4f0dd8afa6d5c5e104891c886cae2f",
                VLLM_0_32: "0ed899fca7f795888a52c382baea8f1052b37b78e419bc19d87a9916ba48d11d",
            },
        },
    ),
    Patch(
        name="vllm_config_hooks",
        target="vllm.model_executor.models.config.MODELS_CONFIG_MAP['Qwen3ForCausalLM'] and "
               "['Qwen3ForSequenceClassification']",
        why="cache-free pooling needs graph modes that update or split around its attention",
        how="our graph-mode hooks (models/qwen3_config.py) take the entries, calling the "
            "entry they replaced first (vllm_config_hooks.py)",
        switch=envs.MODEL_OVERRIDE,
        when=MODEL_CLASSES,
        remove_when="vLLM lets a model class adjust the compilation config itself",
        install="vllm_npu_ext.model_executor.models.qwen3_config:install",
        pins={
            "vllm.model_executor.models.config:Qwen3ForSequenceClassificationConfig"
            ".verify_and_update_model_config": {
                VLLM_0_23: "ae1e17013de31f50f571ac7b601d9582ad791672638db1ee8c6508bbb677a01b",
                VLLM_0_32: "ae1e17013de31f50f571ac7b601d9582ad791672638db1ee8c6508bbb677a01b",
            },
        },
    ),
    Patch(
        name="vllm_splitting_ops",
        target="vllm.config.compilation.CompilationConfig._attention_ops",
        why="piecewise graphs must split at our cache-free attention op where attention "
            "cannot be captured (vLLM copies this list when splitting_ops is unset)",
        how="add or remove our op in the class-level default list (vllm_splitting_ops.py)",
        switch=None,
        when=GRAPH_CONFIG,
        remove_when="vLLM lets a model declare its splitting ops",
        install="vllm_npu_ext.patches.vllm_splitting_ops:add",
        uninstall="vllm_npu_ext.patches.vllm_splitting_ops:remove",
    ),
    Patch(
        name="vllm_ascend_cp",
        target=f"{_COMMON_CP}._process_attn_out_lse, ._npu_attention_update and "
               "._npu_attn_out_lse_update, as attention_cp and mla_cp import them; attention_cp's "
               "AscendAttentionCPMetadataBuilder.build and "
               "AscendAttentionCPImpl._compute_prefill_context (wrapped)",
        why="vllm-ascend merges CP attention results (decode, and prefill's PCP halves and "
            "context chunks) through torch_npu's TensorList AttentionUpdate and a permute copy",
        how="an import hook (on_import.py, first on sys.meta_path) replaces the three functions "
            "in the caller modules with the methods of one CPMerge when vllm-ascend imports them, "
            "i.e. in CP workers only, unless a pin differs or speculative decoding is on; the "
            "merge kernel is chosen once, then; the builder's build also writes the step's "
            "empty-shard masks for full decode graphs, and a context chunk's rows of a request "
            "without context on the rank are sent as 0 / -inf (patches/vllm_ascend_cp/)",
        switch=envs.CP_PATCH,
        when=REGISTER,
        remove_when="vllm-ascend merges CP results from tensors with one operator call",
        install="vllm_npu_ext.patches.vllm_ascend_cp:install",
        uninstall="vllm_npu_ext.patches.vllm_ascend_cp:uninstall",
        pins={
            # replaced
            f"{_COMMON_CP}:_process_attn_out_lse": {
                VLLM_ASCEND_0_23:
                    "873b0a6eed635df38fb642d8a10aa207c473c87e583bfa6600dbcf13b4c624f3",
            },
            f"{_COMMON_CP}:_npu_attention_update": {
                VLLM_ASCEND_0_23:
                    "79f9062b94f4f60ba6e75f143d421c22cea289a57de7313745aff5e516136cfb",
                # the same source: Python 3.10's ast.unparse writes this definition differently
                # (3.11 to 3.13 agree with the pin above; every other pin hashes alike on 3.10)
                f"{VLLM_ASCEND_0_23} on Python 3.10":
                    "30fda3489497474f1233e270f236c40b946ac591ebb8e044a5c28fcd1521ef6a",
            },
            f"{_COMMON_CP}:_npu_attn_out_lse_update": {
                VLLM_ASCEND_0_23:
                    "33ae9fd36b983b245f7983d0a0b6ee8d78c5ca8d91ad2e8a0ff43bbb256b5f7a",
            },
            # wrapped
            f"{_ATTENTION_CP}:AscendAttentionCPMetadataBuilder.build": {
                VLLM_ASCEND_0_23:
                    "4aeb3f13a2f9558833be8b9a8e468df7c5e65784b9e1c7797c0e5a96189b6f66",
            },
            f"{_ATTENTION_CP}:AscendAttentionCPImpl._compute_prefill_context": {
                VLLM_ASCEND_0_23:
                    "f8acec23073d50cfc99064d7369293ce0e8d9fcf6237ec13d8eb349fd4ffe07c",
            },
            # relied on: the decode pair's caller and the lengths its graphs are updated with
            # (rows past a step's requests get 0 keys), the prefill merges' callers and
            # vllm-ascend's merge of context chunks (reads every shard's out), the per-rank key
            # counts, and the runner building metadata inside vLLM's input-prep sync (the
            # graph masks' pinned host buffer is rewritten only after it)
            f"{_ATTENTION_CP}:AscendAttentionCPImpl._forward_decode_pcp_dcp": {
                VLLM_ASCEND_0_23:
                    "01afb762132226feb7346d542e770736c69dd8f3da805923a4d06407fb0f71fc",
            },
            f"{_ATTENTION_CP}:AscendAttentionCPImpl.update_graph_params": {
                VLLM_ASCEND_0_23:
                    "af415deb0045c15c566897c24d4eee1bf9dd5cd3bdee0aaaf47f0c5684cd87f2",
            },
            f"{_ATTENTION_CP}:AscendAttentionCPImpl._attention_with_nomask_and_mask": {
                VLLM_ASCEND_0_23:
                    "43f84cd08513c890694b79330e4f5975b33333fc7d4ce532c509fec1791461de",
            },
            f"{_ATTENTION_CP}:AscendAttentionCPImpl"
            "._update_chunk_attn_out_lse_with_current_attn_out_lse": {
                VLLM_ASCEND_0_23:
                    "b2bd50ba1d0fc7cf1c63c556388f762b8f254622702b297591180cd2f273e553",
            },
            f"{_COMMON_CP}:_update_out_and_lse": {
                VLLM_ASCEND_0_23:
                    "13f0a7475bcc5cde98b9da2e43fe7a844da6991cbc6ac6092da843349e710d56",
            },
            "vllm_ascend.worker.pcp_utils:PCPManager._get_cp_local_seq_lens": {
                VLLM_ASCEND_0_23:
                    "3d1d32045585e8f7ba7e50d241babbd36ae1f300493d81976d3a9a8b31b55a23",
            },
            f"{_RUNNER}:NPUModelRunner.execute_model": {
                VLLM_ASCEND_0_23:
                    "fa0656faa28bb784d6f5c0430423702460dd126308a68fc5a21fb1568c36eaae",
            },
            f"{_VLLM_RUNNER}:GPUModelRunner.synchronize_input_prep": {
                VLLM_0_23: "2ecbf3041d2afd141bce64b68d2ba99bfa6ad78d9996a320fcc35278798f300d",
            },
        },
        verified_by_patch=True,
        needs="vllm_ascend",
    ),
    Patch(
        name="vllm_ascend_pcp_input_ids",
        target=f"{_RUNNER}:NPUModelRunner._prepare_input_ids (vLLM's, inherited)",
        why="with PCP and async scheduling, vllm-ascend's runner reads the -1 placeholders a "
            "finished request left in its input-batch row as the ids of its padding tokens, "
            "an out-of-range embedding index at TP 1",
        how="an import hook wraps the method on NPUModelRunner to set host ids below 0 to 0 "
            "before vLLM's runs (vllm_ascend_pcp_input_ids.py)",
        switch=envs.PCP_INPUT_IDS_PATCH,
        when=REGISTER,
        remove_when="vllm-ascend pads PCP requests without reading stale token ids",
        install="vllm_npu_ext.patches.vllm_ascend_pcp_input_ids:install",
        uninstall="vllm_npu_ext.patches.vllm_ascend_pcp_input_ids:uninstall",
        pins={
            # wrapped: vLLM's, as vllm-ascend 0.23.0.post1 inherits it (it requires vLLM 0.23.0)
            f"{_VLLM_RUNNER}:GPUModelRunner._prepare_input_ids": {
                VLLM_0_23: "3e82070358cc7b8e590f926b2cd30e76ab762d3a510fe620f97730e41a6fd736",
            },
            # relied on: the PCP padding that reads the row, and the -1 placeholders' writer
            f"{_RUNNER}:NPUModelRunner._prepare_inputs": {
                VLLM_ASCEND_0_23:
                    "a8de723991b39442a95a80414edd76f0a33b3e91f07764607ac0346efba8d41e",
            },
            f"{_RUNNER}:NPUModelRunner._bookkeeping_sync": {
                VLLM_ASCEND_0_23:
                    "2342b4687aa94008cc852f250e3e365040aefc94b89747bbecbef76d09fca173",
            },
        },
        verified_by_patch=True,
        needs="vllm_ascend",
    ),
    Patch(
        name="vllm_ascend_cos_sin",
        target="vllm_ascend.ops.rotary_embedding._cos_sin_cache",
        why="vllm-ascend's runner refreshes cos/sin tables every step for readers our "
            "cache-free model does not have",
        how="clear the recorded cache, so update_cos_sin returns at its first check "
            "(vllm_ascend_cos_sin.py)",
        switch=envs.COS_SIN_PATCH,
        when=MODEL_BUILD,
        remove_when="vllm-ascend updates the tables only for models that read them",
        install="vllm_npu_ext.patches.vllm_ascend_cos_sin:stop",
        pins={
            "vllm_ascend.ops.rotary_embedding:update_cos_sin": {
                VLLM_ASCEND_0_23:
                    "f74997a21693552d4fac815a92ea6eed6a8647b3a828fd9a25c35e72040e0022",
            },
        },
        verified_by_patch=True,
    ),
    Patch(
        name="vllm_shared_prefix",
        target="vllm.v1.worker.gpu_model_runner:GPUModelRunner._model_forward and "
               "vllm_ascend.worker.model_runner_v1:NPUModelRunner._model_forward (wrapped)",
        why="the texts of one step often start with the same tokens (an instruction, a "
            "reranker's prompt and query); without a KV cache each computed them again, and "
            "the runner picks the graph from the step's whole token count",
        how="the runner's model call plans the step from its host token ids, gathers the "
            "unique rows into its buffers, runs the model on them under the graph of their "
            "count and maps every row's hidden state back (vllm_shared_prefix.py)",
        switch=envs.SHARED_PREFIX,
        when=MODEL_BUILD,
        remove_when="vLLM shares token prefixes within a step without a KV cache",
        install="vllm_npu_ext.patches.vllm_shared_prefix:install",
        uninstall="vllm_npu_ext.patches.vllm_shared_prefix:uninstall",
        pins={
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner._model_forward": {
                VLLM_0_23: "a26bbe6b69012df06c6c87d1ef0aabfc6be76df972d727e4163d11ef0864a3fc",
                VLLM_0_32: "210f925be2caf22951df549d3cf82c02d3a0cc9704f05b4deb154e973012ede9",
            },
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs": {
                VLLM_0_23: "81cee5954d3ef6facd8c611b7e30a2ed9a109ea8a373b0cdfc3651dfeb5cdf8f",
                VLLM_0_32: "bcd9157e2e44374c09cef08ef80099a796f78d34e114dc02f7d54e5e75cea511",
            },
            "vllm.compilation.cuda_graph:CUDAGraphWrapper.__call__": {
                VLLM_0_23: "525fb0efc944c3f7781989f53e84c04e5e5c787521a5d12d983befb41bc191b7",
                VLLM_0_32: "0c1307aecca2880cd1c35e3262d043931cedba786805a6a0c2f36d2bbc604275",
            },
            "vllm_ascend.worker.model_runner_v1:NPUModelRunner._model_forward": {
                VLLM_ASCEND_0_23:
                    "678a3ef566b5c55a54528cb7c709619de66333f7dbdbbc6c5c76268e6fcedddc",
            },
            "vllm_ascend.worker.model_runner_v1:NPUModelRunner._prepare_inputs": {
                VLLM_ASCEND_0_23:
                    "a8de723991b39442a95a80414edd76f0a33b3e91f07764607ac0346efba8d41e",
            },
            "vllm_ascend.compilation.acl_graph:ACLGraphWrapper.__call__": {
                VLLM_ASCEND_0_23:
                    "b81dfe4ba49ce2a6ecfddb2f37de7b2be8de9e45f26be4744a76375829c1344d",
            },
        },
        verified_by_patch=True,
    ),
)}  # fmt: skip


def _function(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def refusals(name: str, lookup=None, targets=None) -> list[pins.Check]:
    """The pins of patch `name` (those of `targets` only, when given) that stop it, each
    logged once with what to do."""
    pinned = PATCHES[name].pins
    if targets is not None:
        pinned = {target: pinned[target] for target in targets}
    checks = pins.check_all(name, pinned, lookup, PATCHES[name].needs)
    refused = [check for check in checks if not check.applicable]
    if refused:
        from vllm_npu_ext.logger import get_logger

        for check in refused:
            get_logger(__name__).warning("vllm-npu-ext: %s", check.message())
    return refused


def apply(name: str, *args) -> list[str]:
    """Apply patch `name` (its install function with `args`) unless its switch is off or a pin
    refuses it; returns the lines the patch reports."""
    patch = PATCHES[name]
    if patch.switch is not None and not patch.switch():
        return []
    if not patch.verified_by_patch and refusals(name):
        return []
    result = _function(patch.install)(*args)
    if isinstance(result, str):
        return [result]
    return list(result) if isinstance(result, list | tuple) else []


def revert(name: str, *args) -> None:
    """Undo patch `name` (its uninstall function with `args`)."""
    uninstall = PATCHES[name].uninstall
    if uninstall is None:
        raise ValueError(f"patch {name} cannot be undone")
    _function(uninstall)(*args)


def apply_patches(when: str = REGISTER) -> list[str]:
    """Apply every patch that applies at `when`; returns one line per patch applied."""
    return [line for patch in PATCHES.values() if patch.when == when
            for line in apply(patch.name)]  # fmt: skip


def pin_checks() -> list[pins.Check]:
    """Every pin of the table checked against what is installed here (for the doctor)."""
    return [check for name, patch in PATCHES.items()
            for check in pins.check_all(name, patch.pins, needs=patch.needs)]  # fmt: skip


def describe() -> str:
    """The table as text, in vllm-ascend's patch-table layout."""
    blocks = []
    for number, patch in enumerate(PATCHES.values(), start=1):
        switch = patch.switch.name if patch.switch else "none"
        pinned = ", ".join(sorted({v for versions in patch.pins.values() for v in versions}))
        blocks.append(
            f"{number}. `{patch.target}` ({patch.name}: {patch.install})\n"
            f"   Why: {patch.why}\n   How: {patch.how}\n   Switch: {switch}\n"
            f"   When: {patch.when}\n   Pinned on: {pinned or 'nothing replaced'}\n"
            f"   Remove when: {patch.remove_when}"
        )
    return "\n".join(blocks)
