"""vLLM's own pooling-API tests (`tests/entrypoints/pooling` of the installed vLLM release)
against `vllm-npu-ext serve`.

    python tests/vllm_pooling/run.py [--workdir DIR] [pytest arguments, test paths...]

1. Fetches the release's source distribution from PyPI (the URL and sha256 pinned below;
   a file whose hash differs is refused) and unpacks its `tests/` (vLLM's test helpers and
   the pooling tests, unchanged).
2. Installs the packages vLLM's test helpers import and this stack lacks
   (requirements/vllm-pooling-tests.txt, pinned) into a directory of their own on PYTHONPATH,
   so neither development environment changes.
3. Builds the tiny stand-ins of the models the tests name in an offline Hugging Face cache
   (models.py).
4. Runs pytest on `tests/entrypoints/pooling` with `launcher.py` as a plugin: the server
   launcher is `vllm-npu-ext serve` and the stated skips (skips.py) apply. Servers are the
   tests' own module fixtures, as vLLM shares them. Every process gets the test suite's
   `CHILD_ENV` unless set (Inductor's vector-ISA probes skipped, OpenMP threads waiting
   passively: tests/support/child_env.py says why).

The exit status is pytest's.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIREMENTS = ROOT / "requirements" / "vllm-pooling-tests.txt"
DEFAULT_WORKDIR = ROOT / ".cache" / "vllm-pooling-tests"
# PyPI's source distributions of the vLLM releases the two stacks run (pypi.org/simple/vllm).
SDISTS = {
    "0.23.0": ("https://files.pythonhosted.org/packages/68/c6/"
               "c4dc766b09e93de278693502612de0beba822983d4f609830406ead65cc9/vllm-0.23.0.tar.gz",
               "760269db3d9611e12e524681df1bca0977d5d2f5fcb4481cc34d33efc4ae7ff5"),
    "0.32.0": ("https://files.pythonhosted.org/packages/d5/df/"
               "5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz",
               "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"),
}  # fmt: skip
POOLING_TESTS = "tests/entrypoints/pooling"
PYTEST_INI = """[pytest]
markers =
    slow_test
    skip_global_cleanup
    core_model
    hybrid_model
    cpu_model
    cpu_test
    split
    distributed
    optional
asyncio_default_fixture_loop_scope = function
"""


def vllm_release() -> str:
    import vllm

    release = vllm.__version__.split("+", 1)[0]
    if release not in SDISTS:
        raise SystemExit(f"no pinned source distribution for vLLM {release}: {sorted(SDISTS)}")
    return release


def fetch_tests(release: str, workdir: Path) -> Path:
    """vLLM's `tests/` of `release`, unpacked from its hash-checked source distribution."""
    source = workdir / f"vllm-{release}"
    if (source / POOLING_TESTS).is_dir():
        return source
    url, sha256 = SDISTS[release]
    archive = workdir / Path(url).name
    if not archive.exists() or _sha256(archive) != sha256:
        workdir.mkdir(parents=True, exist_ok=True)
        partial = archive.with_suffix(".partial")
        with urllib.request.urlopen(url, timeout=300) as response, open(partial, "wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
        if _sha256(partial) != sha256:
            partial.unlink()
            raise SystemExit(f"{url}: sha256 differs from the pinned {sha256}; refused")
        partial.replace(archive)
    prefix = f"vllm-{release}/tests/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(workdir, members=members, filter="data")
    (source / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    return source


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def install_test_packages(workdir: Path, release: str) -> Path:
    """The pinned packages vLLM's test helpers need, in a directory of their own."""
    site = workdir / f"site-{release}"
    stamp = site / f".installed-{_sha256(REQUIREMENTS)[:16]}"
    if stamp.exists():
        return site
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(site), "-r", str(REQUIREMENTS)], check=True)  # fmt: skip
    stamp.touch()
    return site


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    args, pytest_args = parser.parse_known_args(argv)
    release = vllm_release()
    source = fetch_tests(release, args.workdir)
    site = install_test_packages(args.workdir, release)
    sys.path.insert(0, str(HERE))
    from models import build_hub_cache

    hub = args.workdir / "hf" / "hub"
    build_hub_cache(hub)
    sys.path.insert(0, str(ROOT / "tests"))
    from support.child_env import CHILD_ENV  # what it changes and why: there

    env = {**CHILD_ENV, **os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(site), str(source),
                                          os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    paths = [a for a in pytest_args if a.startswith(POOLING_TESTS)] or [POOLING_TESTS]
    options = [a for a in pytest_args if not a.startswith(POOLING_TESTS)]
    command = [sys.executable, "-m", "pytest", "-p", "launcher", "-p", "no:cacheprovider",
               "-ra", *options, *paths]  # fmt: skip
    print(f"vLLM {release}'s {POOLING_TESTS} against vllm-npu-ext serve: {' '.join(command)}",
          flush=True)  # fmt: skip
    return subprocess.run(command, cwd=source, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
