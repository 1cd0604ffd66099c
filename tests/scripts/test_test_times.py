"""scripts/test_times.py: each part of `make test` timed, failures kept, one table at the end."""

from __future__ import annotations

import sys

import pytest
from support.scripts import load_script


@pytest.fixture
def times(tmp_path, monkeypatch):
    module = load_script("scripts/test_times.py")
    monkeypatch.setattr(module, "RECORDS", tmp_path / ".test-times")
    module.reset()
    return module


def test_a_part_keeps_its_commands_exit_status_and_says_its_time(times, capsys):
    assert times.main(["run", "ok", "--", sys.executable, "-c", "pass"]) == 0
    assert times.main(["run", "broken", "--", sys.executable, "-c", "raise SystemExit(3)"]) == 3
    out = capsys.readouterr().out
    assert "== part ok: " in out and "passed" in out
    assert "== part broken: " in out and "FAILED (exit 3)" in out


def test_the_table_lists_every_part_in_start_order_with_its_result(times):
    times.start("setup")
    times.end("setup")
    times.run("second", [sys.executable, "-c", "raise SystemExit(1)"])
    times.start("unfinished")
    table = times.summary().splitlines()
    rows = [line.split()[0] for line in table[3:]]
    assert rows == ["setup", "second", "unfinished", "whole"]
    assert table[3].endswith("passed") and table[4].endswith("FAILED (1)")
    assert table[5].endswith("did not finish")
    assert table[3].split()[3] == "-" and float(table[4].split()[3]) >= 0  # CPU: `run` only


def test_a_parts_cpu_time_counts_its_commands_children(times, capsys):
    busy = "import time; end = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {busy!r}])"
    times.run("busy", [sys.executable, "-c", child])
    record = times._read("busy")
    assert record["cpu_seconds"] >= 0.3, record


def test_reset_forgets_the_last_runs_parts(times):
    times.run("old", [sys.executable, "-c", "pass"])
    times.reset()
    assert "old" not in times.summary()


@pytest.mark.parametrize("argv", [[], ["nonsense"], ["run", "x"], ["run", "x", "--"], ["start"]])
def test_a_malformed_call_exits_with_its_usage(times, argv):
    with pytest.raises(SystemExit) as raised:
        times.main(argv)
    assert raised.value.code not in (0, None)
