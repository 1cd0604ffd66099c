"""Offline installs into scratch environments: our wheel, and stand-in distributions.

A stand-in is a `.dist-info` directory with METADATA only (no code), which is all pip reads
to decide whether an installed distribution satisfies a requirement. pip runs with every
configuration file and PIP_* variable ignored, `--no-index`, and only our wheel on its
find-links, so the result depends on nothing outside the test.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ITEMS = ("setup.py", "pyproject.toml", "README.md", "vllm_npu_ext")
NOT_SOURCES = shutil.ignore_patterns("__pycache__", "*.so", "_opp", "build", "*.egg-info")


def isolated_pip_env() -> dict[str, str]:
    """The environment with pip's configuration files and PIP_* variables switched off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def run(command: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command, capture_output=True, text=True, env=isolated_pip_env(), timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr}")
    return done


def build_wheel(work: Path) -> Path:
    """Our wheel, built from a copy of the sources (the checkout is left untouched)."""
    source = work / "source"
    source.mkdir()
    for item in SOURCE_ITEMS:
        path = ROOT / item
        if path.is_dir():
            shutil.copytree(path, source / item, ignore=NOT_SOURCES)
        else:
            shutil.copy2(path, source / item)
    # Offline when this environment can build it (setuptools); else pip fetches setuptools.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    out = work / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "--wheel-dir", str(out),
         str(source)])  # fmt: skip
    (wheel,) = out.glob("vllm_npu_ext-*.whl")
    return wheel


def wheel_metadata(wheel: Path) -> list[tuple[str, str]]:
    """The (field, value) lines of the wheel's METADATA header."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        header = archive.read(name).decode("utf-8").split("\n\n", 1)[0]
    return [tuple(line.split(": ", 1)) for line in header.splitlines() if ": " in line]


def scratch_env(root: Path, stand_ins: dict[str, str]) -> Path:
    """A venv without pip holding only `stand_ins` (distribution name -> version)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                .stdout.strip())  # fmt: skip
    for name, version in stand_ins.items():
        dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist_info.mkdir(parents=True)
        metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        (dist_info / "METADATA").write_text(metadata, encoding="utf-8")
        (dist_info / "INSTALLER").write_text("stand-in\n", encoding="utf-8")
        (dist_info / "RECORD").write_text("", encoding="utf-8")
    return python


def dry_run_install(python: Path, wheel: Path, requirement: str, report: Path) -> list[str]:
    """`pip install --dry-run` of `requirement` into `python`'s environment, offline, with only
    `wheel` available: the `name==version` of everything pip would install or replace."""
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run",
         "--no-index", "--find-links", str(wheel.parent), "--report", str(report), "--quiet",
         requirement])  # fmt: skip
    planned = json.loads(report.read_text(encoding="utf-8"))["install"]
    return [f"{item['metadata']['name']}=={item['metadata']['version']}" for item in planned]
