"""Custom CANN operator packages shipped with vllm-npu-ext and where they install.

Building needs CANN (see each operator's README); importing this module does not.
"""

from __future__ import annotations

from pathlib import Path

# Our operator is renamed so that nothing in CANN, torch_npu or vllm-ascend can shadow it.
OP_TYPE = "NpuExtAttentionUpdate"
VENDOR_NAME = "vllm_npu_ext"
PACKAGE_DIR = Path(__file__).resolve().parent
# `build.sh` installs with --install-path=DEFAULT_INSTALL_PATH unless told otherwise; the
# package then lives in DEFAULT_INSTALL_PATH/vendors/VENDOR_NAME.
DEFAULT_INSTALL_PATH = PACKAGE_DIR / "_opp"


def default_vendor_dir() -> Path:
    """Where the default build installs our vendor package (it may not exist)."""
    return DEFAULT_INSTALL_PATH / "vendors" / VENDOR_NAME
