"""The build of `vllm_npu_ext._cann_C` (the PrivateUse1 kernel of the binding).

Two callers:
- setup.py loads this file by path (it must not import the vllm_npu_ext package, which needs
  torch) and builds the extension only when torch_npu is installed and ASCEND_HOME_PATH or
  ASCEND_TOOLKIT_HOME points at a CANN toolkit with the aclnn headers; otherwise one line
  says why it was skipped and the install goes on. Under pip's default build isolation
  torch_npu is not visible, so `pip install .` always skips it;
- `vllm-npu-ext build-ops` runs this file as a script in the environment itself (no
  isolation), from the directory that holds the installed `vllm_npu_ext` package:

      python extension_build.py build_ext --inplace

  which writes `vllm_npu_ext/_cann_C.*.so` there, or exits 1 naming what is missing.

torch_npu is looked up with find_spec and only imported once everything is known to be there
(importing it without CANN raises).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

EXTENSION_NAME = "vllm_npu_ext._cann_C"
_BINDING_DIR = Path("vllm_npu_ext/cann_ops/npu_ext_attention_update/torch_binding")
_OP_API_DIR = Path("vllm_npu_ext/cann_ops/npu_ext_attention_update/op_api")
SOURCES = (
    _BINDING_DIR / "npu_ext_attention_update_binding.cpp",
    _BINDING_DIR / "aclnn_library.cpp",
)
CANN_HEADERS = ("aclnn/acl_meta.h", "aclnn/aclnn_base.h", "acl/acl_base.h")


def cann_home(env: Mapping[str, str] = os.environ) -> Path | None:
    """The CANN toolkit named by ASCEND_HOME_PATH (or ASCEND_TOOLKIT_HOME), if any."""
    value = env.get("ASCEND_HOME_PATH") or env.get("ASCEND_TOOLKIT_HOME")
    return Path(value) if value else None


def skip_reason(env: Mapping[str, str] = os.environ) -> str | None:
    """Why the extension cannot be built here, or None when it can."""
    if importlib.util.find_spec("torch_npu") is None:
        return "torch_npu is not installed"
    home = cann_home(env)
    if home is None:
        return "neither ASCEND_HOME_PATH nor ASCEND_TOOLKIT_HOME is set (source CANN's set_env.sh)"
    missing = [header for header in CANN_HEADERS if not (home / "include" / header).is_file()]
    if missing:
        return f"CANN at {home} lacks {', '.join(missing)}"
    return None


def extension_modules(env: Mapping[str, str] = os.environ) -> tuple[list, dict]:
    """(ext_modules, cmdclass) for setup(): the extension, or nothing with one printed line."""
    reason = skip_reason(env)
    if reason is not None:
        print(f"vllm-npu-ext: skipping {EXTENSION_NAME} (CANN torch binding): {reason}")
        return [], {}
    from torch.utils.cpp_extension import BuildExtension
    from torch_npu.utils.cpp_extension import NpuExtension

    home = cann_home(env)
    extension = NpuExtension(
        EXTENSION_NAME,
        sources=[str(source) for source in SOURCES],
        include_dirs=[str(_BINDING_DIR), str(_OP_API_DIR), str(home / "include")],
        library_dirs=[str(home / "lib64")],
        libraries=["nnopbase", "ascendcl"],
    )
    return [extension], {"build_ext": BuildExtension}


def main(argv: Sequence[str]) -> int:
    """setuptools on the extension alone (e.g. `build_ext --inplace`); 1 when it cannot build."""
    reason = skip_reason()
    if reason is not None:
        print(f"cannot build {EXTENSION_NAME} (CANN torch binding): {reason}", file=sys.stderr)
        return 1
    from setuptools import setup

    modules, cmdclass = extension_modules()
    setup(
        name="vllm-npu-ext-cann-binding", py_modules=[], ext_modules=modules, cmdclass=cmdclass,
        script_args=list(argv),
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
