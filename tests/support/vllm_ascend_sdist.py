"""vllm-ascend 0.23.0.post1's sdist for tests that read its sources on the CPU stacks: from
VLLM_ASCEND_SDIST, build/sdist, or downloaded from PyPI by scripts/check_vllm_ascend_patch.py
(sha256-pinned)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from support.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
check_script = load_script("scripts/check_vllm_ascend_patch.py")


def find_or_download_sdist() -> Path:
    configured = os.environ.get("VLLM_ASCEND_SDIST")
    candidates = [Path(configured)] if configured else [
        ROOT / "build" / "sdist" / check_script.SDIST_NAME]  # fmt: skip
    for candidate in candidates:
        if candidate.exists():
            return candidate
    try:
        return check_script.download_sdist(ROOT / "build" / "sdist")
    except OSError as error:
        pytest.fail(f"vllm-ascend sdist unavailable ({error}); set VLLM_ASCEND_SDIST")
