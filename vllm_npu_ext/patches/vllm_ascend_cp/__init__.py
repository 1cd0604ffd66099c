"""Patch: every AttentionUpdate merge of vllm-ascend 0.23's context parallelism -> our
tensor-input operator (`torch.ops.vllm_npu_ext.attention_update`).

What it replaces. vllm-ascend's CP attention (`attention/context_parallel/attention_cp.py`,
and `mla_cp.py` for MLA) merges partial results with torch_npu's TensorList
`npu_attention_update`, through `common_cp`'s functions:

    decode:  _process_attn_out_lse(attn_out, attn_lse)   # cat, permute+copy, all_to_all
                                                         # [dcp*H, D+1, bs], PCP all-gather
             _npu_attention_update(head_size, attn_out_lse)  # permute+copy, split, unbind
    prefill: _npu_attn_out_lse_update(lse_mask, lse_nomask, out_mask, out_nomask)
             # PCP's two halves, and a chunk with its context: casts, a list of two

They are replaced in the caller modules by the bound methods of one `CPMerge` (`merge.py`):
decode results are written once into a send buffer, exchanged and merged from strided views
of it (`ops.cp_merge`); prefill partials are merged by the same operator. A rank that holds no
key of a request sends it as out 0, lse -inf, whatever FIA wrote for it (`masks.py`), also
inside vllm-ascend's full decode graphs (device masks written before each replay) and in a
prefill chunk's context.

When it applies. vLLM 0.23 loads general plugins before a worker knows its config, and
vllm-ascend imports `attention_cp`/`mla_cp` only when DCP or PCP > 1, in workers, while the
model is built. So `install()` creates the process's `CPMerge` and an import hook (cheap,
imports nothing); the patch is applied when vllm-ascend imports a caller module, after the
checks of `patching.py` (pins of what it replaces and relies on, no speculative decoding).
`uninstall()` restores every patched module and drops the hook and its state.
`VLLM_NPU_EXT_CP_PATCH=0` turns it off; the merge kernel (`kernel.py`) is read once.
`scripts/check_vllm_ascend_patch.py` checks the targets against vllm-ascend's sdist.
"""

from __future__ import annotations

import importlib.util
import sys

from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.patches import on_import
from vllm_npu_ext.patches.vllm_ascend_cp import patching
from vllm_npu_ext.patches.vllm_ascend_cp.merge import CPMerge

NAME = patching.NAME
TESTED_VERSION = "0.23.0.post1"
CALLER_MODULES = patching.CALLER_MODULES


class PatchOnImport(on_import.PatchOnImport):
    """Patches vllm-ascend's CP caller modules with `merge` when vllm-ascend imports them."""

    def __init__(self, merge: CPMerge):
        self.merge = merge
        super().__init__(dict.fromkeys(CALLER_MODULES, self.patch))

    def patch(self, module) -> bool:
        return patching.patch(self.merge, module)


def active() -> CPMerge | None:
    """This process's patch state (installed by `install`), or None."""
    finder = next((f for f in sys.meta_path if type(f) is PatchOnImport), None)
    return None if finder is None else finder.merge


def _vllm_ascend_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-ascend")
    except PackageNotFoundError:
        return "unknown"


def install() -> list[str]:
    """Arrange for the patch (see the module docstring); returns what was arranged."""
    if importlib.util.find_spec("vllm_ascend") is None:
        return []
    version = _vllm_ascend_version()
    if version != TESTED_VERSION:
        get_logger(__name__).warning(
            "vllm-npu-ext: CP merge patch written for vllm-ascend %s, found %s; targets are "
            "still verified before patching", TESTED_VERSION, version,
        )  # fmt: skip
    if active() is None:
        on_import.install(PatchOnImport(CPMerge()))
    return [f"vllm-ascend {version} CP merges -> attention_update (on import of "
            "attention_cp/mla_cp, i.e. when DCP or PCP > 1)"]  # fmt: skip


def uninstall() -> None:
    """Restore every patched module, remove the import hook and with it the patch's state."""
    on_import.uninstall(PatchOnImport)
    for name in CALLER_MODULES:
        if name in sys.modules:
            patching.unpatch(sys.modules[name])
