#!/usr/bin/env python3
"""Wall and CPU time of each part of `make test`, recorded as the parts run, printed as one table.

    python scripts/test_times.py reset                 # a new run: forget the last one's parts
    python scripts/test_times.py run NAME -- CMD ...   # run CMD as part NAME, record its time
    python scripts/test_times.py start NAME            # the same in two steps, for recipes of
    python scripts/test_times.py end NAME              # several lines (a set-up)
    python scripts/test_times.py summary               # the table: start, wall time, result

The records live in `.test-times/` at the repository's root (one JSON file per part), so parts
that make runs side by side, each in its own shell, write without sharing a file. A part run
with `run` also records the CPU time (user + system) of its command and every descendant the
command waited for: the run is bound by the machine's cores, so a part's CPU time, not its wall
time beside another part, is what it costs. Standard library only: it runs before any virtual
environment exists.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

RECORDS = Path(__file__).resolve().parents[1] / ".test-times"
RUN_STARTED = "run-started"


def reset() -> None:
    shutil.rmtree(RECORDS, ignore_errors=True)
    RECORDS.mkdir()
    (RECORDS / RUN_STARTED).write_text(str(time.time()), encoding="utf-8")


def start(name: str) -> None:
    RECORDS.mkdir(exist_ok=True)
    _write(name, {"name": name, "started": time.time()})


def end(name: str, returncode: int = 0, cpu_seconds: float | None = None) -> float:
    record = _read(name) or {"name": name, "started": time.time()}
    record.update(ended=time.time(), returncode=returncode, cpu_seconds=cpu_seconds)
    _write(name, record)
    seconds = record["ended"] - record["started"]
    result = "passed" if returncode == 0 else f"FAILED (exit {returncode})"
    cpu = "" if cpu_seconds is None else f", {cpu_seconds / 60:.1f} CPU-min"
    print(f"== part {name}: {seconds:.0f} s wall ({seconds / 60:.1f} min{cpu}), {result}",
          flush=True)  # fmt: skip
    return seconds


def run(name: str, command: list[str]) -> int:
    if not command:
        raise SystemExit("run NAME -- COMMAND: no command given")
    start(name)
    before = _children_cpu_seconds()
    returncode = subprocess.call(command)
    end(name, returncode, _children_cpu_seconds() - before)
    return returncode


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summary() -> str:
    """One line per recorded part, in the order they started, and the run's wall time."""
    if not RECORDS.is_dir():
        return "no part timings recorded (.test-times/ is missing)"
    began_file = RECORDS / RUN_STARTED
    records = sorted((json.loads(p.read_text(encoding="utf-8")) for p in RECORDS.glob("*.json")),
                     key=lambda r: r["started"])  # fmt: skip
    began = float(began_file.read_text()) if began_file.exists() else (
        records[0]["started"] if records else time.time())  # fmt: skip
    lines = ["", "== make test, per part: minutes from the start, wall minutes, CPU minutes",
             f"{'part':<28} {'started':>8} {'took':>8} {'CPU':>8}  result"]  # fmt: skip
    for record in records:
        started = (record["started"] - began) / 60
        cpu_seconds = record.get("cpu_seconds")
        cpu = f"{cpu_seconds / 60:8.1f}" if cpu_seconds is not None else f"{'-':>8}"
        if "ended" in record:
            took = f"{(record['ended'] - record['started']) / 60:8.1f}"
            result = "passed" if record["returncode"] == 0 else f"FAILED ({record['returncode']})"
        else:
            took, result = f"{'-':>8}", "did not finish"
        lines.append(f"{record['name']:<28} {started:8.1f} {took} {cpu}  {result}")
    lines.append(f"{'whole run':<28} {0:8.1f} {(time.time() - began) / 60:8.1f}")
    return "\n".join(lines)


def _path(name: str) -> Path:
    return RECORDS / f"{name}.json"


def _read(name: str) -> dict | None:
    path = _path(name)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _write(name: str, record: dict) -> None:
    _path(name).write_text(json.dumps(record), encoding="utf-8")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("reset", "run", "start", "end", "summary"):
        raise SystemExit(__doc__)
    verb, rest = argv[0], argv[1:]
    if verb == "reset":
        reset()
    elif verb == "summary":
        print(summary(), flush=True)
    elif verb == "run":
        if len(rest) < 2 or rest[1] != "--":
            raise SystemExit("usage: test_times.py run NAME -- COMMAND ...")
        return run(rest[0], rest[2:])
    elif not rest:
        raise SystemExit(f"usage: test_times.py {verb} NAME")
    elif verb == "start":
        start(rest[0])
    else:
        end(rest[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
