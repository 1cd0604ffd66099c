"""A machine without a C++ compiler, for the host build of our AscendC kernel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from vllm_npu_ext.cann_ops.npu_ext_attention_update.host_kernel import library

MISSING_COMPILER = "no-such-cxx-compiler"


@contextlib.contextmanager
def without_compiler(monkeypatch) -> Iterator[str]:
    """CXX names no compiler and the kernel library is looked up afresh (and again after)."""
    monkeypatch.setenv("CXX", MISSING_COMPILER)
    library.default_kernel.cache_clear()
    try:
        yield MISSING_COMPILER
    finally:
        library.default_kernel.cache_clear()
