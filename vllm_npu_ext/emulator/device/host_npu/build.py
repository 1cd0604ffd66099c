"""Build `host_npu.cpp` against the running torch: g++, torch's headers and libraries.

The library lands in `$XDG_CACHE_HOME/vllm_npu_ext/host-npu` (`~/.cache/...`), named by a hash
of the compiler (path and version), the flags, the source's bytes, torch's version and the
directory of the torch libraries it links (two environments with the same torch version get
two builds). A file lock makes concurrent processes (spawned ranks) build once; the library is
written under a temporary name and renamed. `make setup`/`setup-ascend` build it ahead
(`python -m vllm_npu_ext.emulator.device.host_npu`); otherwise the first process that installs
the stand-in does (about 25 s on 2 cores).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from vllm_npu_ext import envs, host_compiler
from vllm_npu_ext.host_compiler import CompilerMissing  # noqa: F401 (re-exported)

SOURCE = Path(__file__).resolve().parent / "host_npu.cpp"
LIBRARY_NAME = "libvllm_npu_ext_host_npu.so"
CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror")


def compiler() -> str:
    return host_compiler.compiler(
        "the torch_npu stand-in's host-backed npu device "
        "(vllm_npu_ext/emulator/device/host_npu/host_npu.cpp)"
    )


def _torch_flags() -> tuple[list[str], list[str]]:
    import torch

    root = Path(torch.__file__).resolve().parent
    libraries = str(root / "lib")
    compile_flags = [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    # torch.utils.cpp_extension.include_paths() for a CPU extension (without importing it:
    # it probes for CUDA and warns)
    for include in (root / "include", root / "include" / "torch" / "csrc" / "api" / "include"):
        compile_flags += ["-isystem", str(include)]
    link_flags = [f"-L{libraries}", f"-Wl,-rpath,{libraries}", "-lc10", "-ltorch_cpu", "-ltorch"]
    return compile_flags, link_flags


@functools.cache
def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def cache_dir() -> Path:
    return envs.cache_dir() / "host-npu"


def library_path(cxx: str) -> Path:
    import torch

    compile_flags, link_flags = _torch_flags()
    digest = hashlib.sha256()
    for part in (cxx, _compiler_version(cxx), torch.__version__, *CXX_FLAGS, *compile_flags,
                 *link_flags):  # fmt: skip
        digest.update(part.encode() + b"\0")
    digest.update(SOURCE.read_bytes())
    return cache_dir() / f"{digest.hexdigest()[:24]}-{LIBRARY_NAME}"


def build() -> Path:
    """The library for this torch, built unless the cache has it. Raises CompilerMissing, or
    RuntimeError with the compiler's errors."""
    cxx = compiler()
    library = library_path(cxx)
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    with open(library.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if library.exists():  # another process built it while this one waited
            return library
        compile_flags, link_flags = _torch_flags()
        handle, scratch = tempfile.mkstemp(dir=library.parent, suffix=".so.tmp")
        os.close(handle)
        command = [cxx, *CXX_FLAGS, *compile_flags, str(SOURCE), "-o", scratch, *link_flags]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            os.unlink(scratch)
            raise RuntimeError(
                f"building the stand-in's npu device failed:\n{' '.join(command)}\n"
                f"{completed.stderr[-6000:]}"
            )
        os.replace(scratch, library)
    return library
