"""The bootstrap's order holds inside every vLLM process, not only in the one that starts them.

The probe (tests/support/bootstrap_probe.py) resets the search paths to an unordered state at
the start of every vLLM process and records them after the platform plugins and after
vllm-ascend's own prepend; see its docstring for why a process where our bootstrap did not run
cannot pass.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.bootstrap_order import assert_inherited_in_order, assert_ordered
from support.bootstrap_probe import probe_server_env, read_records, vllm_ascend_vendor_dir

# What a vLLM process does first: resolve the platform (platform plugins), then load the
# general plugins.
VLLM_PROCESS_START = (
    "import vllm.platforms as platforms; platforms.current_platform; "
    "from vllm.plugins import load_general_plugins; load_general_plugins()"
)


@pytest.mark.parametrize("switch", ["1", "0"])
def test_probe_sees_the_platform_plugin_in_a_fresh_vllm_process(tmp_path, switch):
    """The probe's control: with the bootstrap off, vllm-ascend's directory comes first."""
    probe_dir = tmp_path / "probe"
    env = {
        **os.environ,
        **probe_server_env(probe_dir),
        "VLLM_NPU_EXT_BOOTSTRAP": switch,
        "VLLM_NPU_EXT_MODEL_OVERRIDE": "0",
    }
    env.pop("VLLM_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-c", VLLM_PROCESS_START],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = read_records(probe_dir)
    if switch == "1":
        assert_ordered(record, probe_dir, ("at_general_plugin_load", "final"))
    else:
        theirs = str(vllm_ascend_vendor_dir(probe_dir))
        assert record["ASCEND_CUSTOM_OPP_PATH"].split(":")[0] == theirs


@pytest.mark.slow
def test_every_server_process_puts_our_package_first(embedding_server):
    probe_dir = embedding_server.probe_dir
    records = read_records(probe_dir)
    by_pid = {record["pid"]: record for record in records}
    engines = [r for r in records if "EngineCore" in f"{r['title']} {r['process_name']}"]
    assert len(engines) == 1, [(r["pid"], r["title"], r["process_name"]) for r in records]
    (engine,) = engines
    api_server = by_pid.get(engine["ppid"])
    workers = [record for record in records if record["ppid"] == engine["pid"]]
    assert api_server is not None and workers, [(r["pid"], r["ppid"], r["title"]) for r in records]
    for record in [api_server, engine, *workers]:
        assert_ordered(record, probe_dir, ("at_general_plugin_load", "final"))
    for child in [engine, *workers]:
        assert_inherited_in_order(child, probe_dir)
    log = embedding_server.log_path.read_text(errors="replace")
    for record in [api_server, engine, *workers]:
        assert f"vllm-npu-ext custom-op bootstrap in pid {record['pid']}:" in log
