#!/usr/bin/env python
"""Install vllm-ascend 0.23.0.post1's Python package, without its C++/AscendC extensions.

    python scripts/install_vllm_ascend.py TARGET [--sdist PATH]

The sdist (PyPI publishes no wheel) is downloaded and checked against its pinned sha256
(`check_vllm_ascend_patch.SDIST_SHA256`). pip cannot build it here (its setup.py needs CANN
and torch-npu), so this does what its setup.py does with `COMPILE_CUSTOM_KERNELS=0` for an
Atlas A2 (`SOC_VERSION=ascend910b1`): every package `find_packages()` finds under
`vllm_ascend/` is copied, `vllm_ascend/_build_info.py` is written as its `gen_build_info()`
writes it (`__device_type__ = 'A2'`), and a `vllm_ascend-0.23.0.post1.dist-info` carries the
sdist's metadata and entry points (`vllm.platform_plugins: ascend`, four general plugins),
so `importlib.metadata` sees what it sees in vllm-ascend's image.

TARGET is a directory of its own, not site-packages: with vllm-ascend on the path its
platform plugin activates in every vLLM process (`vllm_ascend.register` returns NPUPlatform
unconditionally), which would take vLLM's CPU platform away from the rest of the suite.
Processes that run vllm-ascend put TARGET on `sys.path` / `PYTHONPATH`. Installing the same
sdist again is a no-op; the last line printed is TARGET.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "check_vllm_ascend_patch", ROOT / "scripts" / "check_vllm_ascend_patch.py"
)
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

DEVICE_TYPE = "A2"  # setup.py's gen_build_info() for SOC_VERSION=ascend910b1
BUILD_INFO = f"# Auto-generated file\n__device_type__ = '{DEVICE_TYPE}'\n"
DIST_INFO = f"vllm_ascend-{check.TESTED_VERSION}.dist-info"
MARKER = "vllm_npu_ext_source"  # inside DIST_INFO: the sha256 it was installed from


def packages(root: Path) -> list[Path]:
    """Directories setuptools' find_packages() would take: vllm_ascend and every
    sub-directory reached through directories that have an `__init__.py`."""
    found = []

    def walk(directory: Path) -> None:
        if not (directory / "__init__.py").is_file():
            return
        found.append(directory)
        for child in sorted(p for p in directory.iterdir() if p.is_dir()):
            walk(child)

    walk(root / "vllm_ascend")
    return found


def install(sdist: Path, target: Path) -> Path:
    sha256 = check.sha256_of(sdist)
    if sha256 != check.SDIST_SHA256:
        raise SystemExit(f"{sdist}: sha256 {sha256}, pinned {check.SDIST_SHA256}")
    marker = target / DIST_INFO / MARKER
    if marker.is_file() and marker.read_text().strip() == sha256:
        return target
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(sdist) as tar:
            # the "data" filter (no links out, no special files) where this Python has it
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(scratch, **safe)
        (source,) = Path(scratch).iterdir()
        staged = target.with_name(target.name + ".partial")
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir(parents=True)
        for package in packages(source):
            destination = staged / package.relative_to(source)
            destination.mkdir(parents=True, exist_ok=True)
            for file in package.iterdir():
                if file.is_file() and file.suffix == ".py":
                    shutil.copy2(file, destination / file.name)
        (staged / "vllm_ascend" / "_build_info.py").write_text(BUILD_INFO)
        write_dist_info(source, staged / DIST_INFO, sha256)
        shutil.rmtree(target, ignore_errors=True)
        staged.rename(target)
    return target


def write_dist_info(source: Path, dist_info: Path, sha256: str) -> None:
    egg_info = source / "vllm_ascend.egg-info"
    dist_info.mkdir()
    shutil.copy2(source / "PKG-INFO", dist_info / "METADATA")
    for name in ("entry_points.txt", "top_level.txt"):
        shutil.copy2(egg_info / name, dist_info / name)
    (dist_info / "INSTALLER").write_text("vllm-npu-ext scripts/install_vllm_ascend.py\n")
    files = sorted(
        p.relative_to(dist_info.parent).as_posix()
        for p in dist_info.parent.rglob("*")
        if p.is_file()
    )
    record = [f"{name},," for name in files] + [f"{DIST_INFO}/RECORD,,", f"{DIST_INFO}/{MARKER},,"]
    (dist_info / "RECORD").write_text("\n".join(record) + "\n")
    (dist_info / MARKER).write_text(sha256 + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path, help="directory to install into")
    parser.add_argument("--sdist", type=Path, help="the sdist (default: download to build/sdist)")
    args = parser.parse_args(argv)
    sdist = args.sdist or check.download_sdist(ROOT / "build" / "sdist")
    print(install(sdist, args.target.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
