"""Build the NpuExtAttentionUpdate kernel source for the host: g++, no CANN.

Three translation units are compiled, the first two unchanged from the operator package,
against the AscendC/CANN stand-ins in `host_kernel/shim/`, and linked into one shared library:

- op_kernel/npu_ext_attention_update.cpp (the kernel entry and, through it,
  npu_ext_attention_update_kernel.h and attention_update_tiling_math.h), with
  `__CCE_KT_TEST__` defined as in CANN's own CPU build of a kernel, and the tiling data
  class of op_host/npu_ext_attention_update_tiling.h included first (what the op build
  generates for GET_TILING_DATA);
- op_host/npu_ext_attention_update_tiling.cpp (the tiling function);
- host_kernel/launch.cpp (the launcher: tiling, then the kernel on every vector core).

Objects and libraries land in a cache directory, `$VLLM_NPU_EXT_HOST_KERNEL_CACHE`, else
`$XDG_CACHE_HOME/vllm_npu_ext/host-kernel` (`~/.cache/...`), named by a hash of the compiler
(path and version), the flags and the bytes of every file the unit may read: the shim, the
launcher, op_host/ and op_kernel/. The host units (tiling, launcher) cannot include the
AscendC kernel class or entry, so those two files are left out of their hash: a modified
kernel recompiles the kernel unit only. Each file is written under a temporary name and
renamed, so concurrent builders never see half a file. Standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from vllm_npu_ext import envs, host_compiler
from vllm_npu_ext.host_compiler import CompilerMissing  # noqa: F401 (re-exported)

OP_DIR = Path(__file__).resolve().parent.parent
KERNEL_DIR = OP_DIR / "op_kernel"
OP_HOST_DIR = OP_DIR / "op_host"
HOST_KERNEL_DIR = Path(__file__).resolve().parent
SHIM_DIR = HOST_KERNEL_DIR / "shim"
KERNEL_ENTRY = "npu_ext_attention_update.cpp"
KERNEL_CLASS = "npu_ext_attention_update_kernel.h"
TILING_SOURCE = OP_HOST_DIR / "npu_ext_attention_update_tiling.cpp"
TILING_HEADER = OP_HOST_DIR / "npu_ext_attention_update_tiling.h"
LAUNCH_SOURCE = HOST_KERNEL_DIR / "launch.cpp"
LIBRARY_NAME = "libnpu_ext_attention_update_host.so"
# No FMA contraction: each vector instruction rounds once, as its documented formula reads.
CXX_FLAGS = (
    "-std=c++17",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
    "-fPIC",
)
# Kernel entries take every argument the launch passes, used or not (the workspace here).
KERNEL_FLAGS = ("-Wno-unused-parameter", "-D__CCE_KT_TEST__", "-include", TILING_HEADER.name)


@dataclasses.dataclass(frozen=True)
class Unit:
    """One translation unit: its source, the flags beyond CXX_FLAGS, and whether it compiles
    the AscendC kernel (the only unit that may read the kernel entry and class)."""

    source: Path
    flags: tuple[str, ...] = ()
    kernel: bool = False


def compiler() -> str:
    """Path of the C++ compiler ($CXX or g++); CompilerMissing names what to install."""
    return host_compiler.compiler("the host build of the NpuExtAttentionUpdate AscendC kernel")


@functools.cache
def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def default_cache_dir() -> Path:
    """Where builds are kept unless VLLM_NPU_EXT_HOST_KERNEL_CACHE says otherwise."""
    chosen = envs.HOST_KERNEL_CACHE()
    if chosen:
        return Path(chosen)
    return envs.cache_dir() / "host-kernel"


def units(kernel_dir: Path = KERNEL_DIR) -> list[Unit]:
    return [
        Unit(kernel_dir / KERNEL_ENTRY, KERNEL_FLAGS, kernel=True),
        Unit(TILING_SOURCE),
        Unit(LAUNCH_SOURCE),
    ]


def unit_inputs(unit: Unit, kernel_dir: Path = KERNEL_DIR) -> list[Path]:
    """Every file `unit` may read: the shim, the launcher, op_host/ and op_kernel/ sources,
    in an order that does not depend on where `kernel_dir` is."""
    kernel_only = () if unit.kernel else (KERNEL_ENTRY, KERNEL_CLASS)
    return [
        *sorted(SHIM_DIR.rglob("*.h")),
        LAUNCH_SOURCE,
        *sorted(p for p in OP_HOST_DIR.iterdir() if p.suffix in (".h", ".cpp")),
        *sorted(
            p for p in kernel_dir.iterdir()
            if p.suffix in (".h", ".cpp") and p.name not in kernel_only
        ),
    ]


def _hash(parts: list[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part + b"\0")
    return digest.hexdigest()[:24]


def object_key(cxx: str, unit: Unit, kernel_dir: Path = KERNEL_DIR) -> str:
    parts = [cxx.encode(), _compiler_version(cxx).encode(), unit.source.name.encode()]
    parts += [flag.encode() for flag in (*CXX_FLAGS, *unit.flags)]
    for path in unit_inputs(unit, kernel_dir):
        parts += [path.name.encode(), path.read_bytes()]  # names and bytes, never locations
    return _hash(parts)


def _scratch_file(directory: Path, suffix: str) -> Path:
    """A new empty file in `directory`, renamed into place once complete."""
    handle, name = tempfile.mkstemp(dir=directory, suffix=suffix)
    os.close(handle)
    return Path(name)


def _compile(cxx: str, pending: list[tuple[Unit, Path]], kernel_dir: Path, cache: Path) -> None:
    """Compile `pending` (unit, object path) in parallel; RuntimeError with the errors."""
    includes = [f"-I{SHIM_DIR}", f"-I{kernel_dir}", f"-I{OP_HOST_DIR}"]
    jobs = []
    for unit, obj in pending:
        scratch = _scratch_file(cache, ".o.tmp")
        command = [cxx, *CXX_FLAGS, *unit.flags, *includes, "-c", str(unit.source),
                   "-o", str(scratch)]  # fmt: skip
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)  # fmt: skip
        jobs.append((command, process, scratch, obj))
    errors = []
    for command, process, scratch, obj in jobs:
        _, stderr = process.communicate()
        if process.returncode == 0:
            os.replace(scratch, obj)
        else:
            scratch.unlink(missing_ok=True)
            errors.append(f"{' '.join(command)}\n{stderr[-6000:]}")
    if errors:
        raise RuntimeError("host build of the NpuExtAttentionUpdate kernel failed:\n" +
                           "\n".join(errors))  # fmt: skip


def build_library(kernel_dir: Path = KERNEL_DIR, cache_dir: Path | None = None) -> Path:
    """The shared library for `kernel_dir` (op_kernel/ or a modified copy of it), built from
    what the cache lacks. Raises CompilerMissing, or RuntimeError with the compiler's errors."""
    cxx = compiler()
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    objects = [(u, cache / f"{object_key(cxx, u, kernel_dir)}.o") for u in units(kernel_dir)]
    library = cache / f"{_hash([obj.name.encode() for _, obj in objects])}-{LIBRARY_NAME}"
    if library.exists():
        return library
    _compile(cxx, [(unit, obj) for unit, obj in objects if not obj.exists()], kernel_dir, cache)
    linked = _scratch_file(cache, ".so.tmp")
    command = [cxx, "-shared", "-o", str(linked), *(str(obj) for _, obj in objects)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        linked.unlink(missing_ok=True)
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr[-6000:]}")
    os.replace(linked, library)
    return library
