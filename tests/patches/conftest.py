"""Shared fixtures of the patch tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def refusal_log(monkeypatch, caplog):
    """The records of the loggers `vllm_npu_ext.logger.get_logger` hands out during the test,
    captured on a logger of the test's own: vLLM's logging configuration (applied again when a
    test re-imports vLLM, as vLLM 0.23 does on importing `vllm.logger`) drops the handlers of
    its child loggers, so a handler added to ours could miss a record, depending on test order."""
    from vllm_npu_ext import logger as logger_module

    captured = logging.Logger("vllm_npu_ext.tests.patches")
    captured.addHandler(caplog.handler)
    monkeypatch.setattr(logger_module, "get_logger", lambda name: captured)
    return caplog
