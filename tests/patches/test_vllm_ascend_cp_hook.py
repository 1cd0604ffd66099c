"""Where and when the CP patch applies, and when it refuses: its import hook on a minimal fake
vllm_ascend holding every function the patch pins, and the sdist check script.

The fake's functions are not vllm-ascend's: their hashes are accepted knowingly
(VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES), as a user who checked a new source would; a test that
leaves one out sees the patch refuse.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from support.scripts import load_script
from support.vllm_ascend_sdist import find_or_download_sdist

from vllm_npu_ext import envs, patches
from vllm_npu_ext.patches import apply, pins, vllm_ascend_cp
from vllm_npu_ext.patches.vllm_ascend_cp import merge as merge_module
from vllm_npu_ext.patches.vllm_ascend_cp import patching

check_script = load_script("scripts/check_vllm_ascend_patch.py")
PACKAGE = "vllm_ascend.attention.context_parallel"

COMMON_CP = """
def _process_attn_out_lse(attn_output, softmax_lse):
    return "original"


def _npu_attention_update({params}):
    return "original"


def _npu_attn_out_lse_update(attn_lse_mask, attn_lse_nomask, attn_out_mask, attn_out_nomask):
    return "original"


def _update_out_and_lse(out_list, lse_list):
    return "original"
"""
CALLER = """
from vllm_ascend.attention.context_parallel.common_cp import (
    _npu_attention_update,
    _process_attn_out_lse,{prefill}
)


def forward_decode(attn_out, attn_lse, head_size):
    attn_out_lse = _process_attn_out_lse(attn_out, attn_lse)
    return _npu_attention_update(head_size, attn_out_lse)
"""
CLASSES = """

class AscendAttentionCPMetadataBuilder:
    def build(self, common_prefix_len, common_attn_metadata):
        return common_attn_metadata


class AscendAttentionCPImpl:
    def _compute_prefill_context(self, query, kv_cache, attn_metadata):
        return "original"

    def _forward_decode_pcp_dcp(self, query, attn_metadata):
        return None

    def update_graph_params(self):
        return None

    def _attention_with_nomask_and_mask(self):
        return _npu_attn_out_lse_update(1, 2, 3, 4)

    def _update_chunk_attn_out_lse_with_current_attn_out_lse(self):
        return None
"""
RUNNER_MODULES = {
    "vllm_ascend.worker.pcp_utils": "class PCPManager:\n    def _get_cp_local_seq_lens(self):"
                                    "\n        return {drift}\n",
    "vllm_ascend.worker.model_runner_v1": "class NPUModelRunner:\n    def execute_model(self):\n"
                                          "        return None\n",
}  # fmt: skip


def fake_sources(update_params="head_size, attn_out_lse", drift="None") -> dict[str, str]:
    attention_cp = textwrap.dedent(CALLER).format(
        prefill="\n    _npu_attn_out_lse_update,\n    _update_out_and_lse,") + CLASSES
    return {f"{PACKAGE}.common_cp": COMMON_CP.format(params=update_params),
            f"{PACKAGE}.attention_cp": attention_cp,
            f"{PACKAGE}.mla_cp": textwrap.dedent(CALLER).format(prefill=""),
            **{name: text.format(drift=drift) for name, text in RUNNER_MODULES.items()}}


def fake_hashes(sources: dict[str, str], leave_out: str = "") -> list[str]:
    """The fake's hash of every vllm-ascend function the patch pins (but `leave_out`)."""
    hashes = []
    for target in patches.PATCHES[patching.NAME].pins:
        module, _, qualname = target.partition(":")
        if module in sources and target != leave_out:
            hashes.append(pins.source_hash_in_module(sources[module], qualname))
    return hashes


def write_fake_vllm_ascend(root: Path, sources: dict[str, str]) -> None:
    for name, text in sources.items():
        path = root.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in {p.parent for p in root.rglob("*.py")}:
        while directory != root:
            (directory / "__init__.py").touch()
            directory = directory.parent


def _forget_vllm_ascend():
    for name in [m for m in sys.modules if m == "vllm_ascend" or m.startswith("vllm_ascend.")]:
        del sys.modules[name]


@pytest.fixture
def fake_vllm_ascend(tmp_path, monkeypatch):
    """A minimal importable vllm_ascend (write it with `install_fake`); the hook and every
    import are undone afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(envs.CP_PATCH.name, raising=False)
    monkeypatch.setenv(envs.PCP_INPUT_IDS_PATCH.name, "0")  # its own tests: the runner's hook

    def install_fake(sources=None, accepted=None):
        sources = sources or fake_sources()
        write_fake_vllm_ascend(tmp_path, sources)
        accepted = fake_hashes(sources) if accepted is None else accepted
        monkeypatch.setenv(envs.ACCEPT_PATCH_SOURCES.name, ",".join(accepted))
        importlib.invalidate_caches()
        return sources

    yield install_fake
    vllm_ascend_cp.uninstall()
    _forget_vllm_ascend()


def import_caller(name="attention_cp"):
    return importlib.import_module(f"{PACKAGE}.{name}")


def test_without_vllm_ascend_nothing_is_installed():
    assert importlib.util.find_spec("vllm_ascend") is None
    assert apply(patching.NAME) == []
    assert vllm_ascend_cp.active() is None


def test_install_adds_only_a_hook_and_its_state_and_imports_nothing(fake_vllm_ascend):
    fake_vllm_ascend()
    before = set(sys.modules)
    applied = apply(patching.NAME)
    assert len(applied) == 1 and "attention_update" in applied[0]
    new = set(sys.modules) - before
    assert not {m for m in new if m.startswith(("vllm_ascend", "torch_npu"))}
    state = vllm_ascend_cp.active()
    assert state is not None and state.kernel is None  # settled at the first patch
    apply(patching.NAME)  # idempotent: still one hook, the same state
    assert sum(isinstance(f, vllm_ascend_cp.PatchOnImport) for f in sys.meta_path) == 1
    assert vllm_ascend_cp.active() is state
    vllm_ascend_cp.uninstall()
    assert vllm_ascend_cp.active() is None  # the state goes with the hook


def test_importing_a_cp_caller_patches_every_merge_in_it(fake_vllm_ascend, monkeypatch):
    fake_vllm_ascend()
    apply(patching.NAME)
    attention_cp, mla_cp = import_caller("attention_cp"), import_caller("mla_cp")
    state = vllm_ascend_cp.active()
    assert patching.patched(attention_cp) and patching.patched(mla_cp)
    for name in patching.TARGET_SIGNATURES:  # bound methods of the one state
        assert getattr(attention_cp, name).__self__ is state
    assert mla_cp._npu_attention_update.__self__ is state
    assert not hasattr(mla_cp, "_npu_attn_out_lse_update")
    common_cp = sys.modules[patching.COMMON_MODULE]
    assert common_cp._npu_attention_update(1, None) == "original"  # the source is untouched
    for (owner, method) in patching.WRAPPED:  # wrapped where defined
        wrapped = getattr(getattr(attention_cp, owner), method)
        original = getattr(attention_cp, patching.ORIGINALS)[f"{owner}.{method}"]
        assert wrapped.__wrapped__ is original
    single = (SimpleNamespace(world_size=1, rank_in_group=0, device_group=None),) * 2
    monkeypatch.setattr(merge_module, "cp_group_coordinators", lambda: single)
    attn_out, attn_lse = torch.randn(3, 4, 64), torch.randn(3, 4, 1)
    torch.testing.assert_close(attention_cp.forward_decode(attn_out, attn_lse, 64), attn_out)


def test_a_caller_imported_before_install_is_patched_at_install_and_restored(fake_vllm_ascend):
    fake_vllm_ascend()
    attention_cp = import_caller()
    assert not patching.patched(attention_cp)
    apply(patching.NAME)
    assert patching.patched(attention_cp)
    vllm_ascend_cp.uninstall()
    assert attention_cp.forward_decode(None, None, 8) == "original"
    impl = attention_cp.AscendAttentionCPImpl
    assert impl()._compute_prefill_context(None, None, None) == "original"
    assert not hasattr(impl._compute_prefill_context, "__wrapped__")
    assert impl()._attention_with_nomask_and_mask() == "original"


def test_switch_off_leaves_vllm_ascend_alone(fake_vllm_ascend, monkeypatch):
    fake_vllm_ascend()
    monkeypatch.setenv(envs.CP_PATCH.name, "0")
    assert apply(patching.NAME) == []
    assert not patching.patched(import_caller())


def refused(refusal_log, module) -> list[str]:
    assert not patching.patched(module)
    assert module.forward_decode(None, None, 8) == "original"
    return [r.getMessage() for r in refusal_log.records if "not applied" in r.getMessage()]


def test_changed_target_is_left_alone_with_a_warning(fake_vllm_ascend, refusal_log):
    fake_vllm_ascend(fake_sources(update_params="head_dim, buffer"))
    apply(patching.NAME)
    messages = refused(refusal_log, import_caller())
    assert any("head_dim" in message for message in messages), messages


@pytest.mark.parametrize("target", [
    f"{PACKAGE}.common_cp:_process_attn_out_lse",  # replaced
    f"{PACKAGE}.attention_cp:AscendAttentionCPImpl._compute_prefill_context",  # wrapped
    f"{PACKAGE}.attention_cp:AscendAttentionCPImpl.update_graph_params",  # relied on
    "vllm_ascend.worker.pcp_utils:PCPManager._get_cp_local_seq_lens",  # relied on, elsewhere
])  # fmt: skip
def test_a_function_replaced_wrapped_or_relied_on_that_drifted_is_refused(
    fake_vllm_ascend, refusal_log, target
):
    """Fail closed: one pinned function whose source is not the one verified (nor accepted)
    keeps every merge vllm-ascend's; the warning names it and the variable to accept it."""
    sources = fake_vllm_ascend()
    fake_vllm_ascend(sources, accepted=fake_hashes(sources, leave_out=target))
    apply(patching.NAME)
    messages = refused(refusal_log, import_caller())
    assert any(target in m and envs.ACCEPT_PATCH_SOURCES.name in m for m in messages), messages


def test_speculative_decoding_is_refused_with_the_reason(fake_vllm_ascend, refusal_log,
                                                         monkeypatch):  # fmt: skip
    """vllm-ascend rewrites a draft step's per-rank key counts after `build`, where the graph
    masks are written: the patch does not apply under speculative decoding."""
    import vllm.config

    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=1))
    monkeypatch.setattr(vllm.config, "get_current_vllm_config_or_none", lambda: config)
    fake_vllm_ascend()
    apply(patching.NAME)
    messages = refused(refusal_log, import_caller())
    assert any("speculative decoding" in message for message in messages), messages


# --- the sdist check script ------------------------------------------------------------


@pytest.fixture(scope="module")
def sdist_sources() -> dict[str, str]:
    return check_script.read_sources(find_or_download_sdist())


def test_check_script_passes_on_the_sdist(capsys, sdist_sources):
    assert check_script.main([str(find_or_download_sdist())]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["ok"] and summary["failed"] == {} and summary["checks"] >= 5


CALLER_PATH = check_script.module_path(patching.ATTENTION_CP)
BACKEND_PATH = "vllm_ascend/attention/attention_v1.py"
COMMON_IMPORT = (
    "from vllm_ascend.attention.context_parallel.common_cp import AscendMetadataForDecode"
)
MUTATIONS = {
    "another module uses a target": (
        BACKEND_PATH, COMMON_IMPORT,
        COMMON_IMPORT.replace("AscendMetadataForDecode", "_npu_attn_out_lse_update")),
    "caller imported eagerly": (
        BACKEND_PATH, COMMON_IMPORT, f"import {patching.ATTENTION_CP}\n{COMMON_IMPORT}"),
    "pair broken": (
        CALLER_PATH, "attn_out = _npu_attention_update(self.head_size, attn_out_lse)",
        "attn_out = _npu_attention_update(self.head_size, attn_out)"),
    "a relied-on function changed": (
        CALLER_PATH, "def _forward_decode_pcp_dcp(self, query: torch.Tensor,",
        "def _forward_decode_pcp_dcp(self, query,"),
}  # fmt: skip


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_check_script_notices_changed_targets(sdist_sources, mutation):
    path, old, new = MUTATIONS[mutation]
    assert old in sdist_sources[path]
    changed = {**sdist_sources, path: sdist_sources[path].replace(old, new)}
    failed = [name for name, problem in check_script.run_checks(changed).items() if problem]
    assert failed
