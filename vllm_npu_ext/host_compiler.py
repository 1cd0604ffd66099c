"""The host C++ compiler that the package's host builds use (the stand-in's npu device and the
host build of our AscendC kernel): $CXX, or g++ on PATH."""

from __future__ import annotations

import os
import shutil


class CompilerMissing(RuntimeError):
    """No C++ compiler on PATH for a host build."""


def compiler(needed_by: str) -> str:
    """Path of the C++ compiler ($CXX or g++); CompilerMissing names what needs it and what to
    install."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise CompilerMissing(
            f"C++ compiler {name!r} not found on PATH: {needed_by} needs a C++17 compiler "
            "(install g++, or set CXX to one)"
        )
    return path
