"""Put our custom CANN operator package first on the operator search paths, in every process.

CANN takes an operator from the first `ASCEND_CUSTOM_OPP_PATH` entry that provides it, and
vllm-ascend prepends its bundled vendor directory to that variable when its platform loads
(`_prepend_env_path`, which inserts only when the exact string is absent and never moves an
entry). A rebuilt operator of the same name installed anywhere else would silently lose.

So, before torch_npu or vllm-ascend's platform loads, the variable becomes: our package's
entries, then vllm-ascend's vendor directory (already present, so its own prepend changes
nothing), then every other entry in its original order. Duplicates (same resolved path) go;
empty and relative entries go too, since CANN and the dynamic loader resolve them against the
working directory.

LD_LIBRARY_PATH gets the packages' `op_api/lib` directories, but vllm-ascend's first, then
ours, then the rest. Every CANN custom op package ships its op API as `libcust_opapi.so`, and
`vllm_ascend_C` links it by that soname (its RUNPATH is searched after LD_LIBRARY_PATH): with
ours first it would bind to our library and lose its own operators. Nothing of ours is looked
up by soname: CANN loads each vendor directory's `op_api/lib` by full path, and so does our
torch binding. So ours only joins the variable, after vllm-ascend's.

Two hooks run `apply()`: the `vllm.platform_plugins` entry point `platform_plugin()` (vLLM
calls it in every process before it resolves the platform; it returns None, claiming none) and
the general plugin `register()`. Child processes inherit the result. Nothing changes when no
package of ours is installed or when VLLM_NPU_EXT_BOOTSTRAP=0. This module imports neither
torch_npu nor vllm_ascend: importing torch_npu without CANN breaks `import torch`.
(Under VLLM_NPU_EXT_EMULATE=1 the platform plugin installs the torch_npu stand-in instead.)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from collections.abc import Sequence

from vllm_npu_ext import envs
from vllm_npu_ext.cann_ops import default_vendor_dir

OPP_PATH_VARIABLE = "ASCEND_CUSTOM_OPP_PATH"
LIBRARY_PATH_VARIABLE = "LD_LIBRARY_PATH"
# Where vllm-ascend 0.23 keeps its bundled operators, relative to its package directory
# (vllm_ascend/utils.py: _CUSTOM_OP_BASE_DIR/_cann_ops_custom/vendors/_CUSTOM_OP_VENDOR_DIR).
VLLM_ASCEND_VENDOR_SUBDIR = ("_cann_ops_custom", "vendors", "custom_transformer")
OP_API_LIB_SUBDIR = ("op_api", "lib")

LOGGER_NAME = "vllm_npu_ext.bootstrap"
_announced_in_pid: int | None = None
_warned: set[tuple[int, str]] = set()


@dataclasses.dataclass(frozen=True)
class Reordered:
    """A search-path variable's new value and the entries dropped from it."""

    value: str
    dropped: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the bootstrap sets one variable to. `before` is None when the variable is unset."""

    variable: str
    before: str | None
    after: str
    dropped: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return self.after != self.before


@dataclasses.dataclass(frozen=True)
class OurPackage:
    """Where our vendor directory is expected; `usable` only when it exists and is absolute."""

    vendor_dir: str
    source: str  # envs.OPP_PATH's name or "default"
    problem: str | None

    @property
    def usable(self) -> bool:
        return self.problem is None


def reorder_search_path(
    value: str | None, first: Sequence[str], second: Sequence[str] = ()
) -> Reordered:
    """`first`, then `second`, then the other entries of the colon-separated `value`.

    Pure: reads no environment. Entries are compared by resolved path (`os.path.realpath`);
    the first spelling seen is kept, and `first`/`second` keep theirs exactly, since
    vllm-ascend's prepend compares strings. Empty and relative entries of `value` are dropped
    and reported in `dropped`, in their original order.
    """
    for name, entries in (("first", first), ("second", second)):
        relative = [entry for entry in entries if not os.path.isabs(entry)]
        if relative:
            raise ValueError(f"{name} must hold absolute paths, got {relative!r}")
    current = value.split(os.pathsep) if value else []
    dropped = tuple(entry for entry in current if not os.path.isabs(entry))
    kept: list[str] = []
    seen: set[str] = set()
    for entry in [*first, *second, *(entry for entry in current if os.path.isabs(entry))]:
        key = os.path.realpath(entry)
        if key not in seen:
            seen.add(key)
            kept.append(entry)
    return Reordered(os.pathsep.join(kept), dropped)


def vllm_ascend_prepend(value: str | None, path: str) -> str:
    """vllm-ascend 0.23's `_prepend_env_path`: insert `path` first unless the string is present."""
    entries = [entry for entry in (value or "").split(os.pathsep) if entry]
    if path in entries:
        return value or ""
    return os.pathsep.join([path, *entries])


def our_package() -> OurPackage | None:
    """Our vendor directory: VLLM_NPU_EXT_OPP_PATH if set, else the default build's install.

    None when the variable is unset and the default install does not exist: then nothing of
    ours is installed and the bootstrap leaves the environment alone.
    """
    override = envs.OPP_PATH()
    if not override:
        default = str(default_vendor_dir())
        return OurPackage(default, "default", None) if os.path.isdir(default) else None
    if not os.path.isabs(override):
        problem = f"{envs.OPP_PATH}={override!r} is relative; set an absolute path"
    elif not os.path.isdir(override):
        problem = f"{envs.OPP_PATH}={override!r} is not a directory"
    else:
        problem = None
    return OurPackage(override, envs.OPP_PATH.name, problem)


def vllm_ascend_vendor_dir() -> str | None:
    """vllm-ascend's bundled vendor directory, spelled as vllm-ascend spells it, if it exists.

    Found with `importlib.util.find_spec`, which locates the package without importing it.
    """
    try:
        spec = importlib.util.find_spec("vllm_ascend")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.has_location:
        origin = spec.origin
        base = os.path.dirname(origin)
        if not os.path.isabs(base):
            base = os.path.abspath(base)
    elif spec.submodule_search_locations:
        base = next(iter(spec.submodule_search_locations))
    else:
        return None
    vendor_dir = os.path.join(base, *VLLM_ASCEND_VENDOR_SUBDIR)
    return vendor_dir if os.path.exists(vendor_dir) else None


def plan() -> list[Plan]:
    """The variables the bootstrap would set now, from the current environment.

    Empty when nothing of ours is usable. `LD_LIBRARY_PATH` is planned only when our package
    has an `op_api/lib` directory.
    """
    ours = our_package()
    if ours is None or not ours.usable:
        return []
    theirs = vllm_ascend_vendor_dir()
    plans = [_plan_one(OPP_PATH_VARIABLE, [ours.vendor_dir], [theirs] if theirs else [])]
    our_lib = _existing_lib_dir(ours.vendor_dir)
    if our_lib:
        # Library order is the other way round: see "LD_LIBRARY_PATH" in the module docstring.
        their_lib = _existing_lib_dir(theirs) if theirs else None
        plans.append(_plan_one(LIBRARY_PATH_VARIABLE, [their_lib] if their_lib else [], [our_lib]))
    return plans


def _plan_one(variable: str, first: list[str], second: list[str]) -> Plan:
    before = os.environ.get(variable)
    reordered = reorder_search_path(before, first, second)
    return Plan(variable, before, reordered.value, reordered.dropped)


def _existing_lib_dir(vendor_dir: str) -> str | None:
    lib_dir = os.path.join(vendor_dir, *OP_API_LIB_SUBDIR)
    return lib_dir if os.path.isdir(lib_dir) else None


def apply(*, log: bool = True) -> list[str]:
    """Reorder the search paths of this process's environment; say what changed.

    Idempotent: a second call changes nothing unless something changed the variables since.
    With `log`, logs one INFO line per process when it changes something, a warning naming
    any dropped empty or relative entries, and a warning when VLLM_NPU_EXT_OPP_PATH is
    unusable (`vllm-npu-ext doctor` reports these itself and keeps its stdout for the report).
    """
    if not envs.BOOTSTRAP():
        return []
    ours = our_package()
    if ours is not None and not ours.usable:
        if log:
            _warn_once(f"vllm-npu-ext: custom-op paths left as they are: {ours.problem}")
        return []
    changes = []
    for planned in plan():
        if planned.dropped and log:
            entries = ", ".join(repr(entry) for entry in planned.dropped)
            _warn_once(
                f"vllm-npu-ext: dropped {planned.variable} entries that resolve against the "
                f"working directory: {entries}"
            )
        if planned.changed:
            os.environ[planned.variable] = planned.after
            was = planned.before if planned.before is not None else "<unset>"
            changes.append(f"{planned.variable}={planned.after} (was {was})")
    if log:
        _announce(changes)
    return changes


def _announce(changes: list[str]) -> None:
    global _announced_in_pid
    if not changes or _announced_in_pid == os.getpid():
        return
    _announced_in_pid = os.getpid()
    _logger().info(
        "vllm-npu-ext custom-op bootstrap in pid %d: %s", os.getpid(), "; ".join(changes)
    )


def _logger() -> logging.Logger:
    # Through vLLM's logging configuration (every vLLM process has vLLM imported already); a
    # plain logger where vLLM does not import: logging must never stop the bootstrap.
    try:
        from vllm_npu_ext.logger import get_logger

        return get_logger(LOGGER_NAME)
    except (ImportError, OSError, RuntimeError):
        return logging.getLogger(LOGGER_NAME)


def _warn_once(message: str) -> None:
    key = (os.getpid(), message)
    if key not in _warned:
        _warned.add(key)
        _logger().warning(message)


def platform_plugin() -> None:
    """The `vllm.platform_plugins` entry point: runs `apply()` and claims no platform.

    It also applies the patches of that moment (`patches.PLATFORM_PLUGIN`): under
    VLLM_NPU_EXT_EMULATE=1 the torch_npu stand-in (`vllm_npu_ext.emulator.install_stand_in`).
    vLLM calls platform plugins before it imports the platform class, so vllm-ascend's
    `NPUPlatform` (which imports torch_npu) finds it.
    """
    from vllm_npu_ext import patches

    apply()
    patches.apply_patches(patches.PLATFORM_PLUGIN)
    return None
