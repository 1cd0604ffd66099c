"""The test processes' environment (tests/support/child_env.py): what the suite gives the
processes it starts, and what `make test`'s parts give the pytest processes themselves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from support.child_env import CHILD_ENV
from support.doc_commands import make_database


def test_a_process_the_suite_starts_gets_the_child_environment():
    program = "import json, os; print(json.dumps(dict(os.environ)))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    child = json.loads(done.stdout)
    for variable in CHILD_ENV:  # ours, or the user's from before pytest started
        assert variable in child and child[variable] == os.environ[variable], variable
    assert CHILD_ENV == {"TORCHINDUCTOR_VEC_ISA_OK": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _make_variable(target: str, variable: str) -> str | None:
    """`variable`'s target-specific value for `target` in make's database."""
    match = re.search(rf"^{re.escape(target)}: (?:export )?{variable} [:?]?= (\S+)$",
                      make_database(), re.MULTILINE)  # fmt: skip
    return match.group(1) if match else None


@pytest.mark.parametrize("target", ["test-main", "test-ascend-suite", "test-vllm-pooling-ascend",
                                    "test-vllm-ascend"])  # fmt: skip
def test_make_test_parts_wait_passively(target):
    assert _make_variable(target, "OMP_WAIT_POLICY") == "PASSIVE"


def test_serving_keeps_openmps_default_wait_policy():
    assert _make_variable("serve", "OMP_WAIT_POLICY") is None
