"""The test processes' environment (tests/support/child_env.py): what the suite gives the
processes it starts, and what `make test`'s parts give the pytest processes themselves."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.child_env import CHILD_ENV

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_the_suite_starts_gets_the_child_environment():
    program = "import json, os; print(json.dumps(dict(os.environ)))"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    child = json.loads(done.stdout)
    for variable in CHILD_ENV:  # ours, or the user's from before pytest started
        assert variable in child and child[variable] == os.environ[variable], variable
    assert CHILD_ENV == {"TORCHINDUCTOR_VEC_ISA_OK": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _make_variable(target: str, variable: str) -> str | None:
    """`variable`'s target-specific value for `target` in make's database (printed for a target
    that does not exist: nothing is built, not even a recipe that calls $(MAKE))."""
    env = {k: v for k, v in os.environ.items() if k != variable and not k.startswith("MAKE")}
    done = subprocess.run(["make", "-pRrq", "-f", "Makefile", "__no_such_target__"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    match = re.search(rf"^{re.escape(target)}: (?:export )?{variable} [:?]?= (\S+)$",
                      done.stdout, re.MULTILINE)  # fmt: skip
    return match.group(1) if match else None


@pytest.mark.parametrize("target", ["test-main", "test-ascend-suite", "test-vllm-pooling-ascend",
                                    "test-vllm-ascend"])  # fmt: skip
def test_make_test_parts_wait_passively(target):
    assert _make_variable(target, "OMP_WAIT_POLICY") == "PASSIVE"


def test_serving_keeps_openmps_default_wait_policy():
    assert _make_variable("serve", "OMP_WAIT_POLICY") is None
