"""Source pins of the patch table: a patch applies only to the sources it was verified on,
refuses another one with a log line that says what to do, the doctor reports the refusal, and
VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES applies it knowingly."""

from __future__ import annotations

import inspect
import re

import pytest
from vllm.model_executor.models.registry import _ModelRegistry

from vllm_npu_ext import doctor, envs, patches
from vllm_npu_ext.patches import pins, vllm_model_registry

RESOLVE = "vllm.model_executor.models.registry:_ModelRegistry.resolve_model_cls"


def test_every_pin_matches_the_stack_it_runs_on():
    """Nothing is refused in a normal run: vLLM's pinned functions match here (vllm-ascend's
    are absent on the CPU stacks and checked in tests/with_vllm_ascend)."""
    checks = patches.pin_checks()
    assert [c for c in checks if not c.applicable] == []
    vllm_checks = [c for c in checks if c.target.startswith("vllm.")]
    assert vllm_checks and {c.status for c in vllm_checks if not patches.PATCHES[c.patch].needs
                            } == {"ok"}  # fmt: skip
    for check in vllm_checks:  # a patch that needs vllm_ascend: its pins wait for it
        assert check.status == "ok" or patches.PATCHES[check.patch].needs == "vllm_ascend"


def test_every_row_says_why_how_and_when_to_remove_it_and_pins_by_version():
    for patch in patches.PATCHES.values():
        assert patch.target and patch.why and patch.how and patch.remove_when, patch.name
        for target, versions in patch.pins.items():
            assert ":" in target and versions, target
            assert all(re.fullmatch("[0-9a-f]{64}", digest) for digest in versions.values())


def test_a_source_hashes_alike_imported_and_read_from_its_file():
    text = inspect.getsource(inspect.getmodule(_ModelRegistry))
    from_text = pins.source_hash_in_module(text, "_ModelRegistry.resolve_model_cls")
    assert from_text == pins.source_hash(_ModelRegistry.resolve_model_cls)


MODULE_WITH_A_MULTILINE_STRING = '''
class Runner:
    def prepare(self):
        text = """first line
        an indented second line"""
        return text
'''


def test_a_method_with_a_multi_line_string_hashes_alike_imported_and_from_its_file(
    tmp_path, monkeypatch
):
    """vllm-ascend's NPUModelRunner._prepare_inputs holds one: the method's own text dedented
    would change the string's second line, and a live check would refuse the pinned source."""
    (tmp_path / "pinned_runner.py").write_text(MODULE_WITH_A_MULTILINE_STRING)
    monkeypatch.syspath_prepend(str(tmp_path))
    import pinned_runner

    from_text = pins.source_hash_in_module(MODULE_WITH_A_MULTILINE_STRING, "Runner.prepare")
    assert from_text == pins.source_hash(pinned_runner.Runner.prepare)


def resolve_model_cls(self, architectures, model_config):
    """Not vLLM's: a source no pin matches."""
    return None, "changed"


@pytest.fixture
def changed_registry(monkeypatch):
    """vLLM's `resolve_model_cls` replaced by another function; restored afterwards."""
    monkeypatch.delenv(envs.MODEL_OVERRIDE.name, raising=False)
    monkeypatch.delenv(envs.ACCEPT_PATCH_SOURCES.name, raising=False)
    monkeypatch.setenv(envs.BOOTSTRAP.name, "0")  # the doctor leaves this environment alone
    monkeypatch.setattr(_ModelRegistry, "resolve_model_cls", resolve_model_cls)
    yield pins.source_hash(resolve_model_cls)
    vllm_model_registry.uninstall()


def test_a_changed_function_is_refused_logged_and_reported_by_the_doctor(
    changed_registry, refusal_log, capsys
):
    assert patches.apply("vllm_model_registry") == []
    assert _ModelRegistry.resolve_model_cls is resolve_model_cls  # not wrapped
    logged = {r.getMessage() for r in refusal_log.records if "not applied" in r.getMessage()}
    assert len(logged) == 1  # a set: the record may reach the capture twice
    [message] = logged
    assert RESOLVE in message and changed_registry in message
    assert f"{envs.ACCEPT_PATCH_SOURCES.name}={changed_registry}" in message
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert f"mismatch: {RESOLVE}" in out
    assert any(RESOLVE in problem for problem in doctor.collect()["problems"])


def test_the_accept_variable_applies_a_changed_source(changed_registry, monkeypatch):
    monkeypatch.setenv(envs.ACCEPT_PATCH_SOURCES.name, changed_registry)
    assert patches.apply("vllm_model_registry")
    assert inspect.unwrap(_ModelRegistry.resolve_model_cls) is resolve_model_cls  # wrapped
    statuses = {c.target: c.status for c in patches.pin_checks()}
    assert statuses[RESOLVE] == "accepted"
    assert not any(RESOLVE in problem for problem in doctor.collect()["problems"])
