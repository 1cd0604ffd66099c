"""Build and run the host-side (g++, no CANN) tests of NpuExtAttentionUpdate.

Two programs are compiled from tests/host/ against op_kernel/attention_update_tiling_math.h:
the coverage sweep (an executable) and the CPU twin of the kernel (a shared library loaded
by tests/twin.py). Only the standard library is used, so `build.sh --host-tests` can run
this file as a script.

    python3 host_build.py [--build-dir DIR]      # build both, run the sweep, print its summary
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

OP_DIR = Path(__file__).resolve().parent.parent
KERNEL_DIR = OP_DIR / "op_kernel"
HOST_DIR = OP_DIR / "tests" / "host"
SWEEP_SOURCE = HOST_DIR / "tiling_sweep.cpp"
TWIN_SOURCE = HOST_DIR / "attention_update_twin.cpp"
# No FMA contraction: the twin does a multiply then an add, as the kernel's Axpy is assumed to.
CXX_FLAGS = (
    "-std=c++17",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-ffp-contract=off",
    "-fno-strict-aliasing",
)


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """The sweep's exit code and its summary counters (configs, tiled, failures, ...)."""

    returncode: int
    counters: dict[str, int]
    output: str


def compiler() -> str:
    """The C++ compiler: $CXX or g++; RuntimeError when neither is on PATH."""
    name = os.environ.get("CXX", "g++")
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"C++ compiler {name!r} not found (set CXX or install g++)")
    return path


def _compile(source: Path, output: Path, extra: tuple[str, ...], header_dir: Path) -> Path:
    command = [compiler(), *CXX_FLAGS, *extra, f"-I{header_dir}", f"-I{HOST_DIR}", str(source)]
    command += ["-o", str(output)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr}")
    return output


def build_sweep(build_dir: Path, header_dir: Path = KERNEL_DIR) -> Path:
    """Compile the sweep; `header_dir` may hold a modified tiling header (mutation tests)."""
    return _compile(SWEEP_SOURCE, build_dir / "tiling_sweep", (), header_dir)


def build_twin(build_dir: Path) -> Path:
    """Compile the CPU twin as a shared library."""
    return _compile(TWIN_SOURCE, build_dir / "libattention_update_twin.so", ("-fPIC", "-shared"),
                    KERNEL_DIR)


def run_sweep(binary: Path) -> SweepResult:
    """Run the sweep and parse its last line, `key=value ...`."""
    completed = subprocess.run([str(binary)], capture_output=True, text=True, check=False)
    lines = completed.stdout.strip().splitlines()
    counters = {}
    if lines:
        for field in lines[-1].split():
            key, _, value = field.partition("=")
            if value.isdigit():
                counters[key] = int(value)
    return SweepResult(completed.returncode, counters, completed.stdout + completed.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, help="keep the binaries here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        build_dir = args.build_dir or Path(scratch)
        build_dir.mkdir(parents=True, exist_ok=True)
        try:
            sweep = build_sweep(build_dir)
            twin = build_twin(build_dir)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        print(f"built {sweep} and {twin}")
        result = run_sweep(sweep)
        print(result.output.strip())
        return result.returncode


if __name__ == "__main__":
    sys.exit(main())
