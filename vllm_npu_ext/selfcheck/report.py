"""Selfcheck results and how they print: one line per check and a summary, or one JSON document.

A line is `STATUS key=value ...`, STATUS one of PASS, FAIL, INFO (a diagnostic without a
verdict) and BENCH (a timing, never a verdict). Under the emulator every line ends with
`[emulated]` (timings with `[emulated: not a measurement]`).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, TextIO

STATUSES = ("PASS", "FAIL", "INFO", "BENCH")
EMULATED_TAG = "[emulated]"
EMULATED_TIMING_TAG = "[emulated: not a measurement]"
# Cosines are printed with enough digits to tell 0.99999 from 0.999991.
_PRECISE_KEYS = ("cos_min", "min_cos")


@dataclasses.dataclass
class CheckResult:
    """One check. part: ops, model, bench or doctor. fields: the line's `key=value` pairs,
    in order (raw values; JSON gets them as they are). details: extra lines printed under it.
    """

    part: str
    status: str
    fields: dict[str, Any]
    details: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"

    def line(self) -> str:
        return f"{self.status:<5} {format_pairs(self.fields)}"

    def as_json(self) -> dict[str, Any]:
        return {"part": self.part, "status": self.status, **self.fields, "details": self.details}


def format_pairs(fields: dict[str, Any]) -> str:
    """`key=value key=value ...`; values with spaces are quoted."""
    return " ".join(f"{key}={_format(key, value)}" for key, value in fields.items())


def _format(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "-"
    if isinstance(value, float):
        return f"{value:.7f}" if key in _PRECISE_KEYS else f"{value:.3g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_format(key, v) for v in value) + ")"
    text = str(value)
    return json.dumps(text) if any(c.isspace() for c in text) or not text else text


class Reporter:
    """Collects results; in text mode prints each line as it arrives (a crash keeps them)."""

    def __init__(self, emulated: bool, json_mode: bool, stream: TextIO | None = None):
        self.emulated = emulated
        self.json_mode = json_mode
        self.stream = stream or sys.stdout
        self.header: dict[str, Any] = {}
        self.results: list[CheckResult] = []
        self.extra: dict[str, Any] = {}

    def start(self, header: dict[str, Any]) -> None:
        self.header = header
        self._print(f"SELFCHECK {format_pairs(header)}")

    def add(self, result: CheckResult) -> None:
        self.results.append(result)
        timing = result.status == "BENCH"
        self._print(result.line(), timing)
        for detail in result.details:
            self._print("      " + detail)

    def finish(self) -> int:
        """Print the failures and the summary (or the JSON document); return the exit status."""
        failed = [r for r in self.results if r.failed]
        code = 1 if failed else 0
        for result in failed:
            self._print("FAILED " + result.line().removeprefix("FAIL").strip())
        self._print(self._summary_line(failed))
        if self.json_mode:
            document = {
                "emulated": self.emulated, "header": self.header,
                "checks": [r.as_json() for r in self.results],
                "summary": {**self.counts(), "exit_code": code}, **self.extra,
            }  # fmt: skip
            print(json.dumps(document, indent=2, default=str), file=self.stream, flush=True)
        return code

    def counts(self) -> dict[str, int]:
        return {
            name.lower(): sum(r.status == name for r in self.results)
            for name in ("PASS", "FAIL", "INFO", "BENCH")
        }

    def _summary_line(self, failed: list[CheckResult]) -> str:
        counts = self.counts()
        verdict = "FAIL" if failed else "PASS"
        return (
            f"SUMMARY {verdict}: {counts['pass']} passed, {counts['fail']} failed, "
            f"{counts['info']} info, {counts['bench']} benchmarks; "
            f"coverage: {self.header.get('coverage', '-')}"
        )

    def _print(self, line: str, timing: bool = False) -> None:
        if self.json_mode:
            return
        if self.emulated:
            line = f"{line} {EMULATED_TIMING_TAG if timing else EMULATED_TAG}"
        print(line, file=self.stream, flush=True)
