"""Selfcheck parts 1 and 3: each fused operator against the CPU reference, and its timing.

Every case is reported, including those after a failure: an operator that raises on the
device (an unsupported dtype, a layout the kernel rejects) becomes one FAIL line naming the
exception, and the run goes on.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

from vllm_npu_ext.selfcheck.parity import Parity, dtype_name
from vllm_npu_ext.selfcheck.parity_cases import OpCase
from vllm_npu_ext.selfcheck.report import CheckResult
from vllm_npu_ext.selfcheck.target import Target

Report = Callable[[CheckResult], None]


def _case_fields(case: OpCase) -> dict[str, Any]:
    return {
        "op": case.operator,
        "dtype": dtype_name(case.dtype),
        "shape": f"[{case.describe()}]",
        "models": ",".join(case.models) or "unit",
    }


def _error_text(error: BaseException) -> str:
    first_line = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first_line[:300]}"


def _parity_result(case: OpCase, parity: Parity, several_outputs: bool) -> CheckResult:
    stats = parity.stats()
    tol = parity.tolerance
    fields = _case_fields(case)
    if several_outputs:
        fields["output"] = parity.output
    fields.update(
        max_abs=stats.max_abs, max_rel=stats.max_rel, err_over_tol=stats.worst,
        tol=(tol.atol, tol.rtol),
    )  # fmt: skip
    if not stats.passed:
        fields["reason"] = stats.problem or (
            f"an element's error is {stats.worst:.3g}x what atol + rtol*|reference| allows"
        )
    return CheckResult("ops", "PASS" if stats.passed else "FAIL", fields)


def check_case(case: OpCase, target: Target) -> list[CheckResult]:
    """One result per output of the case's fused operator (one FAIL if it raised)."""
    try:
        parities = case.run(target.npu, target.device)
        return [_parity_result(case, p, len(parities) > 1) for p in parities]
    except Exception as error:  # one broken operator must not hide the others
        return [CheckResult("ops", "FAIL", {**_case_fields(case), "error": _error_text(error)})]


def run_op_checks(target: Target, cases: Iterable[OpCase], report: Report) -> None:
    for case in cases:
        for result in check_case(case, target):
            report(result)


def median_seconds(fn: Callable[[], Any], target: Target, warmup: int, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` calls, each bracketed by device syncs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        target.synchronize()
        start = time.perf_counter()
        fn()
        target.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_case(case: OpCase, target: Target, warmup: int, repeats: int) -> CheckResult:
    """Fused vs unfused (the reference ops on the same device), median microseconds."""
    fields = {"fusion": case.fusion, **_case_fields(case)}
    try:
        fused, unfused = case.bench_pair(target.npu, target.device)
        fused_s = median_seconds(fused, target, warmup, repeats)
        unfused_s = median_seconds(unfused, target, warmup, repeats)
    except Exception as error:  # a fused operator that fails at serving sizes is an error
        return CheckResult("bench", "FAIL", {**fields, "error": _error_text(error)})
    fields.update(
        fused_us=fused_s * 1e6, unfused_us=unfused_s * 1e6,
        speedup=unfused_s / fused_s if fused_s > 0 else float("inf"), repeats=repeats,
        measurement=not target.emulated,
    )  # fmt: skip
    return CheckResult("bench", "BENCH", fields)


def run_benchmarks(
    target: Target, cases: Iterable[OpCase], warmup: int, repeats: int, report: Report
) -> None:
    if target.emulated:  # emulator timings measure nothing: run each path once
        warmup, repeats = 0, 1
    for case in cases:
        report(bench_case(case, target, warmup, repeats))
