"""Build and run the host-side (g++, no CANN) checks of NpuExtAttentionUpdate.

The coverage sweep (tests/host/tiling_sweep.cpp, an executable) is compiled against
op_kernel/attention_update_tiling_math.h; the kernel itself is built for the host by
host_kernel/build.py. Only the standard library is used, so `build.sh --host-tests` can run
this module without torch:

    python3 -m vllm_npu_ext.cann_ops.npu_ext_attention_update.tests.host_build [--build-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path

from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel import build

OP_DIR = Path(__file__).resolve().parent.parent
KERNEL_DIR = OP_DIR / "op_kernel"
HOST_DIR = OP_DIR / "tests" / "host"
SWEEP_SOURCE = HOST_DIR / "tiling_sweep.cpp"
SWEEP_FLAGS = tuple(flag for flag in build.CXX_FLAGS if flag != "-fPIC")


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """The sweep's exit code and its summary counters (configs, tiled, failures, ...)."""

    returncode: int
    counters: dict[str, int]
    output: str


def build_sweep(build_dir: Path, header_dir: Path = KERNEL_DIR) -> Path:
    """Compile the sweep; `header_dir` may hold a modified tiling header (mutation tests)."""
    output = build_dir / "tiling_sweep"
    command = [build.compiler(), *SWEEP_FLAGS, f"-I{header_dir}", f"-I{HOST_DIR}",
               str(SWEEP_SOURCE), "-o", str(output)]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{completed.stderr}")
    return output


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
            kernel = build.build_library(cache_dir=build_dir / "host_kernel")
        except RuntimeError as error:  # CompilerMissing included
            print(error, file=sys.stderr)
            return 1
        print(f"built {sweep} and {kernel}")
        result = run_sweep(sweep)
        print(result.output.strip())
        return result.returncode


if __name__ == "__main__":
    sys.exit(main())
