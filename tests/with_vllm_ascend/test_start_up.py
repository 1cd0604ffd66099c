"""A vLLM process on vllm-ascend: its platform, both packages' plugins, the operator search
path after vllm-ascend's own `import_kernels()` / `enable_custom_op()` have run, and when its
CP modules load (and get our patch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.bootstrap_probe import lib_dir, make_vendor_dir
from support.vllm_ascend_env import subprocess_env, vllm_ascend_site

import vllm_npu_ext
from vllm_npu_ext import emulator


def test_the_platform_is_vllm_ascends_npu_platform(vllm_ascend_started):
    from vllm_ascend.platform import NPUPlatform

    assert type(vllm_ascend_started) is NPUPlatform
    assert vllm_ascend_started.device_type == "npu"
    assert sys.modules["torch_npu"] is emulator


def test_both_packages_general_plugins_ran_in_this_process(vllm_ascend_started):
    import vllm_ascend
    from vllm.model_executor.models import ModelRegistry

    assert vllm_npu_ext._registered_in_pid == os.getpid()
    assert vllm_ascend._GLOBAL_PATCH_APPLIED  # every ascend_* general plugin applies it
    assert "VllmNpuExtQwen3ForCausalLM" in ModelRegistry.get_supported_archs()


# A fresh vLLM process, started as vLLM starts one: nothing installs the stand-in but our
# platform plugin (VLLM_NPU_EXT_EMULATE=1), which vLLM calls before importing NPUPlatform.
# Then vllm-ascend's kernel loading runs for real: `import vllm._custom_ops` calls
# NPUPlatform.import_kernels(); enable_custom_op() imports its C extension.
CHILD = textwrap.dedent(
    """
    import json, os, sys
    VARIABLES = ("ASCEND_CUSTOM_OPP_PATH", "LD_LIBRARY_PATH")
    snapshot = lambda: {name: os.environ.get(name, "") for name in VARIABLES}
    records = {"start": snapshot()}
    from vllm.platforms import current_platform
    records["platform"] = type(current_platform).__module__ + "." + type(current_platform).__name__
    records["torch_npu"] = getattr(sys.modules.get("torch_npu"), "__name__", None)
    records["after_platform"] = snapshot()
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    import vllm_npu_ext, vllm_ascend
    records["plugins"] = [vllm_npu_ext._registered_in_pid == os.getpid(),
                          vllm_ascend._GLOBAL_PATCH_APPLIED]
    import vllm._custom_ops
    current_platform.import_kernels()
    records["after_import_kernels"] = snapshot()
    from vllm_ascend import utils
    try:
        records["custom_op_enabled"] = utils.enable_custom_op()
    except RuntimeError as error:  # see test_vllm_ascends_retry_path_raises
        records["custom_op_error"] = str(error)
    records["after_enable_custom_op"] = snapshot()
    import importlib
    import vllm_ascend.ops, vllm_ascend.worker.model_runner_v1, vllm_ascend.attention.attention_v1
    CALLERS = ("vllm_ascend.attention.context_parallel.attention_cp",
               "vllm_ascend.attention.context_parallel.mla_cp")
    records["callers_loaded_without_cp"] = [name in sys.modules for name in CALLERS]
    from vllm_npu_ext.patches.vllm_ascend_cp import patching
    records["callers_patched_on_import"] = [
        patching.patched(importlib.import_module(name)) for name in CALLERS]
    records["common_cp_problem"] = patching.target_problem(
        importlib.import_module(patching.COMMON_MODULE))
    print("RECORDS " + json.dumps(records))
    """
)


def _fake_extension(site: Path, scratch: Path) -> str:
    """`vllm_ascend/vllm_ascend_C` as a shared library that needs `libcust_opapi.so`, which
    no loader path provides: importing it fails as it does on a host whose vendor op_api is
    not found, and vllm-ascend takes its retry path (LD_LIBRARY_PATH prepend)."""
    stub = scratch / "stub"
    stub.mkdir()
    (stub / "opapi.c").write_text("int aclnn_stub(void) { return 0; }\n")
    (stub / "ext.c").write_text("int aclnn_stub(void);\nint PyInit_vllm_ascend_C(void) "
                                "{ return aclnn_stub(); }\n")  # fmt: skip
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", stub / "libcust_opapi.so", stub / "opapi.c"],
                   check=True)  # fmt: skip
    suffix = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    target = site / "vllm_ascend" / f"vllm_ascend_C{suffix}"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", target, stub / "ext.c",
                    f"-L{stub}", "-lcust_opapi"], check=True)  # fmt: skip
    shutil.rmtree(stub)
    return target.name


@pytest.fixture(scope="module")
def fresh_process(tmp_path_factory, vllm_ascend_started):
    scratch = tmp_path_factory.mktemp("start_up")
    site = scratch / "site"
    shutil.copytree(vllm_ascend_site(), site)
    theirs = make_vendor_dir(
        site / "vllm_ascend" / "_cann_ops_custom" / "vendors" / "custom_transformer",
        ["AttentionUpdate"],
    )
    ours = make_vendor_dir(scratch / "opp" / "vendors" / "vllm_npu_ext", ["NpuExtAttentionUpdate"])
    other = make_vendor_dir(scratch / "opp" / "vendors" / "customize", ["Other"])
    extension = _fake_extension(site, scratch)
    env = subprocess_env(
        site,
        VLLM_NPU_EXT_OPP_PATH=str(ours),
        # vllm-ascend's entries first and ours last, as vllm-ascend's image leaves them.
        ASCEND_CUSTOM_OPP_PATH=":".join(map(str, (theirs, other, ours))),
        LD_LIBRARY_PATH=":".join(str(lib_dir(p)) for p in (ours, other, theirs)),
    )
    env.pop("VLLM_PLUGINS", None)
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RECORDS ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    records = json.loads(lines[-1].removeprefix("RECORDS "))
    return records, {"ours": str(ours), "theirs": str(theirs), "other": str(other),
                     "extension": extension, "stderr": done.stderr}  # fmt: skip


def test_a_fresh_process_gets_the_stand_in_from_our_platform_plugin(fresh_process):
    records, _ = fresh_process
    assert records["platform"] == "vllm_ascend.platform.NPUPlatform"
    assert records["torch_npu"] == "vllm_npu_ext.emulator"
    assert records["plugins"] == [True, True]


@pytest.mark.parametrize("moment", ["after_platform", "after_import_kernels",
                                    "after_enable_custom_op"])  # fmt: skip
def test_our_operator_package_stays_first_after_vllm_ascends_kernel_loading(fresh_process, moment):
    records, paths = fresh_process
    opp = records[moment]["ASCEND_CUSTOM_OPP_PATH"].split(":")
    assert opp[:3] == [paths["ours"], paths["theirs"], paths["other"]], opp
    libraries = [entry for entry in records[moment]["LD_LIBRARY_PATH"].split(":")
                 if entry in {str(lib_dir(paths[k])) for k in ("ours", "theirs", "other")}]
    # vllm-ascend's op_api first (its extension binds libcust_opapi.so by soname), then ours.
    assert libraries == [str(lib_dir(paths[k])) for k in ("theirs", "ours", "other")]


def test_vllm_ascends_retry_path_raises(fresh_process):
    """Found here, a vllm-ascend 0.23.0.post1 defect: when `vllm_ascend_C` fails to load for
    want of `libcust_opapi.so`, `enable_custom_op()` retries (its `except` branch) by importing
    `meta_registration` *before* `vllm_ascend_C`, and registering Meta kernels for operators
    that do not exist yet raises RuntimeError instead of the logged fallback. The environment
    change it makes first (its vendor op_api/lib, already present) leaves our order intact
    (the test above)."""
    records, paths = fresh_process
    assert records["start"]["ASCEND_CUSTOM_OPP_PATH"].startswith(paths["theirs"])
    assert "custom_op_enabled" not in records
    assert "_C_ascend::" in records["custom_op_error"]
    assert "does not exist" in records["custom_op_error"]


def test_cp_callers_load_only_with_cp_and_are_patched_when_they_do(fresh_process):
    """What scripts/check_vllm_ascend_patch.py used to read from the sources, seen running:
    vllm-ascend's runner and attention backend do not import the CP caller modules (they load
    only when DCP/PCP > 1); imported, both are patched by our hook; common_cp's targets have
    the parameters the patch expects."""
    records, _ = fresh_process
    assert records["callers_loaded_without_cp"] == [False, False]
    assert records["callers_patched_on_import"] == [True, True]
    assert records["common_cp_problem"] is None
