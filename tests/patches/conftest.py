"""Shared fixtures of the patch tests."""

from __future__ import annotations

import logging

import pytest


class RecordList(logging.Handler):
    """A handler that keeps every record it is given, at every level."""

    def __init__(self):
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def refusal_log(monkeypatch) -> RecordList:
    """The records of the loggers `vllm_npu_ext.logger.get_logger` hands out during the test
    (`.records`), on a logger and handler of the test's own. Not pytest's caplog: its handler
    lives for the whole session, and whatever changes it stays changed; importing vLLM 0.23's
    entrypoints imports `model_hosting_container_standards.logging_config`, which sets every
    root handler, caplog's included, to ERROR (`configure_root_logger`), so a warning went
    uncaptured in any test that ran after one importing them. Nor vLLM's logger: vLLM 0.23
    applies its logging configuration again when `vllm.logger` is imported again."""
    from vllm_npu_ext import logger as logger_module

    handler = RecordList()
    captured = logging.Logger("vllm_npu_ext.tests.patches")
    captured.addHandler(handler)
    monkeypatch.setattr(logger_module, "get_logger", lambda name: captured)
    return handler
