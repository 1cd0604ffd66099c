"""`vllm-npu-ext selfcheck`: verify the package on an Ascend machine, offline, in minutes.

    vllm-npu-ext selfcheck [--model DIR] [--json] [--quick] [--parts ops,model,bench,doctor]

Parts (all by default):
  ops     each fused operator we call against our PyTorch reference on the CPU, at the
          layer shapes of Qwen3-Embedding 0.6B/4B/8B and the unit grid, per dtype;
  model   the whole model's NPU path in a vLLM engine against Hugging Face transformers
          (CPU, float32) on a tiny checkpoint built here and, with --model, a real one;
  bench   fused vs unfused per fusion (median of repeats) at serving sizes: timings only;
  doctor  the `vllm-npu-ext doctor` report (its problems fail the run).

Exit status: 0 every check passed; 1 a check failed; 2 no usable NPU and no emulator
(nothing was checked; one line says so). `--emulate` (or VLLM_NPU_EXT_SELFCHECK_EMULATE=1)
runs every part on the CPU under the torch_npu emulator, to test selfcheck itself: every line
then says "emulated", and timings are not measurements.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from vllm_npu_ext import __version__, envs

PARTS = ("ops", "model", "bench", "doctor")
NO_NPU_MESSAGE = (
    "vllm-npu-ext selfcheck: no usable Ascend NPU here (torch_npu does not import or sees no "
    "device), so nothing was checked; --emulate runs the checks' logic on the CPU under the "
    "torch_npu emulator"
)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="vllm-npu-ext selfcheck",
        description="Verify every fused operator and the whole model on an Ascend NPU.",
    )
    parser.add_argument("--model", type=Path, help="also check this real Qwen3 checkpoint")
    parser.add_argument("--model-dtype", default="auto", help="engine dtype for --model")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--emulate", action="store_true", help="use the torch_npu emulator")
    parser.add_argument("--quick", action="store_true", help="0.6B shapes only, one engine")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset")
    parser.add_argument("--workdir", type=Path, help="tiny checkpoint and engine logs")
    args = parser.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown or not args.parts:
        parser.error(f"--parts must name some of {', '.join(PARTS)}; got {args.parts}")
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there")
    return args


def _run_model_part(target, args, plan, reporter) -> None:
    from vllm_npu_ext.selfcheck.model_check import check_model
    from vllm_npu_ext.selfcheck.plan import TINY_MODELS
    from vllm_npu_ext.tiny_model import make_tiny_model

    names = dict.fromkeys(name for name, _ in plan.tiny_runs)
    dirs = {n: make_tiny_model(args.workdir / f"{n}-qwen3", **TINY_MODELS[n]) for n in names}
    runs = [(name, dirs[name], dtype) for name, dtype in plan.tiny_runs]
    if args.model is not None:
        runs.append((args.model.name, args.model, args.model_dtype))
    for label, model_dir, dtype in runs:
        results = check_model(
            label, model_dir, dtype, target.emulated, args.workdir, plan.compiled_engine
        )
        for result in results:
            reporter.add(result)


def _doctor_result(report: dict):
    from vllm_npu_ext import doctor
    from vllm_npu_ext.selfcheck.report import CheckResult

    problems = report["problems"]
    fields = {"check": "doctor", "problems": len(problems), "npu_usable": report["npu_usable"]}
    details = doctor.format_report(report).splitlines()
    return CheckResult("doctor", "FAIL" if problems else "PASS", fields, details)


def _run_parts(target, args, plan, reporter, doctor_report: dict) -> None:
    from vllm_npu_ext.selfcheck import op_checks
    from vllm_npu_ext.selfcheck.report import CheckResult

    if "ops" in args.parts:
        custom = target.custom_kernel_installed()
        if not custom:
            reporter.add(CheckResult("ops", "INFO", {
                "op": "npu_ext_attention_update", "installed": False,
                "note": "our custom operator is not installed; its cases were not run",
            }))  # fmt: skip
        op_checks.run_op_checks(target, plan.op_cases(custom_kernel=custom), reporter.add)
    if "model" in args.parts:
        _run_model_part(target, args, plan, reporter)
    if "bench" in args.parts:
        op_checks.run_benchmarks(
            target, plan.bench_cases(), plan.bench_warmup, plan.bench_repeats, reporter.add
        )
    if "doctor" in args.parts:
        reporter.add(_doctor_result(doctor_report))
        reporter.extra["doctor"] = doctor_report


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(list(sys.argv[1:] if argv is None else argv))
    emulate = args.emulate or envs.SELFCHECK_EMULATE()
    from vllm_npu_ext import doctor

    # First, like every vLLM process: the bootstrap orders the custom-op search paths before
    # anything imports torch_npu. The report also says whether an NPU is usable.
    doctor_report = doctor.collect()
    if not emulate and not doctor_report["npu_usable"]:
        print(NO_NPU_MESSAGE, file=sys.stderr)
        return 2
    from vllm_npu_ext.selfcheck.plan import FULL, QUICK
    from vllm_npu_ext.selfcheck.report import Reporter
    from vllm_npu_ext.selfcheck.target import open_target

    plan = QUICK if args.quick else FULL
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vllm-npu-ext-selfcheck-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    reporter = Reporter(emulated=emulate, json_mode=args.json)
    with open_target(emulate) as target:
        label = str(args.model) if args.model is not None else None
        reporter.start({
            "version": __version__, **target.describe(), "parts": ",".join(args.parts),
            "workdir": str(args.workdir), "coverage": plan.coverage(args.parts, label),
        })  # fmt: skip
        _run_parts(target, args, plan, reporter, doctor_report)
    return reporter.finish()
