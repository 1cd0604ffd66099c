"""`vllm-npu-ext build-ops`: build and install our CANN operator package and its torch binding.

Run on the Ascend machine after `pip install` of this package, in the environment that has
torch_npu, with CANN's `set_env.sh` sourced:

1. the operator package: `npu_ext_attention_update/build.sh` (cmake with CANN's ASC modules),
   installed to `vllm_npu_ext/cann_ops/_opp` (where the bootstrap and the doctor look) or to
   `--install-path`;
2. the torch binding `vllm_npu_ext._cann_C`, built in this environment (no build isolation,
   so torch_npu is visible: `pip install .` builds in isolation and skips it) and written
   next to the installed package (`build_ext --inplace` from the directory holding it).

Every step is checked first (CANN, cmake, torch_npu, write access); what is missing is
named, with nothing built. Exit status 0 when everything built, 1 otherwise. `pip uninstall`
does not remove what this command writes (`_opp/`, `_cann_C.*.so`); delete them by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from vllm_npu_ext.cann_ops import DEFAULT_INSTALL_PATH, PACKAGE_DIR
from vllm_npu_ext.cann_ops.npu_ext_attention_update import OP_DIR
from vllm_npu_ext.cann_ops.npu_ext_attention_update.torch_binding import extension_build

BUILD_SCRIPT = OP_DIR / "build.sh"
EXTENSION_SCRIPT = Path(extension_build.__file__).resolve()
# The directory that holds the `vllm_npu_ext` package: `build_ext --inplace` runs there.
PACKAGE_PARENT = PACKAGE_DIR.parent.parent
SOCS = ("all", "ascend910b", "ascend910_93")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="vllm-npu-ext build-ops",
        description="Build and install the NpuExtAttentionUpdate operator package and its "
        "torch binding (needs CANN and torch_npu).",
    )
    parser.add_argument("--install-path", type=Path, default=DEFAULT_INSTALL_PATH,
                        help="where the operator package goes: PATH/vendors/vllm_npu_ext")
    parser.add_argument("--soc", choices=SOCS, default="all")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--binding-only", action="store_true", help="skip the operator package")
    only.add_argument("--package-only", action="store_true", help="skip the torch binding")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    return parser.parse_args(list(argv))  # fmt: skip


def steps(args: argparse.Namespace, build_temp: Path) -> list[tuple[list[str], Path]]:
    """The commands to run, each with its working directory."""
    commands = []
    if not args.binding_only:
        build_dir = build_temp / "cann_ops"
        commands.append((
            ["bash", str(BUILD_SCRIPT), f"--install-path={args.install_path}",
             f"--soc={args.soc}", f"--build-dir={build_dir}"],
            OP_DIR,
        ))  # fmt: skip
    if not args.package_only:
        commands.append((
            [sys.executable, str(EXTENSION_SCRIPT), "build_ext", "--inplace",
             "--build-temp", str(build_temp / "binding")],
            PACKAGE_PARENT,
        ))  # fmt: skip
    return commands


def missing(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> list[str]:
    """What the chosen steps need and this machine lacks (empty: ready to build)."""
    problems = []
    if not args.binding_only:
        cann = extension_build.cann_home(env)
        if cann is None or not cann.is_dir():
            problems.append(
                "CANN: neither ASCEND_HOME_PATH nor ASCEND_TOOLKIT_HOME names a directory "
                "(source <CANN>/set_env.sh, e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh)"
            )
        if shutil.which("cmake", path=env.get("PATH")) is None:
            problems.append("cmake (>= 3.16) is not on PATH")
        if not _writable(args.install_path):
            problems.append(f"--install-path {args.install_path} is not writable")
    if not args.package_only:
        reason = extension_build.skip_reason(env)
        if reason is not None:
            problems.append(f"torch binding: {reason}")
        if not os.access(PACKAGE_DIR.parent, os.W_OK):
            problems.append(f"{PACKAGE_DIR.parent} (the installed package) is not writable")
    return problems


def _writable(path: Path) -> bool:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    return existing is not None and os.access(existing, os.W_OK)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    problems = missing(args)
    if problems:
        print("vllm-npu-ext build-ops: cannot build here:", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        if not args.dry_run:
            return 1
    with tempfile.TemporaryDirectory(prefix="vllm-npu-ext-build-") as tmp:
        for command, cwd in steps(args, Path(tmp)):
            print(f"vllm-npu-ext build-ops: (cd {cwd} && {' '.join(command)})", flush=True)
            if not args.dry_run and subprocess.run(command, cwd=cwd, check=False).returncode:
                print(f"vllm-npu-ext build-ops: failed: {' '.join(command)}", file=sys.stderr)
                return 1
    if not args.dry_run:
        print("vllm-npu-ext build-ops: done; check with `vllm-npu-ext doctor`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
