"""`vllm-npu-ext doctor` on crafted vendor directories and malformed search paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.bootstrap_probe import (
    OP_TYPE,
    make_stand_in_vllm_ascend,
    make_vendor_dir,
    restored_environ,
)

from vllm_npu_ext import bootstrap, doctor, envs

SEARCH_PATH_VARIABLES = (bootstrap.OPP_PATH_VARIABLE, bootstrap.LIBRARY_PATH_VARIABLE)


@pytest.fixture
def doctor_env(monkeypatch, tmp_path):
    """Every variable the doctor reads at its default; search paths restored afterwards."""
    missing = tmp_path / "no_default_install"
    monkeypatch.setattr(bootstrap, "default_vendor_dir", lambda: missing)
    monkeypatch.setattr(doctor, "default_vendor_dir", lambda: missing)
    monkeypatch.setattr(doctor, "CANN_DEFAULT_ROOTS", ())
    for name in [*envs.VARIABLES, *doctor.CANN_ROOT_VARIABLES, *SEARCH_PATH_VARIABLES]:
        monkeypatch.delenv(name, raising=False)
    with restored_environ(SEARCH_PATH_VARIABLES):
        yield monkeypatch


@pytest.fixture
def crafted(tmp_path):
    """Ours, and an earlier entry with a same-named operator (one via ops-info, one via aclnn)."""
    vendors = tmp_path / "opp" / "vendors"
    return {
        "ours": str(make_vendor_dir(vendors / "vllm_npu_ext", [OP_TYPE])),
        "by_ops_info": str(make_vendor_dir(vendors / "bundled", [OP_TYPE, "AttentionUpdate"])),
        "by_header": str(make_vendor_dir(vendors / "rebuilt", [], ("npu_ext_attention_update",))),
        "other": str(make_vendor_dir(vendors / "other", ["SomethingElse"])),
    }


def run_doctor(capsys, *argv: str) -> tuple[int, str]:
    code = doctor.main(list(argv))
    return code, capsys.readouterr().out


@pytest.mark.parametrize("earlier", ["by_ops_info", "by_header"])
@pytest.mark.parametrize("switch, expected_code", [("1", 0), ("0", 1)])
def test_shadowing_depends_on_the_bootstrap(
    doctor_env, crafted, capsys, earlier, switch, expected_code
):
    doctor_env.setenv("VLLM_NPU_EXT_BOOTSTRAP", switch)
    doctor_env.setenv("VLLM_NPU_EXT_OPP_PATH", crafted["ours"])
    doctor_env.setenv(
        "ASCEND_CUSTOM_OPP_PATH", f"{crafted[earlier]}:{crafted['other']}:{crafted['ours']}"
    )
    code, out = run_doctor(capsys, "--json")
    report = json.loads(out)
    assert code == expected_code
    assert report["custom_op_package"]["ops"] == [OP_TYPE]
    if switch == "1":
        assert report["shadowed_ops"] == []
        assert report["ascend_custom_opp_path"][0] == crafted["ours"]
        assert report["problems"] == []
    else:
        assert report["shadowed_ops"] == [{"op": OP_TYPE, "shadowed_by": crafted[earlier]}]
        assert "VLLM_NPU_EXT_BOOTSTRAP=1" in report["problems"][0]


def test_human_report_names_the_shadowing_entry_and_the_fix(doctor_env, crafted, capsys):
    doctor_env.setenv("VLLM_NPU_EXT_BOOTSTRAP", "0")
    doctor_env.setenv("VLLM_NPU_EXT_OPP_PATH", crafted["ours"])
    doctor_env.setenv("ASCEND_CUSTOM_OPP_PATH", f"{crafted['by_ops_info']}:{crafted['ours']}")
    code, out = run_doctor(capsys)
    assert code == 1
    assert f"shadowed ops: {OP_TYPE} (by {crafted['by_ops_info']})" in out
    assert f"2. {crafted['ours']}  [ours]" in out
    assert "Fix: set VLLM_NPU_EXT_BOOTSTRAP=1" in out


def test_vllm_ascends_own_prepend_is_part_of_the_effective_path(
    doctor_env, crafted, tmp_path, capsys
):
    """With the bootstrap off, vllm-ascend's bundled operators shadow ours: the original bug."""
    theirs = make_stand_in_vllm_ascend(tmp_path / "site", [OP_TYPE])
    doctor_env.syspath_prepend(str(tmp_path / "site"))
    doctor_env.setenv("VLLM_NPU_EXT_OPP_PATH", crafted["ours"])
    doctor_env.setenv("ASCEND_CUSTOM_OPP_PATH", crafted["ours"])
    for switch, shadowed in (("0", [{"op": OP_TYPE, "shadowed_by": str(theirs)}]), ("1", [])):
        doctor_env.setenv("VLLM_NPU_EXT_BOOTSTRAP", switch)
        report = doctor.collect()
        assert report["vllm_ascend_vendor_dir"] == str(theirs)
        assert report["shadowed_ops"] == shadowed


MALFORMED = [
    "::",
    "{ours}:",
    ":{ours}::",
    "/does/not/exist:{ours}",
    "relative/dir:{ours}",
    ":rel::",
]


@pytest.mark.parametrize("switch", ["1", "0"])
@pytest.mark.parametrize("value", MALFORMED)
def test_malformed_search_paths_never_crash(doctor_env, crafted, capsys, value, switch):
    doctor_env.setenv("VLLM_NPU_EXT_BOOTSTRAP", switch)
    doctor_env.setenv("VLLM_NPU_EXT_OPP_PATH", crafted["ours"])
    for name in SEARCH_PATH_VARIABLES:
        doctor_env.setenv(name, value.format(ours=crafted["ours"]))
    code, out = run_doctor(capsys, "--json")
    report = json.loads(out)
    ours_listed = crafted["ours"] in report["ascend_custom_opp_path"]
    assert code == (0 if ours_listed else 1)
    if switch == "1":
        assert report["ascend_custom_opp_path"][0] == crafted["ours"]
        assert all(os.path.isabs(entry) for entry in report["ascend_custom_opp_path"])
    code, out = run_doctor(capsys)
    assert out.startswith("versions: python ")


def test_malformed_ops_info_files_are_skipped(doctor_env, crafted, capsys):
    config = os.path.join(crafted["other"], "op_impl", "ai_core", "tbe", "config", "ascend910b")
    for name, text in (
        ("aic-ascend910b-ops-info.json", "{not json"),
        ("aic-x-ops-info.json", "[]"),
    ):
        with open(os.path.join(config, name), "w") as file:
            file.write(text)
    doctor_env.setenv("VLLM_NPU_EXT_BOOTSTRAP", "0")
    doctor_env.setenv("VLLM_NPU_EXT_OPP_PATH", crafted["ours"])
    doctor_env.setenv("ASCEND_CUSTOM_OPP_PATH", f"{crafted['other']}:{crafted['ours']}")
    code, out = run_doctor(capsys, "--json")
    assert code == 0 and json.loads(out)["shadowed_ops"] == []


@pytest.mark.parametrize(
    "settings, fix",
    [
        ({"VLLM_NPU_EXT_OPP_PATH": "relative/opp"}, "set an absolute path"),
        ({"VLLM_NPU_EXT_OPP_PATH": "/does/not/exist"}, "is not a directory"),
        ({"VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL": "custom"}, "build and install cann_ops"),
        ({"VLLM_NPU_EXT_ATTENTION_OP": "nope"}, "Fix: set VLLM_NPU_EXT_ATTENTION_OP"),
        ({"VLLM_NPU_EXT_OPP_PATH": "{empty}"}, "provides no operators"),
        ({"VLLM_NPU_EXT_OPP_PATH": "{ours}", "VLLM_NPU_EXT_BOOTSTRAP": "0"}, "is not on"),
    ],
    ids=["relative", "missing", "custom-kernel", "attention-op", "empty-package", "not-on-path"],
)
def test_broken_setups_exit_1_with_the_fix(doctor_env, crafted, tmp_path, capsys, settings, fix):
    (tmp_path / "empty").mkdir()
    for name, value in settings.items():
        doctor_env.setenv(name, value.format(ours=crafted["ours"], empty=tmp_path / "empty"))
    code, out = run_doctor(capsys)
    assert code == 1
    assert fix in out


def test_report_without_our_package(doctor_env, capsys):
    doctor_env.setenv("VLLM_NPU_EXT_FUSE_ROTARY", "0")
    doctor_env.setenv("VLLM_NPU_EXT_MODEL_OVERRIDE", "0")
    code, out = run_doctor(capsys, "--json")
    report = json.loads(out)
    assert code == 0
    assert report["custom_op_package"]["vendor_dir"] is None
    assert report["bootstrap"] == {"enabled": True, "changes": [], "dropped_entries": []}
    assert set(report["versions"]) >= {
        "python",
        "torch",
        "vllm",
        "vllm_ascend",
        "torch_npu",
        "cann",
    }
    assert report["versions"]["cann"] is None
    assert report["fusions"] == {name: name != "rotary" for name in envs.FUSIONS}
    assert report["model_override"] is False
    assert isinstance(report["npu_usable"], bool)


@pytest.mark.parametrize(
    "relative_path, text",
    [
        ("x86_64-linux/ascend_toolkit_install.info", "package_name=toolkit\nversion=8.2.RC1"),
        ("compiler/version.info", "Version=8.2.RC1\n"),
    ],
)
def test_cann_version_is_read_from_the_toolkit(doctor_env, tmp_path, relative_path, text):
    path = tmp_path / "toolkit" / relative_path
    path.parent.mkdir(parents=True)
    path.write_text(text)
    doctor_env.setenv("ASCEND_TOOLKIT_HOME", str(tmp_path / "toolkit"))
    assert doctor.cann_version() == "8.2.RC1"


def test_python_m_doctor_prints_json(tmp_path):
    env = {**os.environ, "VLLM_NPU_EXT_OPP_PATH": str(tmp_path / "missing")}
    done = subprocess.run(
        [sys.executable, "-m", "vllm_npu_ext.doctor", "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "is not a directory" in json.loads(done.stdout)["problems"][0]


ASCEND_VERSIONS = {
    "python": "3.11.7", "torch": "2.10.0", "vllm": "0.23.0", "vllm_ascend": "0.23.0.post1",
    "torch_npu": "2.10.0.post4", "cann": "9.1.0", "vllm_npu_ext": "0.1.0",
}  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "mismatch"),
    [
        ({"torch": "2.11.0"}, "torch 2.11.0 (needs 2.10.x)"),
        ({"torch_npu": "2.14.0"}, "torch-npu 2.14.0 (needs 2.10.x)"),
        ({"vllm": "0.32.0"}, "vllm 0.32.0 (needs 0.23.x)"),
        ({"vllm_ascend": "0.24.0rc1"}, "vllm-ascend 0.24.0rc1 (needs 0.23.x)"),
        ({"vllm": None}, "vllm missing (needs 0.23.x)"),
        ({"cann": "8.2.RC1"}, "CANN 8.2.RC1 (needs 9.1.x)"),
    ],
)
def test_a_wrong_ascend_version_set_is_a_problem_with_the_fix(doctor_env, capsys, changes,
                                                               mismatch):  # fmt: skip
    doctor_env.setattr(doctor, "versions", lambda: {**ASCEND_VERSIONS, **changes})
    code, out = run_doctor(capsys)
    assert code == 1
    assert f"version set: MISMATCH: {mismatch}" in out
    problem = next(line for line in out.splitlines() if line.startswith("  - version set"))
    assert mismatch in problem and "quay.io/ascend/vllm-ascend:v0.23.0.post1" in problem
    assert "never installs or replaces" in problem


@pytest.mark.parametrize(("cann", "shown"), [("9.1.0", "CANN 9.1.0"), (None, "not readable")])
def test_the_ascend_set_vllm_ascend_023_runs_on_passes(doctor_env, capsys, cann, shown):
    doctor_env.setattr(doctor, "versions", lambda: {**ASCEND_VERSIONS, "cann": cann})
    code, out = run_doctor(capsys)
    assert code == 0, out
    assert "version set: ok (" in out and shown in out


def test_the_cpu_development_stack_is_not_checked(doctor_env, capsys):
    cpu = {**ASCEND_VERSIONS, "torch": "2.13.0+cpu", "vllm": "0.32.0", "vllm_ascend": None,
           "torch_npu": None, "cann": None}  # fmt: skip
    doctor_env.setattr(doctor, "versions", lambda: cpu)
    code, out = run_doctor(capsys, "--json")
    report = json.loads(out)
    assert code == 0 and report["problems"] == []
    assert report["ascend_stack"] == {"checked": False, "mismatched": [], "cann": None}


def test_the_binding_is_reported_as_not_built_here(doctor_env, capsys):
    code, out = run_doctor(capsys, "--json")
    assert json.loads(out)["binding"] == {"present": False, "loads": None, "error": None,
                                          "path": None}  # fmt: skip
    code, out = run_doctor(capsys)
    assert "torch binding vllm_npu_ext._cann_C: not built" in out
    assert "vllm-npu-ext build-ops --binding-only" in out


@pytest.mark.parametrize(
    ("binding", "kernel", "fix"),
    [
        ({"present": True, "loads": False, "error": "undefined symbol: aclnnFoo",
          "path": "/x/_cann_C.so"}, "auto", "rebuild it against this torch"),
        ({"present": False, "loads": None, "error": None, "path": None}, "custom",
         "KERNEL=custom but the torch binding"),
    ],
    ids=["does-not-load", "custom-without-binding"],
)  # fmt: skip
def test_a_broken_or_missing_binding_is_a_problem(doctor_env, capsys, binding, kernel, fix):
    doctor_env.setattr(doctor.ascend_stack, "binding_report", lambda: binding)
    doctor_env.setenv("VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL", kernel)
    code, out = run_doctor(capsys)
    assert code == 1
    assert fix in out and "vllm-npu-ext build-ops --binding-only" in out


def test_the_cpu_float32_matmul_decision_is_the_models(doctor_env, capsys):
    """The doctor states, per half dtype, what the model's build would decide here: the CPU
    platform path without an NPU, not under the emulator; an unknown value is a problem."""
    import torch

    from vllm_npu_ext.model_executor.layers import cpu_matmul_choice

    code, out = run_doctor(capsys, "--json")
    decisions = json.loads(out)["cpu_float32_matmul"]
    assert code == 0 and set(decisions) == {"bfloat16", "float16"}
    for dtype in (torch.bfloat16, torch.float16):
        on, why = cpu_matmul_choice.choose(dtype, cpu_platform_path=True)
        assert decisions[str(dtype).removeprefix("torch.")] == {"on": on, "why": why}
    doctor_env.setenv("VLLM_NPU_EXT_EMULATE", "1")
    code, out = run_doctor(capsys)
    line = "CPU float32 matmul: bfloat16 off (not the CPU platform path), float16 off ("
    assert code == 0 and line in out
    doctor_env.setenv(cpu_matmul_choice.SWITCH, "yes")
    code, out = run_doctor(capsys)
    assert code == 1 and f"{cpu_matmul_choice.SWITCH} must be one of" in out
