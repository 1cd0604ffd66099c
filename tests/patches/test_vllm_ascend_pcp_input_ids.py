"""The PCP input-ids patch on fake runner modules (vllm-ascend's real runner, with its pins, runs
in tests/with_vllm_ascend: the PCP engines there use vLLM's default async scheduling)."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from vllm_npu_ext import envs
from vllm_npu_ext.patches import apply
from vllm_npu_ext.patches import vllm_ascend_pcp_input_ids as patch

# A row reused after a finished request: the new prompt's ids, then that request's -1s.
HOST_IDS = [5, 9, 3, -1, -1, 7, -1, 2]


def runner(pcp_size=2, use_async_scheduling=True):
    ids = torch.tensor(HOST_IDS + [-1] * 4)  # beyond the step's tokens: left alone
    return SimpleNamespace(input_ids=SimpleNamespace(cpu=ids), pcp_size=pcp_size,
                           use_async_scheduling=use_async_scheduling)  # fmt: skip


def test_placeholders_become_token_zero_in_a_pcp_runner_with_async_scheduling():
    fake = runner()
    assert patch.placeholders_to_zero(fake, len(HOST_IDS)) == 3
    assert fake.input_ids.cpu.tolist() == [5, 9, 3, 0, 0, 7, 0, 2, -1, -1, -1, -1]


@pytest.mark.parametrize("settings", [{"pcp_size": 1}, {"use_async_scheduling": False}])
def test_other_runners_are_left_as_they_are(settings):
    fake = runner(**settings)
    assert patch.placeholders_to_zero(fake, len(HOST_IDS)) == 0
    assert fake.input_ids.cpu.tolist()[: len(HOST_IDS)] == HOST_IDS


class GPUModelRunner:
    """vLLM's runner: `_prepare_input_ids` copies the host ids (here: records them)."""

    def _prepare_input_ids(self, scheduler_output, num_reqs, total_num_scheduled_tokens,
                           cu_num_tokens):  # fmt: skip
        self.seen = self.input_ids.cpu[:total_num_scheduled_tokens].tolist()
        return "vLLM's"


@pytest.fixture
def runner_module(monkeypatch):
    """A fake `vllm_ascend.worker.model_runner_v1` whose NPUModelRunner inherits the method."""
    module = ModuleType(patch.RUNNER_MODULE)

    class NPUModelRunner(GPUModelRunner):
        pass

    module.NPUModelRunner = NPUModelRunner
    monkeypatch.setitem(sys.modules, "vllm_ascend", ModuleType("vllm_ascend"))  # pins checked
    monkeypatch.setitem(sys.modules, patch.RUNNER_MODULE, module)
    yield module
    patch.unpatch_module(module)


def test_patched_runner_hands_vllms_method_ids_without_placeholders(runner_module, monkeypatch):
    monkeypatch.setattr(patch.patches, "refusals", lambda name: [])
    assert patch.patch_module(runner_module) and patch.patch_module(runner_module)  # once
    instance = runner_module.NPUModelRunner()
    instance.__dict__.update(vars(runner()))
    assert instance._prepare_input_ids(None, 3, len(HOST_IDS), None) == "vLLM's"
    assert instance.seen == [5, 9, 3, 0, 0, 7, 0, 2]
    patch.unpatch_module(runner_module)
    assert "_prepare_input_ids" not in vars(runner_module.NPUModelRunner)  # vLLM's again
    instance.__dict__.update(vars(runner()))
    instance._prepare_input_ids(None, 3, len(HOST_IDS), None)
    assert instance.seen == HOST_IDS


def test_a_runner_whose_source_is_not_pinned_is_left_alone(runner_module, refusal_log):
    """Fail closed: the fake module's `_prepare_inputs` is missing, so its pin is unchecked."""
    assert not patch.patch_module(runner_module)
    assert "_prepare_input_ids" not in vars(runner_module.NPUModelRunner)
    refused = [r.getMessage() for r in refusal_log.records if "not applied" in r.getMessage()]
    assert any("NPUModelRunner._prepare_inputs" in message for message in refused)


def test_the_switch_decides_whether_the_hook_is_installed(monkeypatch):
    monkeypatch.setattr(patch, "install", lambda: ["hook installed"])
    monkeypatch.delenv(envs.PCP_INPUT_IDS_PATCH.name, raising=False)
    assert apply(patch.NAME) == ["hook installed"]  # on by default
    monkeypatch.setenv(envs.PCP_INPUT_IDS_PATCH.name, "0")
    assert apply(patch.NAME) == []
