"""Every source pin of the patch table matches vllm-ascend 0.23.0.post1 and vLLM 0.23.0 as
installed here: nothing is refused in a normal run, vllm-ascend's targets included."""

from __future__ import annotations

from vllm_npu_ext import patches


def test_every_pin_matches_vllm_ascend_and_its_vllm():
    checks = patches.pin_checks()
    assert any(c.target.startswith("vllm_ascend.") for c in checks)
    assert {c.target: c.status for c in checks if c.status != "ok"} == {}
